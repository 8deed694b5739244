/* planner/cost.c — the cost model: compute time of an op from its device's measured curves,
 * communication time from the topology and the algorithm, and a per-rank timeline simulation of one
 * step (compute and communication streams, collectives meeting across ranks, send/recv pairs, ranks
 * sharing a machine's cores, memory liveness). Included by pdde.c after cluster.c. */
#include "planner_impl.h"

#include <errno.h>

struct cost_rank {
    int device;
    double persistent;
    int n, cap;
    pdde_cost_op *ops;
};

struct pdde_cost_program {
    int n_ranks;
    struct cost_rank *ranks;
    int n_groups;
    int *group_off;          /* n_groups + 1 offsets into group_ranks */
    int *group_ranks;
};

pdde_status pdde_cost_program_init(int n_ranks, pdde_cost_program **out) {
    if (!out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    if (n_ranks < 1) return PDDE_ERR_INVALID_ARG;
    pdde_cost_program *p = calloc(1, sizeof *p);
    if (p) p->ranks = calloc((size_t)n_ranks, sizeof *p->ranks);
    if (p) p->group_off = calloc(1, sizeof *p->group_off);
    if (!p || !p->ranks || !p->group_off) {
        pdde_cost_program_free(p);
        return PDDE_ERR_OOM;
    }
    p->n_ranks = n_ranks;
    for (int r = 0; r < n_ranks; r++) p->ranks[r].device = r;
    *out = p;
    return PDDE_OK;
}

void pdde_cost_program_free(pdde_cost_program *p) {
    if (!p) return;
    for (int r = 0; p->ranks && r < p->n_ranks; r++) free(p->ranks[r].ops);
    free(p->ranks), free(p->group_off), free(p->group_ranks);
    free(p);
}

pdde_status pdde_cost_program_set_rank(pdde_cost_program *p, int rank, int device_id, double persistent_bytes) {
    if (!p || rank < 0 || rank >= p->n_ranks || !(persistent_bytes >= 0)) return PDDE_ERR_INVALID_ARG;
    p->ranks[rank].device = device_id;
    p->ranks[rank].persistent = persistent_bytes;
    return PDDE_OK;
}

int pdde_cost_program_group(pdde_cost_program *p, int n, const int *ranks) {
    if (!p || n < 0 || (!ranks && n)) return PDDE_ERR_INVALID_ARG;
    for (int i = 0; i < n; i++)
        if (ranks[i] < 0 || ranks[i] >= p->n_ranks) return PDDE_ERR_INVALID_ARG;
    int total = p->group_off[p->n_groups];
    int *off = realloc(p->group_off, (size_t)(p->n_groups + 2) * sizeof *off);
    if (!off) return PDDE_ERR_OOM;
    p->group_off = off;
    int *gr = realloc(p->group_ranks, (size_t)(total + n + 1) * sizeof *gr);
    if (!gr) return PDDE_ERR_OOM;
    p->group_ranks = gr;
    memcpy(gr + total, ranks, (size_t)n * sizeof *gr);
    off[p->n_groups + 1] = total + n;
    return p->n_groups++;
}

int pdde_cost_program_add(pdde_cost_program *p, int rank, const pdde_cost_op *op) {
    if (!p || !op || rank < 0 || rank >= p->n_ranks || (unsigned)op->kind > PDDE_COST_WAIT) return PDDE_ERR_INVALID_ARG;
    struct cost_rank *r = &p->ranks[rank];
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        pdde_cost_op *ops = realloc(r->ops, (size_t)cap * sizeof *ops);
        if (!ops) return PDDE_ERR_OOM;
        r->ops = ops, r->cap = cap;
    }
    r->ops[r->n] = *op;
    return r->n++;
}

int pdde_cost_program_op_count(const pdde_cost_program *p, int rank) {
    return p && rank >= 0 && rank < p->n_ranks ? p->ranks[rank].n : 0;
}

const pdde_cost_op *pdde_cost_program_op(const pdde_cost_program *p, int rank, int index) {
    return p && rank >= 0 && rank < p->n_ranks && index >= 0 && index < p->ranks[rank].n ? &p->ranks[rank].ops[index] : NULL;
}

/* ------------------------------------------------------------------------------------------------
 * Compute time */

/* FLOP/s at (m, n, k) from the measured table: inverse-distance weighting of the 3 nearest shapes in
 * log space (a measured shape gives its own figure; far outside the table the nearest dominates). */
static double cost_gemm_rate(const pdde_device_spec *s, pdde_dtype dt, double m, double n, double k) {
    int want = 0;
    for (int i = 0; i < s->n_gemm; i++) want |= s->gemm[i].dtype == dt;
    double best_d[3] = {INFINITY, INFINITY, INFINITY}, best_f[3] = {0, 0, 0};
    for (int i = 0; i < s->n_gemm; i++) {
        const pdde_gemm_point *g = &s->gemm[i];
        if (want && g->dtype != dt) continue;
        double a = log(m / (double)g->m), b = log(n / (double)g->n), c = log(k / (double)g->k);
        double d = a * a + b * b + c * c;
        if (d < 1e-18) return g->flops;
        for (int j = 0; j < 3; j++)
            if (d < best_d[j]) {
                for (int l = 2; l > j; l--) best_d[l] = best_d[l - 1], best_f[l] = best_f[l - 1];
                best_d[j] = d, best_f[j] = g->flops;
                break;
            }
    }
    double w = 0, sum = 0;
    for (int j = 0; j < 3 && isfinite(best_d[j]); j++) w += 1 / best_d[j], sum += best_f[j] / best_d[j];
    return w > 0 ? sum / w : 0;
}

/* Seconds for `bytes` on a measured curve: linear between points, the first point's time below it
 * (a launch costs at least that), the last point's bandwidth beyond it. */
static double cost_curve_time(const pdde_curve_point *c, int n, double bytes) {
    if (bytes <= c[0].bytes) return c[0].seconds;
    for (int i = 1; i < n; i++)
        if (bytes <= c[i].bytes) {
            double f = (bytes - c[i - 1].bytes) / (c[i].bytes - c[i - 1].bytes);
            return c[i - 1].seconds + f * (c[i].seconds - c[i - 1].seconds);
        }
    return c[n - 1].seconds * bytes / c[n - 1].bytes;
}

/* The class whose curve times class k on s: k's own, or for a class split off a broader one (pdde.h)
 * and not measured in s, the broader class's. */
static int cost_curve_class(const pdde_device_spec *s, int k) {
    if (s->n_curve[k]) return k;
    switch (k) {
    case PDDE_OPCLASS_LOSS: return PDDE_OPCLASS_ROW;
    case PDDE_OPCLASS_GELU: return PDDE_OPCLASS_ELEMENTWISE;
    case PDDE_OPCLASS_ROW_BACKWARD: return PDDE_OPCLASS_ROW;
    case PDDE_OPCLASS_FUSED_ATTENTION: return PDDE_OPCLASS_ATTENTION;
    case PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD: return cost_curve_class(s, PDDE_OPCLASS_FUSED_ATTENTION);
    case PDDE_OPCLASS_FUSED_ATTENTION_HALF: return cost_curve_class(s, PDDE_OPCLASS_FUSED_ATTENTION);
    case PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD: return cost_curve_class(s, PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD);
    case PDDE_OPCLASS_PS_PULL: return PDDE_OPCLASS_EMBEDDING;
    case PDDE_OPCLASS_PS_PUSH: return PDDE_OPCLASS_OPTIMIZER;
    default: return k;
    }
}

static const pdde_device_spec *cost_spec(const pdde_cluster *c, int device_id) {
    const pdde_cluster_device *d = pdde_cluster_find_device(c, device_id, NULL);
    return d && d->spec >= 0 && d->spec < c->n_specs ? &c->specs[d->spec] : NULL;
}

/* The threads a CPU device's figures were measured with (its name, as the CPU backend gives it: "CPU (N
 * threads, ..."); 1 for other devices or another name. */
static int cost_cpu_threads(const pdde_device_spec *s) {
    const char *p = s->kind == PDDE_DEVICE_CPU ? strstr(s->name, "(") : NULL;
    int n = 0;
    return p && sscanf(p, "(%d threads", &n) == 1 && n > 0 ? n : 1;
}

/* The rows a CPU thread's GEMM tile needs to run at its full rate: a thread alone on a tile of 64 or more
 * rows runs at about one rate (measured: 106 .. 115 GFLOP/s a thread from 64 to 1024 rows of 512 x 256),
 * while a GEMM split over T threads reaches T times that only from about T x 512 rows (below, the
 * split's fork and join and the library's use of fewer threads: 2 threads on 256 rows gave one
 * thread's rate). */
#define COST_TILE_FULL_ROWS 512.0

/* The streaming rate of a device's memory: its elementwise curve's last point (all threads), else its
 * stated bandwidth; 0 when neither. */
static double cost_stream_rate(const pdde_device_spec *s) {
    int n = s->n_curve[PDDE_OPCLASS_ELEMENTWISE];
    if (n && s->curve[PDDE_OPCLASS_ELEMENTWISE][n - 1].seconds > 0)
        return s->curve[PDDE_OPCLASS_ELEMENTWISE][n - 1].bytes / s->curve[PDDE_OPCLASS_ELEMENTWISE][n - 1].seconds;
    return s->mem_bandwidth;
}

/* A grouped GEMM on a CPU of T threads (the CPU backend's grouped kernel): tiles of at most the
 * experts' rows / 2T rows (at least 16; the columns split too when the rows are few), each run by one
 * thread alone, T at a time, in ceil(tiles / T) rounds, all in one fork. A thread on a tile runs at a
 * T-th of the device's rate on the tile's columns and depth at T x max(its rows, COST_TILE_FULL_ROWS)
 * rows (the curve's rate at T tiles' rows alone would charge each tile a whole GEMM's split). Each
 * tile also reads its own B operand (k x its columns: an expert's weights, which no other tile
 * shares, at the memory's streaming rate): what makes many experts of few rows slower than few of
 * many rows at the same FLOPs. 0 where that does not apply. */
static double cost_grouped_gemm_cpu(const pdde_device_spec *s, const pdde_cost_op *op, double flops) {
    int T = cost_cpu_threads(s);
    if (op->gemms < 2 || T < 2 || op->m < 1 || op->n < 1 || op->k < 1) return 0;
    double rows = (double)op->gemms * (double)op->m, want = 2.0 * T;
    double tile_m = floor(rows / want) > 16 ? floor(rows / want) : 16, tile_n = (double)op->n;
    if (rows < want * 16 && op->n > 64) {
        double split = floor(want * 16 / rows);
        tile_n = ceil((double)op->n / (split > 1 ? split : 1));
        if (tile_n < 64) tile_n = 64;
    }
    double mt = (double)op->m < tile_m ? (double)op->m : tile_m;
    double tiles = (double)op->gemms * ceil((double)op->m / mt) * ceil((double)op->n / tile_n);
    double rate = cost_gemm_rate(s, op->dtype, T * (mt > COST_TILE_FULL_ROWS ? mt : COST_TILE_FULL_ROWS), tile_n, (double)op->k);
    double stream = cost_stream_rate(s), b = tiles * (double)op->k * tile_n * (double)pdde_dtype_size(op->dtype);
    return rate > 0 ? ceil(tiles / T) * T * (flops / tiles) / rate + (stream > 0 ? b / stream : 0) : 0;
}

/* Whether f32 attention op runs on the CUDA backend's f32 tiled kernels on device s: where its path is named as
 * the dispatcher reads it (PDDE_CUDA_ATTENTION, else PDDE_ATTENTION: flash or flash2; backends/gpu_dispatch.h,
 * pgd_attention_path), at head sizes 64 and 128 (op->k). By default f32 takes the unfused graph there. */
static bool cost_cuda_f32_tiled(const pdde_device_spec *s, const pdde_cost_op *op) {
    if (op->dtype != PDDE_F32 || strcmp(s->backend, "cuda") != 0 || (op->k != 64 && op->k != 128)) return false;
    const char *v = getenv("PDDE_CUDA_ATTENTION");
    if (!v || !*v) v = getenv("PDDE_ATTENTION");
    return v && (!strcmp(v, "flash") || !strcmp(v, "flash2"));
}

/* A compute op's FLOPs: its own figure, else 2mnk of its GEMM shape (times its GEMMs); 0 without one. */
PDDE_PRIVATE double cost_op_flops(const pdde_cost_op *op) {
    return op->flops > 0 ? op->flops : 2.0 * (double)op->m * (double)op->n * (double)op->k * (op->gemms > 1 ? (double)op->gemms : 1);
}

/* *uncalibrated += 1 when the time comes from a peak figure instead of a measured curve. */
static double cost_compute(pdde_context *ctx, const pdde_cluster *c, int device_id, const pdde_cost_op *op,
                           int *uncalibrated) {
    const pdde_device_spec *s = cost_spec(c, device_id);
    if (!s) return pdde_error(ctx, PDDE_ERR_NOT_FOUND, "cost: no device with id %d in cluster \"%s\"", device_id, c->name), NAN;
    if ((unsigned)op->op_class >= PDDE_OPCLASS_COUNT) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "cost: op \"%s\": bad op class", op->name), NAN;
    if (op->op_class == PDDE_OPCLASS_GEMM) {
        double flops = cost_op_flops(op);
        if (flops <= 0) return 0;
        double rate = 0, grouped = s->n_gemm ? cost_grouped_gemm_cpu(s, op, flops) : 0;
        if (grouped > 0) return grouped;
        if (s->n_gemm && op->m > 0 && op->n > 0 && op->k > 0) rate = cost_gemm_rate(s, op->dtype, (double)op->m, (double)op->n, (double)op->k);
        else if (s->peak_flops > 0) rate = s->peak_flops, ++*uncalibrated;
        if (!(rate > 0))
            return pdde_error(ctx, PDDE_ERR_NO_PLAN, "cost: device %d (%s) has no GEMM curve and no peak_flops (run pdde-bench)", device_id, s->name), NAN;
        /* a fused attention on the CPU: backends/cpu_attention.c runs the online softmax of each score
         * tile (scalar exps) between its tile GEMMs, at the causal softmax's cost. Device kernels fuse
         * it into their GEMM loops: PoCL's whole fused attention measured a third of what its causal
         * softmax curve alone would give, so there the broader curves do not stand for it; a device's
         * own fused-attention curve (pdde-bench: what the op takes beyond its GEMMs at the device's
         * GEMM rate, which a kernel giving a thread a row makes most of the op) does. */
        double softmax = 0;
        int own = op->softmax_backward ? PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD : PDDE_OPCLASS_FUSED_ATTENTION;
        /* bf16 / f16 attention on an accelerator runs its own kernels (tiles on tensor cores, the GEMMs
         * inside): where the device has their curve, it times the whole op */
        int half = op->softmax_backward ? PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD : PDDE_OPCLASS_FUSED_ATTENTION_HALF;
        if (op->softmax_bytes > 0 && (op->dtype == PDDE_BF16 || op->dtype == PDDE_F16) && s->kind != PDDE_DEVICE_CPU && s->n_curve[half])
            return cost_curve_time(s->curve[half], s->n_curve[half], op->softmax_bytes);
        /* f32 on CUDA's f32 tiled kernels (where named): the causal half's FLOPs as FMAs in shared-memory tiles,
         * at the f32 GEMM rate (cuBLAS's f32 GEMMs without TF32 run on the same cores), the softmax fused and no
         * score ever in memory: not the fused_attention curves, which pdde-bench measures on the default path
         * (the unfused graph, its scores written and read) */
        if (op->softmax_bytes > 0 && s->kind != PDDE_DEVICE_CPU && cost_cuda_f32_tiled(s, op)) return flops / rate;
        int a = s->kind == PDDE_DEVICE_CPU ? cost_curve_class(s, (pdde_op_class)own) : own;
        if (op->softmax_bytes > 0 && s->n_curve[a])
            softmax = cost_curve_time(s->curve[a], s->n_curve[a], op->softmax_bytes);
        return flops / rate + softmax;
    }
    if (op->bytes <= 0) return 0; /* views and no-ops */
    int k = cost_curve_class(s, op->op_class);
    if (s->n_curve[k]) return cost_curve_time(s->curve[k], s->n_curve[k], op->bytes);
    if (s->mem_bandwidth > 0) return ++*uncalibrated, op->bytes / s->mem_bandwidth;
    return pdde_error(ctx, PDDE_ERR_NO_PLAN, "cost: device %d (%s) has no %s curve and no mem_bandwidth (run pdde-bench)",
                      device_id, s->name, pdde_op_class_name(op->op_class)), NAN;
}

/* n backend names (pdde_plan_devices.backend) in one block, each room for a spec's backend; NULL: out of memory */
static char **plan_backends_alloc(int n) {
    size_t room = sizeof ((pdde_device_spec *)0)->backend;
    char **names = malloc((size_t)(n > 0 ? n : 1) * (sizeof *names + room));
    for (int i = 0; names && i < n; i++) names[i] = (char *)(names + n) + (size_t)i * room;
    return names;
}

pdde_status pdde_plan_devices_init(pdde_context *ctx, const pdde_cluster *c, int64_t m, int64_t n, int64_t k,
                                      pdde_plan_devices *out) {
    if (!c || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_plan_devices_init: no %s", c ? "out" : "cluster");
    memset(out, 0, sizeof *out);
    int nd = pdde_cluster_device_count(c), i = 0;
    if (nd < 1) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "cluster \"%s\" has no devices", c->name);
    double *flops = malloc((size_t)nd * 4 * sizeof *flops);
    int *host = malloc((size_t)nd * sizeof *host);
    char **backend = plan_backends_alloc(nd);
    if (!flops || !host || !backend) {
        free(flops), free(host), free(backend);
        return pdde_error(ctx, PDDE_ERR_OOM, "cluster: out of memory");
    }
    double *bw = flops + nd, *mem = flops + 2 * nd, *lat = flops + 3 * nd;
    if (m <= 0 || n <= 0 || k <= 0) m = n = k = 4096;
    out->intra_bw = out->inter_bw = INFINITY;
    for (int h = 0; h < c->n_machines; h++) {
        const pdde_cluster_machine *mc = &c->machines[h];
        for (int d = 0; d < mc->n_devices; d++, i++) {
            const pdde_device_spec *s = &c->specs[mc->devices[d].spec];
            const pdde_curve_point *ew = s->curve[PDDE_OPCLASS_ELEMENTWISE];
            int ne = s->n_curve[PDDE_OPCLASS_ELEMENTWISE];
            flops[i] = s->n_gemm ? cost_gemm_rate(s, PDDE_F32, (double)m, (double)n, (double)k) : s->peak_flops;
            bw[i] = ne ? ew[ne - 1].bytes / ew[ne - 1].seconds : s->mem_bandwidth;
            mem[i] = (double)mc->devices[d].memory;
            lat[i] = ne ? ew[0].seconds : 0; /* the smallest op measured: dispatch and launch dominate it */
            host[i] = h;
            snprintf(backend[i], sizeof s->backend, "%s", s->backend);
        }
        if (mc->n_devices > 1 && mc->intra.bandwidth < out->intra_bw) out->intra_bw = mc->intra.bandwidth;
        if (mc->n_devices > 1 && mc->intra.latency > out->intra_lat) out->intra_lat = mc->intra.latency;
        if (c->n_machines > 1 && mc->nic.bandwidth < out->inter_bw) out->inter_bw = mc->nic.bandwidth;
        if (c->n_machines > 1 && 2 * mc->nic.latency > out->inter_lat) out->inter_lat = 2 * mc->nic.latency;
    }
    if (!isfinite(out->intra_bw)) out->intra_bw = 0;
    if (!isfinite(out->inter_bw)) out->inter_bw = 0;
    /* a measured allreduce (what pdde's collectives choose, on the most ranks measured) replaces the
     * link: the search times a ring allreduce of B bytes on n ranks as 2(n-1)/n B/bw + 2(n-1) lat, so
     * the link that gives the measured latency + B/bandwidth at that n */
    for (int intra = 0; intra <= 1; intra++) {
        const pdde_collective_calib *best = NULL;
        for (int j = 0; j < c->n_calibs; j++) {
            const pdde_collective_calib *k = &c->calibs[j];
            if (k->op == PDDE_COLL_ALLREDUCE && k->algo == PDDE_ALGO_AUTO && k->intra == intra && k->ranks > 1 && k->bandwidth > 0 &&
                (!best || k->ranks > best->ranks))
                best = k;
        }
        if (!best) continue;
        double steps = 2.0 * (best->ranks - 1);
        *(intra ? &out->intra_bw : &out->inter_bw) = best->bandwidth * steps / best->ranks;
        *(intra ? &out->intra_lat : &out->inter_lat) = best->latency / steps;
    }
    out->n_devices = nd, out->flops = flops, out->mem_bw = bw, out->memory = mem, out->host = host, out->op_latency = lat;
    out->backend = (const char *const *)backend;
    return PDDE_OK;
}

void pdde_plan_devices_free(pdde_plan_devices *d) {
    if (!d) return;
    free((void *)d->flops), free((void *)d->host), free((void *)d->backend); /* mem_bw, memory and op_latency share flops' block; cluster_device host's */
    memset(d, 0, sizeof *d);
}

/* The first in-place node of g that local device d does not run (an optimizer update, a gradient
 * accumulation: lowering would keep what they write on the CPU and copy it to d every step, which the
 * cost model does not price), else NULL: such a device is no rank's own (pdde_device_select, the machine's plans). */
PDDE_PRIVATE const pdde_tensor *plan_inplace_refused(pdde_context *ctx, const pdde_graph *g, int d) {
    for (int i = 0; g && i < g->n; i++) {
        const pdde_tensor *t = g->nodes[i];
        if (t->op != PDDE_OP_NONE && (t->flags & PDDE_TENSOR_INPLACE) && !registry_device_supports(ctx, ctx->registry, d, t)) return t;
    }
    return NULL;
}

/* The cost model's time for one process running g's step alone on device id (NaN: it cannot be timed). */
static double cost_step_alone(pdde_context *ctx, const pdde_cluster *c, const pdde_graph *g, int id) {
    pdde_cost_program *p = NULL;
    pdde_cost_result *r = NULL;
    double t = NAN;
    if (pdde_cost_program_from_graph_on(g, c, id, &p) == PDDE_OK && pdde_cost_simulate(ctx, c, p, &r) == PDDE_OK) t = r->step_time;
    pdde_cost_result_free(r);
    pdde_cost_program_free(p);
    return t > 0 ? t : NAN;
}

pdde_status pdde_plan_devices_init_machine(pdde_context *ctx, const pdde_cluster *c, const pdde_graph *g, int ranks,
                                           pdde_plan_devices *out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_plan_devices_init_machine: no out");
    memset(out, 0, sizeof *out);
    if (!c || !g || ranks < 1 || c->n_machines != 1)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "plan devices: want one machine and ranks >= 1 (have %d machines, %d ranks)", c ? c->n_machines : 0, ranks);
    pdde_plan_devices all;
    pdde_status st = pdde_plan_devices_init_graph(ctx, c, g, ranks, &all);
    if (st) return st;
    const pdde_cluster_machine *mc = &c->machines[0];
    int nd = all.n_devices, cpu = -1, n_acc = 0;
    int *acc = malloc((size_t)nd * sizeof *acc), *dev = malloc((size_t)ranks * sizeof *dev), *on = calloc((size_t)nd, sizeof *on);
    double *a = malloc((size_t)ranks * 7 * sizeof *a);
    int *host = calloc((size_t)ranks * 2, sizeof *host); /* (and after it each rank's device in the cluster: cluster_device) */
    char **backend = plan_backends_alloc(ranks);
    if (!acc || !dev || !on || !a || !host || !backend) {
        free(acc), free(dev), free(on), free(a), free(host), free(backend), pdde_plan_devices_free(&all);
        return pdde_error(ctx, PDDE_ERR_OOM, "plan devices: out of memory");
    }
    for (int i = 0; i < nd; i++) {
        if (c->specs[mc->devices[i].spec].kind == PDDE_DEVICE_CPU) { if (cpu < 0) cpu = i; }
        else acc[n_acc++] = i;
    }
    /* the accelerators are the ranks' own devices when the cost model predicts the first one faster
     * than the CPU for g (or there is no CPU) */
    double t_cpu = cpu >= 0 ? cost_step_alone(ctx, c, g, mc->devices[cpu].id) : NAN;
    double t_acc = n_acc ? cost_step_alone(ctx, c, g, mc->devices[acc[0]].id) : NAN;
    /* (this process's device of the accelerator's backend, where it has one, refusing an in-place node of g:
     * pdde_device_select would not give a rank that device, so its ranks are the CPU's) */
    int local = n_acc ? pdde_device_find(ctx, c->specs[mc->devices[acc[0]].spec].backend, 0) : -1;
    bool runs_inplace = local < 0 || !plan_inplace_refused(ctx, g, local);
    bool own = n_acc > 0 && runs_inplace && (cpu < 0 || (isfinite(t_acc) && (!isfinite(t_cpu) || t_acc < t_cpu)));
    for (int r = 0; r < ranks; r++) {
        dev[r] = !own ? (cpu >= 0 ? cpu : 0) : r < n_acc ? acc[r] : cpu >= 0 ? cpu : acc[r % n_acc];
        on[dev[r]]++;
    }
    /* a device of the machine that no rank runs on (a placement target, or one left aside) and that the cost
     * model cannot time, its calibration having failed (no GEMM figure: pdde-bench's GEMM runs all failed): it is
     * not planned on, and the plan is refused with the cost model's reason rather than made around it silently
     * (a rank's own such device is refused by the search, naming the rank) */
    for (int i = 0; i < nd; i++) {
        if (on[i] || (all.flops[i] > 0 && all.mem_bw[i] > 0)) continue;
        pdde_cost_op gemm = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GEMM, .m = 64, .n = 64, .k = 64, .dtype = PDDE_F32};
        pdde_cost_op stream = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_ELEMENTWISE, .bytes = 1 << 20, .dtype = PDDE_F32};
        int unc = 0;
        snprintf(gemm.name, sizeof gemm.name, "gemm"), snprintf(stream.name, sizeof stream.name, "elementwise");
        const char *why = isnan(cost_compute(ctx, c, mc->devices[i].id, &gemm, &unc)) || isnan(cost_compute(ctx, c, mc->devices[i].id, &stream, &unc))
                              ? pdde_last_error(ctx) : "its figures time no GEMM or no memory traffic";
        char reason[512];
        snprintf(reason, sizeof reason, "%s", why);
        free(acc), free(dev), free(on), free(a), free(host), free(backend), pdde_plan_devices_free(&all);
        return pdde_error(ctx, PDDE_ERR_NO_PLAN, "plan: no plan fits: cluster device %d (%s) has no measured figures and is not planned on: %s "
                          "(its calibration failed: pdde-bench names the error; measure it again, or take it out of the cluster file)",
                          mc->devices[i].id, c->specs[mc->devices[i].spec].backend, reason);
    }
    /* the placement target beside each rank's device: the CPU beside an accelerator, or the first
     * accelerator beside the CPU; shared by the ranks placing there (a share of its memory each) */
    int place = own ? cpu : n_acc ? acc[0] : -1, base = own ? acc[0] : cpu;
    pdde_cluster_link link = {0};
    int n_place = 0;
    for (int r = 0; r < ranks && place >= 0; r++) n_place += dev[r] != place;
    if (place >= 0 && (base < 0 || !n_place || pdde_cluster_link_between(c, mc->devices[base].id, mc->devices[place].id, &link) ||
                       !(link.bandwidth > 0)))
        place = -1;
    for (int r = 0; r < ranks; r++) {
        int d = dev[r];
        /* a device shared by k ranks gives each a k-th of its speed, memory bandwidth and memory: an
         * accelerator's time, and a CPU's cores (pdde-bench measures the CPU with all its threads;
         * pdde-run gives each of k ranks cores / k of them) */
        a[r] = all.flops[d] / on[d], a[ranks + r] = all.mem_bw[d] / on[d], a[2 * ranks + r] = all.memory[d] / on[d];
        a[3 * ranks + r] = all.op_latency ? all.op_latency[d] : 0;
        bool placing = place >= 0 && d != place;
        a[4 * ranks + r] = placing ? all.flops[place] : 0, a[5 * ranks + r] = placing ? all.mem_bw[place] : 0;
        a[6 * ranks + r] = placing ? all.memory[place] / n_place : 0;
        host[ranks + r] = d;
        snprintf(backend[r], sizeof c->specs[0].backend, "%s", all.backend[d]);
    }
    *out = all;
    out->n_devices = ranks, out->flops = a, out->mem_bw = a + ranks, out->memory = a + 2 * ranks, out->op_latency = a + 3 * ranks;
    out->host = host, out->cluster_device = host + ranks, out->backend = (const char *const *)backend;
    if (!(out->intra_bw > 0)) out->intra_bw = mc->intra.bandwidth, out->intra_lat = mc->intra.latency;
    if (place >= 0) {
        out->place_flops = a + 4 * ranks, out->place_mem_bw = a + 5 * ranks, out->place_memory = a + 6 * ranks;
        out->place_bw = link.bandwidth, out->place_lat = link.latency;
        snprintf(out->place_backend, sizeof out->place_backend, "%s", c->specs[mc->devices[place].spec].backend);
    }
    free((void *)all.flops), free((void *)all.host), free((void *)all.backend), free(acc), free(dev), free(on);
    return PDDE_OK;
}

double pdde_cost_compute_time(pdde_context *ctx, const pdde_cluster *c, int device_id, const pdde_cost_op *op) {
    int unc = 0;
    if (!c || !op) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_cost_compute_time: no %s", c ? "op" : "cluster"), NAN;
    return cost_compute(ctx, c, device_id, op, &unc);
}

/* A table's pull reads an id and a row and writes the row out; a push reads the gradient and reads
 * and writes the row's values and optimizer state (Adagrad: one float a value, Adam: two). The
 * ps_pull / ps_push curves are measured at these bytes, so they read back what was measured: the
 * probes, which no byte count sees, are in the curve's time. */
double pdde_cost_ps_bytes(int push, double n, int dim, pdde_ps_optimizer opt) {
    double row = (double)dim * sizeof(float), state = opt == PDDE_PS_SGD ? 0 : opt == PDDE_PS_ADAGRAD ? 1 : 2;
    return push ? n * row * (1 + 2 * (1 + state)) : n * (2 * row + sizeof(uint64_t));
}

double pdde_cost_ps_time(pdde_context *ctx, const pdde_cluster *c, int device_id, int push, double n, int dim, pdde_ps_optimizer opt) {
    pdde_cost_op op = {.kind = PDDE_COST_COMPUTE, .op_class = push ? PDDE_OPCLASS_PS_PUSH : PDDE_OPCLASS_PS_PULL,
                       .bytes = pdde_cost_ps_bytes(push, n, dim, opt)};
    snprintf(op.name, sizeof op.name, "ps %s", push ? "push" : "pull");
    return pdde_cost_compute_time(ctx, c, device_id, &op);
}

static pdde_status cost_program_from_graph(const pdde_graph *g, int device_id, const char *backend, pdde_cost_program **out);

pdde_status pdde_plan_devices_init_graph(pdde_context *ctx, const pdde_cluster *c, const pdde_graph *g, int ranks,
                                            pdde_plan_devices *out) {
    if (!c || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_plan_devices_init_graph: no %s", c ? "out" : "cluster");
    pdde_cost_program *p = NULL;
    const char *p_backend = NULL; /* (p: the graph's program as lowered for this backend's devices) */
    pdde_status st = pdde_plan_devices_init(ctx, c, 0, 0, 0, out);
    double share = ranks > 1 ? 1.0 / ranks : 1.0;
    /* a device's figures depend on its spec only: timed once per spec (4096 devices share a few) */
    int *timed_as = !st ? malloc(((size_t)c->n_specs + 1) * sizeof *timed_as) : NULL;
    if (!st && !timed_as) st = pdde_error(ctx, PDDE_ERR_OOM, "cluster: out of memory");
    for (int i = 0; timed_as && i < c->n_specs; i++) timed_as[i] = -1;
    for (int h = 0, i = 0; !st && h < c->n_machines; h++)
        for (int d = 0; d < c->machines[h].n_devices; d++, i++) {
            int spec = c->machines[h].devices[d].spec;
            if (spec >= 0 && spec < c->n_specs && timed_as[spec] >= 0) {
                ((double *)out->flops)[i] = out->flops[timed_as[spec]], ((double *)out->mem_bw)[i] = out->mem_bw[timed_as[spec]];
                continue;
            }
            if (spec >= 0 && spec < c->n_specs) timed_as[spec] = i;
            const char *backend = spec >= 0 && spec < c->n_specs ? c->specs[spec].backend : "";
            if (!p || strcmp(p_backend, backend)) {
                pdde_cost_program_free(p), p = NULL, p_backend = backend;
                if ((st = cost_program_from_graph(g, 0, backend, &p))) {
                    pdde_error(ctx, st, "cluster: cannot read the graph's nodes");
                    break;
                }
            }
            double flops = 0, t_gemm = 0, bytes = 0, t_other = 0;
            int unc = 0;
            for (int k = 0; k < pdde_cost_program_op_count(p, 0); k++) {
                pdde_cost_op op = *pdde_cost_program_op(p, 0, k);
                if (op.op_class == PDDE_OPCLASS_GEMM) op.m = op.m * share >= 1 ? (int64_t)(op.m * share) : 1, op.flops *= share;
                else op.bytes *= share;
                double t = cost_compute(ctx, c, c->machines[h].devices[d].id, &op, &unc);
                if (!isfinite(t)) { flops = bytes = 0; break; } /* a device the graph cannot be timed on keeps its figures above */
                /* (an attention's or MoE GEMM's own FLOPs, as the search counts them: not its tile shape's) */
                if (op.op_class == PDDE_OPCLASS_GEMM) flops += cost_op_flops(&op), t_gemm += t;
                else if (op.bytes > 0) bytes += op.bytes, t_other += t;
            }
            if (flops > 0 && t_gemm > 0) ((double *)out->flops)[i] = flops / t_gemm;
            if (bytes > 0 && t_other > 0) ((double *)out->mem_bw)[i] = bytes / t_other;
        }
    free(timed_as);
    pdde_cost_program_free(p);
    if (st && out->flops) pdde_plan_devices_free(out);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Communication time. A collective is a sequence of steps; in a step some flows (src -> dst device,
 * bytes) run at once, each at latency + bytes / bandwidth of its link, where the flows that share a
 * resource (a machine's NIC, in or out; an explicit link group) divide its bandwidth. A step lasts as
 * long as its slowest flow. */

typedef struct {
    pdde_context *ctx;
    const pdde_cluster *c;
    int n;                   /* flows in the step */
    int cap;
    int *src, *dst;
    double *bytes;
    int failed;
} cost_step;

static void cost_step_flow(cost_step *s, int a, int b, double bytes) {
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 16;
        int *src = realloc(s->src, (size_t)cap * sizeof *src);
        if (src) s->src = src;
        int *dst = src ? realloc(s->dst, (size_t)cap * sizeof *dst) : NULL;
        if (dst) s->dst = dst;
        double *by = dst ? realloc(s->bytes, (size_t)cap * sizeof *by) : NULL;
        if (!by) { s->failed = 1; return; }
        s->bytes = by, s->cap = cap;
    }
    s->src[s->n] = a, s->dst[s->n] = b, s->bytes[s->n] = bytes;
    s->n++;
}

/* Resources of a flow: up to 3 keys (egress NIC, ingress NIC, link group). */
static int cost_flow_resources(const pdde_cluster *c, int a, int b, const pdde_cluster_link *l, long *keys) {
    int n = 0, ma = 0, mb = 0;
    pdde_cluster_find_device(c, a, &ma), pdde_cluster_find_device(c, b, &mb);
    if (ma != mb) {
        int explicit = 0;
        for (int i = 0; i < c->n_links; i++)
            if ((c->links[i].a == a && c->links[i].b == b) || (c->links[i].a == b && c->links[i].b == a)) explicit = 1;
        if (!explicit) keys[n++] = 2L * ma, keys[n++] = 2L * mb + 1;
    }
    if (l->group >= 0) keys[n++] = -1L - l->group;
    return n;
}

/* Seconds of the step; resets it. */
static double cost_step_time(cost_step *s) {
    double worst = 0;
    if (s->failed) return NAN;
    pdde_cluster_link *links = malloc((size_t)(s->n ? s->n : 1) * sizeof *links);
    long *keys = malloc((size_t)(s->n ? s->n : 1) * 3 * sizeof *keys);
    int *nkeys = malloc((size_t)(s->n ? s->n : 1) * sizeof *nkeys);
    if (!links || !keys || !nkeys) worst = NAN;
    for (int i = 0; isfinite(worst) && i < s->n; i++) {
        if (pdde_cluster_link_between(s->c, s->src[i], s->dst[i], &links[i])) {
            pdde_error(s->ctx, PDDE_ERR_NOT_FOUND, "cost: no device %d or %d in cluster \"%s\"", s->src[i], s->dst[i], s->c->name);
            worst = NAN;
            break;
        }
        if (!(links[i].bandwidth > 0)) {
            pdde_error(s->ctx, PDDE_ERR_NO_PLAN, "cost: the %s link between devices %d and %d has no bandwidth (run pdde-bench)",
                       pdde_link_kind_name(links[i].kind), s->src[i], s->dst[i]);
            worst = NAN;
            break;
        }
        nkeys[i] = cost_flow_resources(s->c, s->src[i], s->dst[i], &links[i], keys + 3 * i);
    }
    for (int i = 0; isfinite(worst) && i < s->n; i++) {
        int share = 1; /* the most flows on any resource of this one */
        for (int k = 0; k < nkeys[i]; k++) {
            int cnt = 0;
            for (int j = 0; j < s->n; j++)
                for (int l = 0; l < nkeys[j]; l++) cnt += keys[3 * j + l] == keys[3 * i + k];
            if (cnt > share) share = cnt;
        }
        double t = links[i].latency + s->bytes[i] * share / links[i].bandwidth;
        if (t > worst) worst = t;
    }
    free(links), free(keys), free(nkeys);
    s->n = 0;
    return worst;
}

/* A ring over dev[0..n) (each sends chunk to the next): one step. */
static double cost_ring_step(cost_step *s, const int *dev, int n, double chunk) {
    for (int i = 0; i < n; i++) cost_step_flow(s, dev[i], dev[(i + 1) % n], chunk);
    return cost_step_time(s);
}

static int cost_all_one_machine(const pdde_cluster *c, const int *dev, int n) {
    int m0 = -1, m;
    for (int i = 0; i < n; i++) {
        if (!pdde_cluster_find_device(c, dev[i], &m)) return 0;
        if (i == 0) m0 = m;
        else if (m != m0) return 0;
    }
    return 1;
}

/* Two-level allreduce: reduce-scatter in each machine, allreduce of each local shard across machines
 * (local-size rings at once through the NICs), allgather in each machine. Needs the same number of
 * ranks on each machine, listed machine by machine; -1 otherwise. */
static double cost_two_level(cost_step *s, const int *dev, int n, double bytes) {
    int L = 0, m0, m;
    pdde_cluster_find_device(s->c, dev[0], &m0);
    while (L < n && pdde_cluster_find_device(s->c, dev[L], &m) && m == m0) L++;
    if (L < 2 || L == n || n % L) return -1;
    int H = n / L;
    for (int h = 0; h < H; h++)
        if (!cost_all_one_machine(s->c, dev + h * L, L)) return -1;
    double chunk = bytes / L, t_local = 0;
    /* every machine's local ring runs at once */
    for (int h = 0; h < H; h++)
        for (int i = 0; i < L; i++) cost_step_flow(s, dev[h * L + i], dev[h * L + (i + 1) % L], chunk / L);
    t_local = cost_step_time(s) * (L - 1) * 2; /* reduce-scatter then allgather */
    for (int j = 0; j < L; j++)
        for (int h = 0; h < H; h++) cost_step_flow(s, dev[h * L + j], dev[((h + 1) % H) * L + j], chunk / H);
    double t_cross = cost_step_time(s) * 2 * (H - 1);
    return t_local + t_cross;
}

static double cost_recursive(cost_step *s, pdde_collective coll, const int *dev, int n, double bytes) {
    int p = 1, rounds = 0;
    while (2 * p <= n) p *= 2, rounds++;
    double t = 0;
    if (n > p) { /* the extra ranks fold into the first ones before, and get the result after */
        for (int i = p; i < n; i++) cost_step_flow(s, dev[i], dev[i - p], bytes);
        t += 2 * cost_step_time(s);
    }
    for (int r = 0; r < rounds; r++) {
        /* allreduce exchanges the whole buffer each round; allgather doubles its block */
        double b = coll == PDDE_COLL_ALLREDUCE ? bytes : bytes / p * (double)(1 << r);
        for (int i = 0; i < p; i++) cost_step_flow(s, dev[i], dev[i ^ (1 << r)], b);
        t += cost_step_time(s);
    }
    return t;
}

static double cost_collective(pdde_context *ctx, const pdde_cluster *c, pdde_collective coll, pdde_comm_algo algo,
                              const int *dev, int n, double bytes) {
    if (n <= 1 || bytes <= 0) return 0;
    int intra = cost_all_one_machine(c, dev, n);
    for (int i = 0; i < c->n_calibs; i++) {
        const pdde_collective_calib *k = &c->calibs[i];
        if (k->op == coll && k->algo == algo && k->ranks == n && k->intra == intra)
            return k->latency + bytes / k->bandwidth;
    }
    if (algo == PDDE_ALGO_AUTO) /* as comm/collectives.c chooses */
        algo = bytes <= 64 * 1024 && coll != PDDE_COLL_ALLTOALL ? PDDE_ALGO_RECURSIVE
             : !intra && coll == PDDE_COLL_ALLREDUCE ? PDDE_ALGO_TWO_LEVEL : PDDE_ALGO_RING;
    cost_step s = {ctx, c, 0, 0, NULL, NULL, NULL, 0};
    double t = NAN;
    switch (coll) {
    case PDDE_COLL_SENDRECV:
        cost_step_flow(&s, dev[0], dev[1], bytes);
        t = cost_step_time(&s);
        break;
    case PDDE_COLL_ALLTOALL:
        t = 0;
        for (int k = 1; k < n; k++) {
            for (int i = 0; i < n; i++) cost_step_flow(&s, dev[i], dev[(i + k) % n], bytes / n);
            t += cost_step_time(&s);
        }
        break;
    case PDDE_COLL_ALLREDUCE:
    case PDDE_COLL_ALLGATHER:
    case PDDE_COLL_REDUCE_SCATTER:
        if (algo == PDDE_ALGO_TWO_LEVEL && coll == PDDE_COLL_ALLREDUCE && (t = cost_two_level(&s, dev, n, bytes)) >= 0) break;
        if (algo == PDDE_ALGO_RECURSIVE && (coll == PDDE_COLL_ALLREDUCE || !(n & (n - 1)))) {
            t = cost_recursive(&s, coll, dev, n, bytes);
            break;
        }
        /* ring: allreduce = reduce-scatter + allgather, 2(n-1) steps of a 1/n chunk */
        t = cost_ring_step(&s, dev, n, bytes / n) * (n - 1) * (coll == PDDE_COLL_ALLREDUCE ? 2 : 1);
        break;
    default:
        pdde_error(ctx, PDDE_ERR_INVALID_ARG, "cost: unknown collective %d", (int)coll);
    }
    free(s.src), free(s.dst), free(s.bytes);
    return t;
}

double pdde_cost_collective_time(pdde_context *ctx, const pdde_cluster *c, pdde_collective coll,
                                 pdde_comm_algo algo, const int *devices, int n, int64_t count, pdde_dtype dtype) {
    return cost_collective(ctx, c, coll, algo, devices, n, (double)count * (double)pdde_dtype_size(dtype));
}

/* ------------------------------------------------------------------------------------------------
 * The timeline simulation. Each rank runs its ops in order on a compute stream (clock t); collectives
 * and sends also use its communication stream (free at comm_free), so an asynchronous collective
 * overlaps the compute that follows it until its WAIT. A collective starts when every rank of its
 * group has issued it (the k-th collective a rank issues on a group meets the others' k-th); a RECV
 * ends when its SEND's data has arrived. A rank computing on a CPU keeps its cores busy, so its
 * transport moves only inside its communication calls (a RECV, a blocking collective, a WAIT, the end
 * of its step where the executor completes its sends): its message moves once the receiver has posted
 * the receive and the sender is in such a call (a rendezvous; measured with pdde-run pp=2 on 2 cores:
 * the second stage's receive completed the moment the first stage entered its next receive,
 * milliseconds after the send was posted). The simulation sweeps over the ranks, advancing each as
 * far as it can; a compute op on a CPU stops its rank until cost_shared_advance has run it (its speed
 * depends on the ranks computing beside it); a sweep that moves no rank while none computes and some
 * are unfinished is a deadlock in the program. */

typedef struct {
    int arrived;
    double ready;            /* the latest issue time so far */
    int done;
    double end;
} cost_instance;

typedef struct {
    int src, dst, tag, used;
    int rendezvous;          /* from a CPU rank: moves only while the sender is in a communication call */
    double sent, arrival;    /* when the transfer started, when it is in (rendezvous: at the earliest) */
} cost_message;

/* The communication calls a rank has made so far (start, end), in time order. */
typedef struct {
    int n, cap;
    double *start, *end;
} cost_calls;

static int cost_calls_add(cost_calls *k, double start, double end) {
    if (k->n == k->cap) {
        int nc = k->cap ? 2 * k->cap : 64;
        double *a = realloc(k->start, (size_t)nc * sizeof *a);
        if (a) k->start = a;
        double *b = a ? realloc(k->end, (size_t)nc * sizeof *b) : NULL;
        if (!b) return PDDE_ERR_OOM;
        k->end = b, k->cap = nc;
    }
    k->start[k->n] = start, k->end[k->n++] = end;
    return PDDE_OK;
}

/* The first time from `posted` on at which a rank is inside a communication call: `posted` when a
 * call spans it, else the start of its next call (the one it is blocked in since blocked_since >= 0,
 * or the end of its step at finished >= 0); -1 while its timeline does not reach that far. */
static double cost_next_call(const cost_calls *k, double blocked_since, double finished, double posted) {
    for (int i = 0; i < k->n; i++)
        if (k->end[i] > posted) return k->start[i] <= posted ? posted : k->start[i];
    double next = blocked_since >= 0 ? blocked_since : finished;
    return next < 0 ? -1 : next > posted ? next : posted;
}

typedef struct {
    int n, cap;
    cost_instance *v;
} cost_instances;

static pdde_status cost_result_event(pdde_cost_result *res, int *cap, int rank, int op, double start, double end, int lane) {
    if (res->n_events == *cap) {
        int nc = *cap ? 2 * *cap : 256;
        pdde_cost_event *e = realloc(res->events, (size_t)nc * sizeof *e);
        if (!e) return PDDE_ERR_OOM;
        res->events = e, *cap = nc;
    }
    res->events[res->n_events++] = (pdde_cost_event){rank, op, start, end, lane};
    return PDDE_OK;
}

void pdde_cost_result_free(pdde_cost_result *r) {
    if (!r) return;
    free(r->peak_memory), free(r->compute_time), free(r->comm_wait), free(r->idle), free(r->events);
    free(r);
}

/* Peak bytes of rank r: persistent + the activations alive, in program order. */
static double cost_rank_memory(const struct cost_rank *rk, double *dies) {
    for (int i = 0; i < rk->n; i++) dies[i] = 0;
    for (int i = 0; i < rk->n; i++)
        if (rk->ops[i].last_use >= i && rk->ops[i].last_use < rk->n) dies[rk->ops[i].last_use] += rk->ops[i].out_bytes;
    double live = 0, peak = 0;
    for (int i = 0; i < rk->n; i++) {
        live += rk->ops[i].out_bytes;
        if (live > peak) peak = live;
        live -= dies[i];
    }
    return rk->persistent + peak;
}

/* Ranks sharing a machine's cores (processor sharing). A CPU device's figures are those of one rank
 * on one core; at each moment the ranks computing on CPU devices of a machine with C cores
 * (pdde_cluster_machine.cores; 0 = unknown: no limit) share them, each at min(1, C / computing) of its
 * speed, and the busy cores contend for memory bandwidth and caches: an op runs its class's contention
 * figure slower with all C busy, not at all with one, linearly between. A rank waiting (a pipeline
 * bubble, a receive, a collective) uses no core, so the others' compute speeds up while it waits.
 * The speed changes whenever a rank starts or ends an op, so the simulation advances such ops from
 * one of those moments to the next. */
typedef struct {
    int machine;             /* of the CPU device whose cores its compute op shares; -1 = none running */
    double start;            /* when that op started */
    double from, work;       /* seconds of one core's work left at time `from` (0: it ended at `from`) */
    double contention;       /* its class's slowdown with every core of the machine busy */
    double speed;            /* of one core's, from `from` on */
} cost_shared;

/* The slowdown of class k on spec s with every core busy: its own figure, else its broader class's. */
static double cost_contention(const pdde_device_spec *s, int k) {
    if (s->contention[k] > 0) return s->contention[k];
    int broader = k == PDDE_OPCLASS_GEMM || k == PDDE_OPCLASS_FUSED_ATTENTION ? PDDE_OPCLASS_GEMM
                : k == PDDE_OPCLASS_ROW || k == PDDE_OPCLASS_ATTENTION || k == PDDE_OPCLASS_LOSS || k == PDDE_OPCLASS_ROW_BACKWARD
                    ? PDDE_OPCLASS_ROW : PDDE_OPCLASS_ELEMENTWISE;
    return s->contention[broader] > 0 ? s->contention[broader] : 1;
}

/* The machine whose cores a compute op on device `device` shares: its machine for a CPU, else -1 (a
 * device computes on its own). */
static int cost_shares_cores(const pdde_cluster *c, int device) {
    int machine = -1;
    const pdde_device_spec *s = cost_spec(c, device);
    pdde_cluster_find_device(c, device, &machine);
    return s && s->kind == PDDE_DEVICE_CPU ? machine : -1;
}

/* A rank's speed (of one core's) while `busy` ranks compute on a machine of `cores` cores (0 =
 * unknown: each its own core), its op's class slowing by `contention` with every core busy. */
static double cost_shared_speed(int cores, int busy, double contention) {
    int used = cores > 0 && busy > cores ? cores : busy;
    double all_busy = cores > 1 ? (double)(used - 1) / (cores - 1) : cores == 0 && used > 1;
    return (double)used / busy / (1 + (contention - 1) * all_busy);
}

/* Advances the running shared ops of sh[0..R) from the earliest moment one of them runs to the next
 * moment one ends or another starts (the ops ending there get work 0). */
static void cost_shared_advance(const pdde_cluster *c, cost_shared *sh, int R) {
    double now = INFINITY, next = INFINITY;
    for (int r = 0; r < R; r++)
        if (sh[r].machine >= 0 && sh[r].work > 0 && sh[r].from < now) now = sh[r].from;
    for (int r = 0; r < R; r++) {
        if (sh[r].machine < 0 || !(sh[r].work > 0)) continue;
        if (sh[r].from > now) { /* starts later: until then the others run without it */
            next = sh[r].from < next ? sh[r].from : next;
            continue;
        }
        int busy = 0;
        for (int q = 0; q < R; q++) busy += sh[q].machine == sh[r].machine && sh[q].work > 0 && sh[q].from <= now;
        sh[r].speed = cost_shared_speed(c->machines[sh[r].machine].cores, busy, sh[r].contention);
        double end = now + sh[r].work / sh[r].speed;
        next = end < next ? end : next;
    }
    for (int r = 0; r < R; r++) {
        if (sh[r].machine < 0 || !(sh[r].work > 0) || sh[r].from > now) continue;
        int ends = now + sh[r].work / sh[r].speed <= next;
        sh[r].work = ends ? 0 : sh[r].work - sh[r].speed * (next - now);
        if (sh[r].work < 0) sh[r].work = 0;
        sh[r].from = next;
    }
}

/* How much slower than alone a CPU rank computes an op of op_class while every CPU rank of
 * devices[0..n) on its machine computes too (the processor sharing above); 1 elsewhere. */
PDDE_PRIVATE double cost_core_sharing(const pdde_cluster *c, const int *devices, int n, int op_class) {
    int machine = cost_shares_cores(c, devices[0]), busy = 0;
    if (machine < 0) return 1;
    for (int r = 0; r < n; r++) busy += cost_shares_cores(c, devices[r]) == machine;
    const pdde_device_spec *s = cost_spec(c, devices[0]);
    double speed = cost_shared_speed(c->machines[machine].cores, busy, s ? cost_contention(s, op_class) : 1);
    return speed > 0 ? 1 / speed : 1;
}

/* How many times more CPU ranks of devices[0..n) share devices[0]'s machine than it has cores (at least
 * 1; 1 elsewhere): a collective among them, calibrated with a core a rank, runs its copies and waits
 * at cores / ranks of that (a rank it waits for runs only when one of the cores is handed to it). */
PDDE_PRIVATE double cost_rank_oversubscription(const pdde_cluster *c, const int *devices, int n) {
    int machine = cost_shares_cores(c, devices[0]), busy = 0;
    if (machine < 0 || c->machines[machine].cores < 1) return 1;
    for (int r = 0; r < n; r++) busy += cost_shares_cores(c, devices[r]) == machine;
    return busy > c->machines[machine].cores ? (double)busy / c->machines[machine].cores : 1;
}

/* G groups of S ranks (group g's i-th: members[g * S + i]) each running `steps` steps at once, every
 * rank sending `chunk` bytes a step to its group's k-th next rank (pairwise: k = the step) or its next
 * (a ring): the seconds, each step its slowest flow with all groups' flows sharing what they share. */
PDDE_PRIVATE double cost_groups_at_once(pdde_context *ctx, const pdde_cluster *c, int pairwise, const int *members, int G, int S, int steps,
                                        double chunk) {
    cost_step s = {ctx, c, 0, 0, NULL, NULL, NULL, 0};
    double t = 0;
    for (int k = 1; k <= steps && isfinite(t); k++) {
        for (int g = 0; g < G; g++)
            for (int i = 0; i < S; i++) cost_step_flow(&s, members[(size_t)g * S + i], members[(size_t)g * S + (i + (pairwise ? k : 1)) % S], chunk);
        t += cost_step_time(&s);
    }
    free(s.src), free(s.dst), free(s.bytes);
    return t;
}

pdde_status pdde_cost_simulate(pdde_context *ctx, const pdde_cluster *c, const pdde_cost_program *p,
                               pdde_cost_result **out) {
    if (!c || !p || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_cost_simulate: no %s", !c ? "cluster" : !p ? "program" : "out");
    *out = NULL;
    int R = p->n_ranks, G = p->n_groups, max_ops = 1, ev_cap = 0;
    for (int r = 0; r < R; r++) if (p->ranks[r].n > max_ops) max_ops = p->ranks[r].n;
    pdde_cost_result *res = calloc(1, sizeof *res);
    int *pc = calloc((size_t)R, sizeof *pc), *issued = calloc((size_t)R, sizeof *issued);
    int *seq = calloc((size_t)R * (size_t)(G ? G : 1), sizeof *seq);           /* next instance per (rank, group) */
    int *inst_of = calloc((size_t)R * (size_t)max_ops, sizeof *inst_of);       /* instance of each collective op */
    double *t = calloc((size_t)R, sizeof *t), *comm_free = calloc((size_t)R, sizeof *comm_free);
    double *dies = calloc((size_t)max_ops, sizeof *dies);
    cost_instances *inst = calloc((size_t)(G ? G : 1), sizeof *inst);
    cost_message *msgs = NULL;
    int n_msgs = 0, cap_msgs = 0, *devs = NULL, *all_devs = NULL;
    double *rank_over = NULL, *machine_over = NULL; /* cost_rank_oversubscription of each rank's, each machine's (0: not yet) */
    pdde_status st = PDDE_OK;
    if (res) {
        res->n_ranks = R;
        res->peak_memory = calloc((size_t)R, sizeof(double));
        res->compute_time = calloc((size_t)R, sizeof(double));
        res->comm_wait = calloc((size_t)R, sizeof(double));
        res->idle = calloc((size_t)R, sizeof(double));
    }
    devs = malloc((size_t)R * sizeof *devs), all_devs = malloc((size_t)R * sizeof *all_devs);
    rank_over = malloc((size_t)R * sizeof *rank_over), machine_over = calloc((size_t)c->n_machines + 1, sizeof *machine_over);
    cost_calls *calls = calloc((size_t)R, sizeof *calls);  /* each rank's communication calls so far */
    double *blocked_since = malloc((size_t)R * sizeof *blocked_since); /* in the call it stopped at; -1 */
    cost_shared *sh = malloc((size_t)R * sizeof *sh); /* each rank's compute op sharing its machine's cores */
    for (int r = 0; blocked_since && r < R; r++) blocked_since[r] = -1;
    for (int r = 0; sh && r < R; r++) sh[r].machine = -1;
    if (!res || !pc || !issued || !seq || !inst_of || !t || !comm_free || !dies || !inst || !devs || !all_devs || !rank_over || !machine_over || !calls || !blocked_since || !sh ||
        !res->peak_memory || !res->compute_time || !res->comm_wait || !res->idle) {
        st = pdde_error(ctx, PDDE_ERR_OOM, "cost: out of memory");
        goto done;
    }
    for (int r = 0; r < R; r++) {
        if (!pdde_cluster_find_device(c, p->ranks[r].device, NULL)) {
            st = pdde_error(ctx, PDDE_ERR_NOT_FOUND, "cost: rank %d runs on device %d, which cluster \"%s\" does not have",
                            r, p->ranks[r].device, c->name);
            goto done;
        }
        res->peak_memory[r] = cost_rank_memory(&p->ranks[r], dies);
        all_devs[r] = p->ranks[r].device;
    }
    for (int r = 0; r < R; r++) { /* (from each machine's first rank: the machine's other ranks all come after it) */
        int m = cost_shares_cores(c, all_devs[r]);
        if (m >= 0 && !machine_over[m]) machine_over[m] = cost_rank_oversubscription(c, all_devs + r, R - r);
        rank_over[r] = m >= 0 ? machine_over[m] : 1;
    }
    int finished = 0;
    while (finished < R) {
        int moved = 0;
        finished = 0;
        for (int r = 0; r < R; r++) {
            const struct cost_rank *rk = &p->ranks[r];
            const pdde_device_spec *spec = cost_spec(c, rk->device);
            int rendezvous = spec && spec->kind == PDDE_DEVICE_CPU;
            while (pc[r] < rk->n) {
                const pdde_cost_op *op = &rk->ops[pc[r]];
                double start = t[r], end;
                int lane = 1;
                if (op->kind == PDDE_COST_COMPUTE && sh[r].machine >= 0) { /* sharing cores: ends when its work is done */
                    if (sh[r].work > 0) break;
                    start = sh[r].start, end = sh[r].from, lane = 0, sh[r].machine = -1;
                    res->compute_time[r] += end - start;
                } else if (op->kind == PDDE_COST_COMPUTE) {
                    int device = op->placed ? op->placed_device : rk->device, machine = cost_shares_cores(c, device);
                    double d = cost_compute(ctx, c, device, op, &res->uncalibrated);
                    if (!isfinite(d)) { st = PDDE_ERR_NO_PLAN; goto done; }
                    if (machine >= 0 && d > 0) { /* cost_shared_advance runs it */
                        sh[r] = (cost_shared){machine, start, start, d, cost_contention(cost_spec(c, device), op->op_class), 1};
                        break;
                    }
                    end = start + d, lane = 0;
                    res->compute_time[r] += d;
                } else if (op->kind == PDDE_COST_SEND) {
                    if (op->peer < 0 || op->peer >= R) {
                        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "cost: rank %d op %d (%s): send to rank %d of %d", r, pc[r], op->name, op->peer, R);
                        goto done;
                    }
                    int pair[2] = {rk->device, p->ranks[op->peer].device};
                    double d = cost_collective(ctx, c, PDDE_COLL_SENDRECV, PDDE_ALGO_AUTO, pair, 2,
                                               (double)op->count * (double)pdde_dtype_size(op->dtype));
                    if (!isfinite(d)) { st = PDDE_ERR_NO_PLAN; goto done; }
                    start = t[r] > comm_free[r] ? t[r] : comm_free[r];
                    end = comm_free[r] = start + d;
                    if (n_msgs == cap_msgs) {
                        cap_msgs = cap_msgs ? 2 * cap_msgs : 64;
                        cost_message *m = realloc(msgs, (size_t)cap_msgs * sizeof *m);
                        if (!m) { st = pdde_error(ctx, PDDE_ERR_OOM, "cost: out of memory"); goto done; }
                        msgs = m;
                    }
                    msgs[n_msgs++] = (cost_message){r, op->peer, op->tag, 0, rendezvous, start, end};
                    if ((st = cost_result_event(res, &ev_cap, r, pc[r], start, end, 1))) goto done;
                    pc[r]++, moved = 1;
                    continue; /* the compute stream goes on */
                } else if (op->kind == PDDE_COST_RECV) {
                    int m = 0;
                    while (m < n_msgs && (msgs[m].used || msgs[m].src != op->peer || msgs[m].dst != r || msgs[m].tag != op->tag)) m++;
                    if (m == n_msgs) break; /* not sent yet */
                    if (msgs[m].rendezvous) { /* it moves once the sender is in a call */
                        int s = op->peer;
                        double posted = start > msgs[m].sent ? start : msgs[m].sent; /* both the receive and the send */
                        double go = cost_next_call(&calls[s], blocked_since[s], pc[s] == p->ranks[s].n ? t[s] : -1, posted);
                        if (go < 0) break; /* the sender's timeline is not there yet */
                        double moved_at = go + msgs[m].arrival - msgs[m].sent;
                        if (moved_at > msgs[m].arrival) msgs[m].arrival = moved_at;
                    }
                    msgs[m].used = 1;
                    end = msgs[m].arrival > start ? msgs[m].arrival : start;
                    /* waiting for the peer to send is idle (a pipeline bubble); the transfer, communication */
                    if (msgs[m].sent > start) start = msgs[m].sent < end ? msgs[m].sent : end;
                    res->comm_wait[r] += end - start;
                } else if (op->kind == PDDE_COST_COLLECTIVE) {
                    if (op->group < 0 || op->group >= G) {
                        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "cost: rank %d op %d (%s): no group %d", r, pc[r], op->name, op->group);
                        goto done;
                    }
                    cost_instances *gi = &inst[op->group];
                    if (!issued[r]) { /* first visit: join the instance */
                        int k = seq[(size_t)r * (size_t)G + (size_t)op->group]++;
                        if (k >= gi->cap) {
                            int nc = gi->cap ? 2 * gi->cap : 16;
                            cost_instance *v = realloc(gi->v, (size_t)nc * sizeof *v);
                            if (!v) { st = pdde_error(ctx, PDDE_ERR_OOM, "cost: out of memory"); goto done; }
                            memset(v + gi->cap, 0, (size_t)(nc - gi->cap) * sizeof *v);
                            gi->v = v, gi->cap = nc;
                        }
                        if (k >= gi->n) gi->n = k + 1;
                        inst_of[(size_t)r * (size_t)max_ops + (size_t)pc[r]] = k;
                        cost_instance *in = &gi->v[k];
                        double ready = t[r] > comm_free[r] ? t[r] : comm_free[r];
                        if (ready > in->ready) in->ready = ready;
                        issued[r] = 1, moved = 1;
                        int gn = p->group_off[op->group + 1] - p->group_off[op->group];
                        const int *gr = p->group_ranks + p->group_off[op->group];
                        if (++in->arrived == gn) {
                            for (int i = 0; i < gn; i++) devs[i] = p->ranks[gr[i]].device;
                            /* (ranks beyond their machine's cores: at cores / ranks of the rate, its most crowded
                             * machine's, as moe_cost.c charges) */
                            double over = 1;
                            for (int i = 0; i < gn; i++) over = rank_over[gr[i]] > over ? rank_over[gr[i]] : over;
                            double d = cost_collective(ctx, c, op->coll, op->algo, devs, gn,
                                                       (double)op->count * (double)pdde_dtype_size(op->dtype)) * over;
                            if (!isfinite(d)) { st = PDDE_ERR_NO_PLAN; goto done; }
                            in->done = 1, in->end = in->ready + d;
                            for (int i = 0; i < gn; i++)
                                if (comm_free[gr[i]] < in->end) comm_free[gr[i]] = in->end;
                            for (int i = 0; i < gn; i++)
                                if ((st = cost_result_event(res, &ev_cap, gr[i], -1, in->ready, in->end, 1))) goto done;
                        }
                    }
                    int k = inst_of[(size_t)r * (size_t)max_ops + (size_t)pc[r]];
                    if (op->async) { issued[r] = 0, pc[r]++; continue; }
                    if (!gi->v[k].done) break;
                    issued[r] = 0;
                    end = gi->v[k].end > start ? gi->v[k].end : start;
                    if (gi->v[k].ready > start) start = gi->v[k].ready < end ? gi->v[k].ready : end; /* before: waiting for the group (idle) */
                    res->comm_wait[r] += end - start;
                    if (cost_calls_add(&calls[r], t[r], end)) { st = pdde_error(ctx, PDDE_ERR_OOM, "cost: out of memory"); goto done; }
                    blocked_since[r] = -1;
                    t[r] = end, pc[r]++, moved = 1;
                    continue;
                } else { /* WAIT */
                    const pdde_cost_op *w = op->wait >= 0 && op->wait < pc[r] ? &rk->ops[op->wait] : NULL;
                    if (!w || w->kind != PDDE_COST_COLLECTIVE || !w->async) {
                        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "cost: rank %d op %d (%s): waits on op %d, not an earlier async collective",
                                        r, pc[r], op->name, op->wait);
                        goto done;
                    }
                    const cost_instance *in = &inst[w->group].v[inst_of[(size_t)r * (size_t)max_ops + (size_t)op->wait]];
                    if (!in->done) break;
                    end = in->end > start ? in->end : start;
                    if (in->ready > start) start = in->ready < end ? in->ready : end; /* waiting for the group: idle */
                    res->comm_wait[r] += end - start;
                }
                if (end > start && (st = cost_result_event(res, &ev_cap, r, pc[r], start, end, lane))) goto done;
                if (op->kind != PDDE_COST_COMPUTE && cost_calls_add(&calls[r], t[r], end)) { /* a RECV or WAIT */
                    st = pdde_error(ctx, PDDE_ERR_OOM, "cost: out of memory");
                    goto done;
                }
                blocked_since[r] = -1;
                t[r] = end, pc[r]++, moved = 1;
            }
            /* stopped at a RECV, collective or WAIT (not a compute op on shared cores): inside that call
             * from now on (which may let a message it sent move) */
            if (pc[r] < rk->n && sh[r].machine < 0 && blocked_since[r] < 0) blocked_since[r] = t[r], moved = 1;
            finished += pc[r] == rk->n;
        }
        int computing = 0;
        for (int r = 0; r < R; r++) computing |= sh[r].machine >= 0;
        if (!moved && computing) { /* every rank computes or waits: on to the next op that ends or starts */
            cost_shared_advance(c, sh, R);
            continue;
        }
        if (!moved && finished < R) {
            int r = 0;
            while (pc[r] == p->ranks[r].n) r++;
            const pdde_cost_op *op = &p->ranks[r].ops[pc[r]];
            st = pdde_error(ctx, PDDE_ERR_NO_PLAN, "cost: the program deadlocks: rank %d waits at op %d (%s, %s)", r, pc[r], op->name,
                            op->kind == PDDE_COST_RECV ? "a receive no rank sends" : "a collective or wait its group never completes");
            goto done;
        }
    }
    for (int r = 0; r < R; r++) {
        double e = t[r] > comm_free[r] ? t[r] : comm_free[r];
        if (e > res->step_time) res->step_time = e;
    }
    for (int r = 0; r < R; r++) {
        res->idle[r] = res->step_time - res->compute_time[r] - res->comm_wait[r];
        if (res->idle[r] < 1e-12 * res->step_time) res->idle[r] = 0; /* rounding of the sums */
    }
done:
    for (int g = 0; inst && g < G; g++) free(inst[g].v);
    for (int r = 0; calls && r < R; r++) free(calls[r].start), free(calls[r].end);
    free(inst), free(pc), free(issued), free(seq), free(inst_of), free(t), free(comm_free), free(dies), free(msgs), free(devs), free(all_devs), free(rank_over), free(machine_over);
    free(calls), free(blocked_since), free(sh);
    if (st) pdde_cost_result_free(res);
    else *out = res;
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * A graph as one rank's program */

/* The GEMM work of a matmul or fused attention node into op (shape, FLOPs, the inputs' dtype; for the
 * attention also the causal softmax it runs between its GEMMs); other nodes keep op as it is. Both the
 * graph's program and the simulation of lowered programs time nodes by it, so a fused attention is
 * never a GEMM of no work in one of them. */
PDDE_PRIVATE void cost_node_gemm(const pdde_tensor *x, pdde_cost_op *op) {
    bool accum = x->op == PDDE_OP_GRAD_ACCUM && x->nsrc == 3; /* (a matmul folded into its gradient's accumulation) */
    if ((x->op == PDDE_OP_MATMUL || accum) && x->nsrc >= 2 && x->ndim >= 2) {
        const pdde_tensor *a = x->src[accum ? 1 : 0];
        op->n = x->shape[x->ndim - 1];
        op->k = pdde_op_i32(x, PDDE_P_MATMUL_TRANS_A) ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
        op->m = op->n ? pdde_tensor_numel(x) / op->n : 0;
        op->dtype = a->dtype; /* the GEMM's kind is its inputs' (bf16 in, f32 out: the bf16 rate) */
    } else if ((x->op == PDDE_OP_ATTENTION || x->op == PDDE_OP_ATTENTION_BACK) && x->nsrc >= 1) {
        /* rated as its tile GEMMs: rows x a tile of keys (the CPU's 128) x the head dim */
        const pdde_tensor *q = x->src[0];
        int64_t B, H, T, D;
        int packed;
        pdde_attention_dims(x, &B, &H, &T, &D, &packed);
        op->m = B * H * T, op->n = T < 128 ? T : 128, op->k = D;
        op->flops = pdde_attention_flops(x);
        op->dtype = q->dtype; /* bf16 q, k, v (mixed precision): the bf16 GEMM rate, as a matmul's */
        /* the softmax over the scores its tiles compute (the causal triangle's tiles, or a window's; T x T
         * at the T = 128 the attention curve is measured at), as that curve measures one (scores in,
         * probabilities out: 2 x 4 bytes a score); the backward recomputes it and runs its gradient
         * (y, dy, dx: 3 more) */
        double scores = (double)B * (double)H * attention_tile_scores(x, T);
        op->softmax_bytes = (x->op == PDDE_OP_ATTENTION ? 2 : 5) * 4.0 * scores;
        op->softmax_backward = x->op == PDDE_OP_ATTENTION_BACK;
    } else if ((x->op == PDDE_OP_MOE_GROUPED_MATMUL || x->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W) && x->nsrc >= 3 && x->src[0]->ndim == 2) {
        /* a GEMM per expert over its rows (gemms: E of them), each of the mean rows an expert gets
         * (few when the experts are many: on a CPU, tiles a thread each); the FLOPs of all R rows */
        const pdde_tensor *a = x->src[0];
        int64_t E = pdde_op_i32(x, PDDE_P_MOE_EXPERTS) > 0 ? pdde_op_i32(x, PDDE_P_MOE_EXPERTS) : 1, R = a->shape[0];
        int64_t per = R / E > 0 ? R / E : 1;
        bool fwd = x->op == PDDE_OP_MOE_GROUPED_MATMUL;
        op->m = fwd ? per : x->shape[1], op->n = fwd ? x->shape[1] : x->shape[2], op->k = fwd ? a->shape[1] : per;
        op->flops = 2.0 * (double)R * (fwd ? (double)x->shape[1] * (double)a->shape[1] : (double)x->shape[1] * (double)x->shape[2]);
        op->dtype = PDDE_F32, op->gemms = E;
    } else if ((x->op == PDDE_OP_MOE_GROUPED_MATMUL || x->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W) && x->nsrc >= 2 && x->src[0]->ndim == 3) {
        /* the buffer by expert [El, S, K] (expert parallelism; S rows an expert, the tokens of the
         * exchange's ranks when dropless): only the routed rows are multiplied, S k / E an expert
         * under even routing (k: the dispatch's ids' columns), at most S */
        const pdde_tensor *a = x->src[0], *d = a;
        for (int i = 0; i < 16 && d->nsrc > 0 && d->op != PDDE_OP_MOE_DISPATCH; i++) d = d->src[0];
        int64_t E = pdde_op_i32(x, PDDE_P_MOE_EXPERTS) > 0 ? pdde_op_i32(x, PDDE_P_MOE_EXPERTS) : a->shape[0], El = a->shape[0], S = a->shape[1];
        int64_t k = d->op == PDDE_OP_MOE_DISPATCH && d->nsrc > 1 && d->src[1]->ndim == 2 ? d->src[1]->shape[1] : 1;
        int64_t per = S * k / E < S ? S * k / E : S;
        if (per < 1) per = 1;
        bool fwd = x->op == PDDE_OP_MOE_GROUPED_MATMUL;
        int64_t M = fwd ? x->shape[2] : x->src[1]->shape[2], K = a->shape[2];
        op->m = fwd ? per : K, op->n = M, op->k = fwd ? K : per;
        op->flops = 2.0 * (double)El * (double)per * (double)K * (double)M;
        op->dtype = PDDE_F32, op->gemms = El;
    }
}

/* A grouped GEMM over the buffer by expert also reads all its padded rows to find the routed ones,
 * and (forward) zeroes its padded output before scattering the results back: those bytes, else 0. */
PDDE_PRIVATE double cost_moe_padded_bytes(const pdde_tensor *x) {
    if ((x->op != PDDE_OP_MOE_GROUPED_MATMUL && x->op != PDDE_OP_MOE_GROUPED_MATMUL_BACK_W) || x->nsrc < 2 || x->src[0]->ndim != 3) return 0;
    return (double)pdde_tensor_nbytes(x->src[0]) + (x->op == PDDE_OP_MOE_GROUPED_MATMUL ? (double)pdde_tensor_nbytes(x) : 0);
}

/* Bytes a node reads and writes: its inputs and its output, except that a lookup touches only the rows
 * it reads (and its backward only the rows it adds to), not the whole table. */
PDDE_PRIVATE double cost_node_bytes(const pdde_tensor *x) {
    if (x->op == PDDE_OP_EMBEDDING && x->nsrc >= 2)
        return 2.0 * (double)pdde_tensor_nbytes(x) + (double)pdde_tensor_nbytes(x->src[1]);
    if (x->op == PDDE_OP_EMBEDDING_BACK && x->nsrc >= 3)
        return 3.0 * (double)pdde_tensor_nbytes(x->src[2]) + (double)pdde_tensor_nbytes(x->src[1]);
    double b = (double)pdde_tensor_nbytes(x);
    for (int s = 0; s < x->nsrc; s++) b += (double)pdde_tensor_nbytes(x->src[s]);
    if (x->op == PDDE_OP_CROSS_ENTROPY_BACK && pdde_op_i32(x, PDDE_P_CE_DLOGITS)) return 0; /* (lowering's PDDE_FUSE_CE: its forward writes it, */
    return b;                                                                          /* its dlogits a source there) */
}

/* What node x of a lowered program moves and computes as the simulation of such programs counts it (a
 * view moves nothing; a grouped GEMM over the buffer by expert also scans and zeroes its padding), and
 * the dtype whose GEMM rate its FLOPs run at. PDDE_PROFILE=device sets each node's device time against it. */
PDDE_PRIVATE void cost_node_work(const pdde_tensor *x, double *bytes, double *flops, pdde_dtype *dtype) {
    pdde_cost_op op;
    memset(&op, 0, sizeof op);
    op.dtype = x->dtype;
    cost_node_gemm(x, &op);
    *bytes = x->flags & PDDE_TENSOR_VIEW ? 0 : cost_node_bytes(x) + cost_moe_padded_bytes(x);
    *flops = cost_op_flops(&op), *dtype = op.dtype;
}

/* The graph's nodes the step needs (lower_needed_nodes: not an input's gradient nobody reads), or where a
 * fusion of lowering's is on for a device of `backend` (lower_fusion_on; NULL: the default device of a
 * session, the context's device 0), the order of its program lowered for one process (what a session runs:
 * the fused nodes, the adds and casts they took in as views, which cost nothing) */
static pdde_status cost_program_from_graph(const pdde_graph *g, int device_id, const char *backend, pdde_cost_program **out) {
    if (!out) return PDDE_ERR_INVALID_ARG;
    pdde_cost_program *p;
    pdde_status st = pdde_cost_program_init(1, &p);
    if (st) return st;
    pdde_program *P = NULL;
    if (g && g->n && !backend) backend = registry_device_backend(g->ctx->registry, 0);
    if (g && g->n && lower_fusion_any(backend, lower_graph_bf16(g))) {
        pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
        pdde_lower_params lp = program_lower_params(g, &sp, 0, 0);
        lp.fusion_backend = backend;
        if (program_lower(g, &lp, &P) != PDDE_OK) P = NULL; /* (then the graph's nodes, as without fusions) */
    }
    int n = P ? P->n_order : g ? g->n : 0, n_ids = P ? P->n + 1 : n;
    int *index = malloc((size_t)(n_ids ? n_ids : 1) * sizeof *index); /* tensor id -> op index (-1: a leaf) */
    uint8_t *needed = !P && n ? lower_needed_nodes(g) : NULL; /* (the lowered program has only those) */
    if (!index || (!P && n && !needed)) { free(index), program_free(P), pdde_cost_program_free(p); return PDDE_ERR_OOM; }
    double persistent = 0;
    bool direct_step = g && g->has_optimizer && g->opt.grad_accum_steps <= 1 && lower_direct_grads_on();
    for (int i = 0; i < n_ids; i++) index[i] = -1;
    for (int i = 0; P && i < P->n; i++)
        if (P->nodes[i] && is_persistent(P->nodes[i])) persistent += (double)pdde_tensor_nbytes(P->nodes[i]);
    for (int i = 0; i < n && !st; i++) {
        const pdde_tensor *x = P ? P->order[i] : g->nodes[i];
        if (!P && !needed[i]) continue;
        /* a step's gradients written where they are accumulated (lower_direct_grads; the graph's accumulations
         * of one micro-batch a step, as lowering would find them in a GPT) */
        if (P ? P->info[x->id].grad_direct : x->op == PDDE_OP_GRAD_ACCUM && x->nsrc == 2 && direct_step) continue;
        if (x->op == PDDE_OP_NONE) {
            if (!P) persistent += (double)pdde_tensor_nbytes(x);
            continue;
        }
        pdde_cost_op op;
        memset(&op, 0, sizeof op);
        op.kind = PDDE_COST_COMPUTE;
        snprintf(op.name, sizeof op.name, "%.20s %s", pdde_op_name(x->op), x->phase == PDDE_PHASE_FORWARD ? "F" : x->phase == PDDE_PHASE_BACKWARD ? "B" : "U");
        op.phase = x->phase, op.micro = -1, op.dtype = x->dtype, op.last_use = -1;
        op.op_class = pdde_op_class_of(x);
        int view = (x->flags & PDDE_TENSOR_VIEW) != 0;
        if (!view) op.bytes = cost_node_bytes(x);
        if (!view && !(x->flags & PDDE_TENSOR_INPLACE)) op.out_bytes = (double)pdde_tensor_nbytes(x);
        cost_node_gemm(x, &op);
        int k = pdde_cost_program_add(p, 0, &op);
        if (k < 0) { st = k; break; }
        index[x->id] = k;
        for (int s = 0; s < x->nsrc; s++) { /* the inputs live until here */
            int j = x->src[s] && x->src[s]->id < n_ids ? index[x->src[s]->id] : -1;
            if (j >= 0 && !(x->src[s]->flags & (PDDE_TENSOR_OUTPUT | PDDE_TENSOR_LOSS)))
                p->ranks[0].ops[j].last_use = k;
        }
    }
    free(index), free(needed);
    program_free(P);
    if (!st) st = pdde_cost_program_set_rank(p, 0, device_id, persistent);
    if (st) { pdde_cost_program_free(p); return st; }
    *out = p;
    return PDDE_OK;
}

pdde_status pdde_cost_program_from_graph(const pdde_graph *g, int device_id, pdde_cost_program **out) {
    return cost_program_from_graph(g, device_id, NULL, out);
}

pdde_status pdde_cost_program_from_graph_on(const pdde_graph *g, const pdde_cluster *c, int device_id, pdde_cost_program **out) {
    const pdde_device_spec *s = c ? cost_spec(c, device_id) : NULL;
    if (!s) return PDDE_ERR_INVALID_ARG;
    return cost_program_from_graph(g, device_id, s->backend, out);
}

/* ------------------------------------------------------------------------------------------------
 * Timelines */

void pdde_cost_timeline_text(const pdde_cost_result *r, FILE *f, int width) {
    if (!r || !f) return;
    if (width < 10) width = 10;
    double T = r->step_time > 0 ? r->step_time : 1;
    char *line = malloc((size_t)width + 1);
    if (!line) return;
    fprintf(f, "step %.6g s  ('#' compute, '=' communication, '.' idle; %.3g s a column)\n", r->step_time, T / width);
    for (int k = 0; k < r->n_ranks; k++) {
        memset(line, '.', (size_t)width);
        line[width] = 0;
        for (int e = 0; e < r->n_events; e++) {
            const pdde_cost_event *ev = &r->events[e];
            if (ev->rank != k || ev->end - ev->start < 0.01 * T / width) continue; /* (a flicker would hide what is around it) */
            int a = (int)(ev->start / T * width), b = (int)ceil(ev->end / T * width);
            for (int x = a; x < b && x < width; x++)
                if (ev->lane == 0) line[x] = '#'; /* compute wins a shared column */
                else if (line[x] == '.') line[x] = '=';
        }
        fprintf(f, "rank %3d |%s| compute %.3g s, comm wait %.3g s, idle %.3g s, peak %.4g GiB\n", k, line,
                r->compute_time[k], r->comm_wait[k], r->idle[k], r->peak_memory[k] / 1073741824.0);
    }
    free(line);
}

pdde_status pdde_cost_timeline_svg(pdde_context *ctx, const pdde_cost_result *r, const pdde_cost_program *p,
                                   const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return pdde_error(ctx, PDDE_ERR_IO, "%s: %s", path, strerror(errno));
    const double W = 1000, left = 70, lane_h = 28;
    double T = r->step_time > 0 ? r->step_time : 1, H = 40 + lane_h * r->n_ranks;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" font-size=\"11\">\n",
            W + left + 10, H);
    fprintf(f, "<text x=\"4\" y=\"14\">one step: %.6g s (blue compute, orange communication, blank idle)</text>\n", r->step_time);
    for (int k = 0; k < r->n_ranks; k++) {
        double y = 24 + lane_h * k;
        fprintf(f, "<text x=\"4\" y=\"%.1f\">rank %d</text>\n", y + 16, k);
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#f4f4f4\"/>\n", left, y, W, lane_h - 4);
    }
    for (int e = 0; e < r->n_events; e++) {
        const pdde_cost_event *ev = &r->events[e];
        const pdde_cost_op *op = ev->op >= 0 ? pdde_cost_program_op(p, ev->rank, ev->op) : NULL;
        double y = 24 + lane_h * ev->rank + (ev->lane ? (lane_h - 4) / 2 : 0);
        double x = left + ev->start / T * W, w = (ev->end - ev->start) / T * W;
        char title[48];
        snprintf(title, sizeof title, "%s", op ? op->name : "collective");
        for (char *q = title; *q; q++) if (*q == '<' || *q == '>' || *q == '&' || *q == '"') *q = ' ';
        fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>%s %.4g..%.4g s</title></rect>\n",
                x, y, w > 0.3 ? w : 0.3, ev->lane ? (lane_h - 4) / 2 : lane_h - 4, ev->lane ? "#ee854a" : "#4878d0",
                title, ev->start, ev->end);
    }
    fprintf(f, "</svg>\n");
    return fclose(f) ? pdde_error(ctx, PDDE_ERR_IO, "%s: write failed", path) : PDDE_OK;
}

pdde_status pdde_cost_timeline_trace(pdde_context *ctx, const pdde_cost_result *r, const pdde_cost_program *p,
                                     const char *path) {
    FILE *f = fopen(path, "w");
    if (!f) return pdde_error(ctx, PDDE_ERR_IO, "%s: %s", path, strerror(errno));
    fprintf(f, "{\"traceEvents\":[\n");
    for (int k = 0; k < r->n_ranks; k++) /* lane names, so that a viewer labels them */
        fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d (predicted)\"}},\n"
                   "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n"
                   "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"communication\"}},\n", k, k, k, k);
    for (int e = 0; e < r->n_events; e++) {
        const pdde_cost_event *ev = &r->events[e];
        const pdde_cost_op *op = ev->op >= 0 ? pdde_cost_program_op(p, ev->rank, ev->op) : NULL;
        char name[sizeof op->name];
        snprintf(name, sizeof name, "%s", op ? op->name : "collective");
        for (char *q = name; *q; q++) if (*q == '"' || *q == '\\' || (unsigned char)*q < 32) *q = ' ';
        fprintf(f, "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d}%s\n", name,
                ev->lane ? "comm" : "compute", ev->start * 1e6, (ev->end - ev->start) * 1e6, ev->rank, ev->lane, e + 1 < r->n_events ? "," : "");
    }
    fprintf(f, "],\"displayTimeUnit\":\"ms\",\"otherData\":{\"step_s\":%.9g,\"source\":\"pdde cost model\"}}\n", r->step_time);
    return fclose(f) ? pdde_error(ctx, PDDE_ERR_IO, "%s: write failed", path) : PDDE_OK;
}
