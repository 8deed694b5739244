/* planner/cluster.c — the unified cluster object: machines -> devices -> links, its checks, its JSON
 * form (read with cJSON, written without it) and the detection of this machine (backends + hwloc). Included by pdde.c. */
#include "planner_impl.h"

#include <errno.h>
#include <float.h>
#include <limits.h>
#include <math.h>
#include <unistd.h>
#include "planner_impl.h"

#ifdef PDDE_HAVE_CJSON
#include <cjson/cJSON.h>
#else
#include "json_read.c" /* the part of cJSON's interface the reader below uses */
#endif
#ifdef PDDE_HAVE_HWLOC
#include <hwloc.h>
#endif

static const char *const cluster_class_names[PDDE_OPCLASS_COUNT] = {"gemm", "elementwise", "row", "attention",
                                                                     "embedding", "optimizer", "loss", "gelu",
                                                                     "row_backward", "fused_attention",
                                                                     "fused_attention_backward", "fused_attention_half",
                                                                     "fused_attention_half_backward", "ps_pull", "ps_push"};
static const char *const cluster_kind_names[] = {"cpu", "gpu", "accel"};
static const char *const cluster_link_names[] = {"shm", "pcie", "nvlink", "net"};
static const char *const cluster_coll_names[PDDE_COLL_COUNT] = {"allreduce", "allgather", "reduce_scatter",
                                                                "alltoall", "sendrecv"};
static const char *const cluster_algo_names[] = {"auto", "ring", "recursive", "two_level"};

const char *pdde_op_class_name(pdde_op_class c) {
    return (unsigned)c < PDDE_OPCLASS_COUNT ? cluster_class_names[c] : "?";
}
const char *pdde_link_kind_name(pdde_link_kind k) { return (unsigned)k < 4 ? cluster_link_names[k] : "?"; }
const char *pdde_collective_name(pdde_collective c) {
    return (unsigned)c < PDDE_COLL_COUNT ? cluster_coll_names[c] : "?";
}

pdde_op_class pdde_op_class_of(const pdde_tensor *node) {
    if (!node) return PDDE_OPCLASS_ELEMENTWISE;
    switch (node->op) {
    case PDDE_OP_MATMUL: return PDDE_OPCLASS_GEMM;
    case PDDE_OP_ATTENTION: case PDDE_OP_ATTENTION_BACK: return PDDE_OPCLASS_GEMM; /* tiles of GEMMs (pdde_attention_flops) */
    case PDDE_OP_MOE_GROUPED_MATMUL: case PDDE_OP_MOE_GROUPED_MATMUL_BACK_W: return PDDE_OPCLASS_GEMM; /* a GEMM per expert */
    case PDDE_OP_LAYERNORM: case PDDE_OP_RMSNORM: case PDDE_OP_SUM: case PDDE_OP_MEAN: case PDDE_OP_SUM_TO:
        return PDDE_OPCLASS_ROW;
    case PDDE_OP_LAYERNORM_BACK: case PDDE_OP_LAYERNORM_BACK_GAMMA: case PDDE_OP_RMSNORM_BACK: case PDDE_OP_RMSNORM_BACK_GAMMA:
        return PDDE_OPCLASS_ROW_BACKWARD;
    case PDDE_OP_CROSS_ENTROPY: case PDDE_OP_CROSS_ENTROPY_BACK: case PDDE_OP_MOE_AUX_LOSS: case PDDE_OP_MOE_AUX_LOSS_BACK:
        return PDDE_OPCLASS_LOSS;
    case PDDE_OP_GELU: case PDDE_OP_GELU_BACK: case PDDE_OP_BIAS_GELU: case PDDE_OP_BIAS_GELU_BACK: return PDDE_OPCLASS_GELU;
    case PDDE_OP_SOFTMAX:
        return pdde_op_i32(node, PDDE_P_SOFTMAX_CAUSAL) ? PDDE_OPCLASS_ATTENTION : PDDE_OPCLASS_ROW;
    case PDDE_OP_SOFTMAX_BACK: /* the causal flag is on the forward softmax it differentiates (src0 = y) */
        return node->nsrc > 0 && node->src[0]->op == PDDE_OP_SOFTMAX && pdde_op_i32(node->src[0], PDDE_P_SOFTMAX_CAUSAL)
                   ? PDDE_OPCLASS_ATTENTION : PDDE_OPCLASS_ROW;
    case PDDE_OP_EMBEDDING: case PDDE_OP_EMBEDDING_BACK: return PDDE_OPCLASS_EMBEDDING;
    case PDDE_OP_GRAD_NORM_SQ: case PDDE_OP_SGD_UPDATE: case PDDE_OP_ADAMW_UPDATE: return PDDE_OPCLASS_OPTIMIZER;
    default: return PDDE_OPCLASS_ELEMENTWISE;
    }
}

PDDE_PRIVATE double attention_pairs(const pdde_tensor *node, int64_t T) {
    const pdde_tensor *starts = pdde_attention_starts(node);
    double W = starts ? (double)pdde_op_i32(starts, PDDE_P_STARTS_WINDOW) : 0, t = (double)T;
    if (W <= 0 || W >= t) return t * (t + 1) / 2;
    return W * (W + 1) / 2 + (t - W) * W; /* (the first W queries' triangle, then W keys each) */
}

PDDE_PRIVATE double attention_tile_scores(const pdde_tensor *node, int64_t T) {
    const pdde_tensor *starts = pdde_attention_starts(node);
    const int64_t tile = 128; /* (the CPU kernel's, ATT_BR x ATT_BC; the GPU kernels' 64 or 128) */
    int64_t W = starts ? pdde_op_i32(starts, PDDE_P_STARTS_WINDOW) : 0;
    double scores = 0;
    for (int64_t q0 = 0; q0 < T; q0 += tile) {
        int64_t rows = T - q0 < tile ? T - q0 : tile, first = W > 0 && q0 - W + 1 > 0 ? (q0 - W + 1) / tile * tile : 0;
        int64_t end = q0 + tile < T ? q0 + tile : T; /* (through the diagonal tile) */
        scores += (double)rows * (double)(end - first);
    }
    return scores;
}

double pdde_attention_flops(const pdde_tensor *node) {
    if (!node || (node->op != PDDE_OP_ATTENTION && node->op != PDDE_OP_ATTENTION_BACK) || node->nsrc < 1 || node->src[0]->ndim < 3) return 0;
    int64_t s[4];
    int packed;
    pdde_attention_dims(node, &s[0], &s[1], &s[2], &s[3], &packed);
    /* 2 flops a multiply-add, over the query-key pairs the attention keeps, for each GEMM: 2 in the
     * forward (scores, probabilities x values), 5 in the backward (scores again, dv, dp, dq, dk) */
    double pairs = (double)s[0] * (double)s[1] * attention_pairs(node, s[2]);
    return (node->op == PDDE_OP_ATTENTION ? 2 : 5) * 2.0 * pairs * (double)s[3];
}

/* ------------------------------------------------------------------------------------------------
 * The object */

pdde_status pdde_cluster_init(const char *name, pdde_cluster **out) {
    if (!out) return PDDE_ERR_INVALID_ARG;
    *out = calloc(1, sizeof **out);
    if (!*out) return PDDE_ERR_OOM;
    snprintf((*out)->name, sizeof (*out)->name, "%s", name ? name : "");
    return PDDE_OK;
}

void pdde_cluster_free(pdde_cluster *c) {
    if (!c) return;
    for (int i = 0; i < c->n_machines; i++) free(c->machines[i].devices);
    free(c->specs), free(c->machines), free(c->links), free(c->calibs);
    free(c);
}

/* Appends one element of size sz to *arr holding *n; the new index or PDDE_ERR_OOM. */
static int cluster_append(void **arr, int *n, size_t sz, const void *elem) {
    void *a = realloc(*arr, (size_t)(*n + 1) * sz);
    if (!a) return PDDE_ERR_OOM;
    memcpy((char *)a + (size_t)*n * sz, elem, sz);
    *arr = a;
    return (*n)++;
}

int pdde_cluster_add_spec(pdde_cluster *c, const pdde_device_spec *s) {
    if (!c || !s) return PDDE_ERR_INVALID_ARG;
    return cluster_append((void **)&c->specs, &c->n_specs, sizeof *s, s);
}

int pdde_cluster_add_machine(pdde_cluster *c, const pdde_cluster_machine *m) {
    if (!c || !m || (m->n_devices > 0 && !m->devices)) return PDDE_ERR_INVALID_ARG;
    pdde_cluster_machine copy = *m;
    copy.devices = NULL, copy.n_devices = 0;
    int i = cluster_append((void **)&c->machines, &c->n_machines, sizeof copy, &copy);
    for (int d = 0; i >= 0 && d < m->n_devices; d++)
        if (pdde_cluster_add_device(c, i, &m->devices[d]) < 0) return PDDE_ERR_OOM;
    return i;
}

int pdde_cluster_add_device(pdde_cluster *c, int machine, const pdde_cluster_device *d) {
    if (!c || !d || machine < 0 || machine >= c->n_machines) return PDDE_ERR_INVALID_ARG;
    pdde_cluster_machine *m = &c->machines[machine];
    return cluster_append((void **)&m->devices, &m->n_devices, sizeof *d, d);
}

int pdde_cluster_add_link(pdde_cluster *c, const pdde_cluster_link *l) {
    if (!c || !l) return PDDE_ERR_INVALID_ARG;
    return cluster_append((void **)&c->links, &c->n_links, sizeof *l, l);
}

int pdde_cluster_add_calib(pdde_cluster *c, const pdde_collective_calib *k) {
    if (!c || !k) return PDDE_ERR_INVALID_ARG;
    return cluster_append((void **)&c->calibs, &c->n_calibs, sizeof *k, k);
}

int pdde_cluster_device_count(const pdde_cluster *c) {
    if (!c) return 0;
    int n = 0;
    for (int i = 0; i < c->n_machines; i++) n += c->machines[i].n_devices;
    return n;
}

const pdde_cluster_device *pdde_cluster_find_device(const pdde_cluster *c, int id, int *machine) {
    if (!c) return NULL;
    for (int i = 0; i < c->n_machines; i++)
        for (int d = 0; d < c->machines[i].n_devices; d++)
            if (c->machines[i].devices[d].id == id) {
                if (machine) *machine = i;
                return &c->machines[i].devices[d];
            }
    return NULL;
}

pdde_status pdde_cluster_link_between(const pdde_cluster *c, int a, int b, pdde_cluster_link *out) {
    int ma, mb;
    if (!c || !out) return PDDE_ERR_INVALID_ARG;
    if (!pdde_cluster_find_device(c, a, &ma) || !pdde_cluster_find_device(c, b, &mb)) return PDDE_ERR_NOT_FOUND;
    for (int i = 0; i < c->n_links; i++) {
        const pdde_cluster_link *l = &c->links[i];
        if ((l->a == a && l->b == b) || (l->a == b && l->b == a)) { *out = *l; return PDDE_OK; }
    }
    if (ma == mb) *out = c->machines[ma].intra;
    else { /* leaves one NIC, enters the other: the slower bandwidth, both latencies */
        const pdde_cluster_link *x = &c->machines[ma].nic, *y = &c->machines[mb].nic;
        *out = *x;
        out->bandwidth = x->bandwidth < y->bandwidth ? x->bandwidth : y->bandwidth;
        out->latency = x->latency + y->latency;
    }
    out->a = a, out->b = b;
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Checks (for clusters built in code as much as for loaded ones) */

static int cluster_bad_num(double x) { return !isfinite(x) || x < 0; }

/* The i-th of every link the cluster has, in file order (each machine's intra and nic, then links[]);
 * NULL past the last. A group is shared by all of them: the cost model keys a flow by the group of
 * whichever link carries it. With path, its path there. */
static const pdde_cluster_link *cluster_link_at(const pdde_cluster *c, int i, char *path, size_t n) {
    if (i < 2 * c->n_machines) {
        if (path) snprintf(path, n, "machines[%d].%s", i / 2, i % 2 ? "nic" : "intra");
        return i % 2 ? &c->machines[i / 2].nic : &c->machines[i / 2].intra;
    }
    i -= 2 * c->n_machines;
    if (i >= c->n_links) return NULL;
    if (path) snprintf(path, n, "links[%d]", i);
    return &c->links[i];
}

static pdde_status cluster_check_link(pdde_context *ctx, const pdde_cluster_link *l, const char *path) {
    if ((unsigned)l->kind > PDDE_LINK_NET) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s.kind: unknown link kind %d", path, (int)l->kind);
    if (cluster_bad_num(l->bandwidth)) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s.bandwidth: expected B/s >= 0, got %g", path, l->bandwidth);
    if (cluster_bad_num(l->latency)) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s.latency: expected seconds >= 0, got %g", path, l->latency);
    if (l->group < -1) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s.group: expected -1 (not shared) or a group >= 0, got %d", path, l->group);
    return PDDE_OK;
}

pdde_status pdde_cluster_validate(pdde_context *ctx, const pdde_cluster *c) {
    if (!c) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_cluster_validate: no cluster");
    char path[96];
    for (int s = 0; s < c->n_specs; s++) {
        const pdde_device_spec *sp = &c->specs[s];
        if ((unsigned)sp->kind > PDDE_DEVICE_ACCEL)
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d].kind: unknown device kind %d", s, (int)sp->kind);
        if (cluster_bad_num(sp->peak_flops) || cluster_bad_num(sp->mem_bandwidth))
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d]: peak_flops and mem_bandwidth must be finite and >= 0", s);
        for (int t = 0; t < s; t++)
            if (!strcmp(c->specs[t].name, sp->name))
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d].name: duplicate spec name \"%s\" (also specs[%d])", s, sp->name, t);
        if (sp->n_gemm < 0 || sp->n_gemm > PDDE_CLUSTER_MAX_GEMM)
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d].gemm: expected at most %d points", s, PDDE_CLUSTER_MAX_GEMM);
        for (int i = 0; i < sp->n_gemm; i++) {
            const pdde_gemm_point *g = &sp->gemm[i];
            if (g->m <= 0 || g->n <= 0 || g->k <= 0 || !isfinite(g->flops) || g->flops <= 0 || (unsigned)g->dtype >= PDDE_DTYPE_COUNT)
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d].gemm[%d]: expected m, n, k > 0, a dtype and flops > 0", s, i);
            for (int j = 0; j < i; j++) /* the cost model would take the first figure and ignore the other */
                if (sp->gemm[j].dtype == g->dtype && sp->gemm[j].m == g->m && sp->gemm[j].n == g->n && sp->gemm[j].k == g->k)
                    return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d].gemm[%d]: a second figure for %s m=%lld n=%lld k=%lld (also gemm[%d]); "
                                      "expected one per dtype and shape", s, i, pdde_dtype_name(g->dtype), (long long)g->m, (long long)g->n,
                                      (long long)g->k, j);
        }
        for (int k = 0; k < PDDE_OPCLASS_COUNT; k++) {
            if (sp->n_curve[k] < 0 || sp->n_curve[k] > PDDE_CLUSTER_MAX_CURVE)
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d].curves.%s: expected at most %d points", s, cluster_class_names[k], PDDE_CLUSTER_MAX_CURVE);
            for (int i = 0; i < sp->n_curve[k]; i++) {
                const pdde_curve_point *p = &sp->curve[k][i];
                if (!isfinite(p->bytes) || p->bytes <= 0 || !isfinite(p->seconds) || p->seconds <= 0 ||
                    (i && p->bytes <= sp->curve[k][i - 1].bytes))
                    return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d].curves.%s[%d]: expected bytes > 0 (increasing) and seconds > 0", s, cluster_class_names[k], i);
            }
        }
        for (int k = 0; k < PDDE_OPCLASS_COUNT; k++)
            if (!(sp->contention[k] == 0 || (sp->contention[k] >= 1 && isfinite(sp->contention[k]))))
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "specs[%d].contention.%s: expected a slowdown >= 1 (or 0: not measured), got %g", s,
                                  cluster_class_names[k], sp->contention[k]);
    }
    if (c->n_machines == 0) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "machines: expected at least one machine, got none");
    for (int i = 0; i < c->n_machines; i++) {
        const pdde_cluster_machine *m = &c->machines[i];
        /* (what the reader refuses, refused in clusters built in code too: their files would not load) */
        if (m->id < 0 || m->cores < 0 || m->numa_nodes < 0)
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "machines[%d].%s: expected an integer >= 0, got %d", i,
                              m->id < 0 ? "id" : m->cores < 0 ? "cores" : "numa_nodes", m->id < 0 ? m->id : m->cores < 0 ? m->cores : m->numa_nodes);
        for (int j = 0; j < i; j++)
            if (c->machines[j].id == m->id)
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "machines[%d].id: duplicate machine id %d (also machines[%d])", i, m->id, j);
        if (m->n_devices <= 0) /* it gives no rank, yet its nic would count as one of the links plans cross */
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "machines[%d].devices: expected at least one device on machine %d (\"%s\"), got none", i,
                              m->id, m->name);
        pdde_status st;
        snprintf(path, sizeof path, "machines[%d].intra", i);
        if ((st = cluster_check_link(ctx, &m->intra, path))) return st;
        snprintf(path, sizeof path, "machines[%d].nic", i);
        if ((st = cluster_check_link(ctx, &m->nic, path))) return st;
        for (int d = 0; d < m->n_devices; d++) {
            const pdde_cluster_device *dev = &m->devices[d];
            if (dev->spec < 0 || dev->spec >= c->n_specs)
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "machines[%d].devices[%d].spec: no spec %d", i, d, dev->spec);
            if (dev->id < 0)
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "machines[%d].devices[%d].id: expected an integer >= 0, got %d", i, d, dev->id);
            /* 0 fits nothing: the planner would refuse every plan, far from this file */
            if (dev->memory == 0)
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "machines[%d].devices[%d].memory: expected the bytes device %d can give a training job "
                                  "(> 0), got 0", i, d, dev->id);
            int other = -1;
            const pdde_cluster_device *first = pdde_cluster_find_device(c, dev->id, &other);
            if (first != dev)
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "machines[%d].devices[%d].id: duplicate device id %d (also on machines[%d])", i, d, dev->id, other);
        }
    }
    for (int i = 0; i < c->n_links; i++) {
        const pdde_cluster_link *l = &c->links[i];
        snprintf(path, sizeof path, "links[%d]", i);
        pdde_status st = cluster_check_link(ctx, l, path);
        if (st) return st;
        if (!pdde_cluster_find_device(c, l->a, NULL))
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "links[%d].a: no device with id %d", i, l->a);
        if (!pdde_cluster_find_device(c, l->b, NULL))
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "links[%d].b: no device with id %d", i, l->b);
        if (l->a == l->b)
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "links[%d].b: expected a device other than a (%d): a link joins two devices", i, l->a);
        /* the first link of a pair is the one used: a second would be ignored in silence */
        for (int j = 0; j < i; j++)
            if ((c->links[j].a == l->a && c->links[j].b == l->b) || (c->links[j].a == l->b && c->links[j].b == l->a))
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "links[%d]: a second link between devices %d and %d (also links[%d]); expected one "
                                  "link per pair of devices", i, l->a, l->b, j);
    }
    /* flows on links of one group divide one bandwidth: two figures for it cannot both be true */
    char other[96];
    const pdde_cluster_link *l, *o;
    for (int i = 0; (l = cluster_link_at(c, i, NULL, 0)); i++)
        for (int j = 0; l->group >= 0 && j < i && (o = cluster_link_at(c, j, NULL, 0)); j++)
            if (o->group == l->group) {
                if (o->bandwidth != l->bandwidth) {
                    cluster_link_at(c, i, path, sizeof path), cluster_link_at(c, j, other, sizeof other);
                    return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s.bandwidth: expected %g B/s, the bandwidth of %s in the same group %d "
                                      "(a group's links share one bandwidth), got %g", path, o->bandwidth, other, l->group, l->bandwidth);
                }
                break;
            }
    for (int i = 0; i < c->n_calibs; i++) {
        const pdde_collective_calib *k = &c->calibs[i];
        if ((unsigned)k->op >= PDDE_COLL_COUNT || (unsigned)k->algo > PDDE_ALGO_TWO_LEVEL || k->ranks < 2 ||
            cluster_bad_num(k->latency) || !isfinite(k->bandwidth) || k->bandwidth <= 0)
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "collectives[%d]: expected an op, an algo, ranks >= 2, latency >= 0 and bandwidth > 0", i);
        for (int j = 0; j < i; j++) { /* the first match is the one used */
            const pdde_collective_calib *o = &c->calibs[j];
            if (o->op == k->op && o->algo == k->algo && o->ranks == k->ranks && !o->intra == !k->intra)
                return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "collectives[%d]: a second measurement of %s (%s, %d ranks, %s) (also collectives[%d]); "
                                  "expected one per op, algo, ranks and intra", i, cluster_coll_names[k->op], cluster_algo_names[k->algo], k->ranks,
                                  k->intra ? "within a machine" : "across machines", j);
        }
    }
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * JSON. The reader (cJSON) names the path of every field it rejects; the writer (below, no library)
 * emits every field in one fixed order as cJSON's printer would, whose numbers read back to the same
 * doubles and print the same again: that is what makes save(load(f)) == f for the canonical form. */

/* Integers are exact in a double up to 2^53. */
#define CLUSTER_MAX_INT 9007199254740992.0

typedef struct {
    pdde_context *ctx;
} cluster_reader;

static pdde_status cluster_fail(cluster_reader *r, const char *path, const char *key, const char *what) {
    return pdde_error(r->ctx, PDDE_ERR_CORRUPT, "%s%s%s: %s", path, *path && key ? "." : "", key ? key : "", what);
}

static const cJSON *cluster_get(cluster_reader *r, const cJSON *obj, const char *path, const char *key,
                                const char *expected, pdde_status *st) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) {
        char what[160];
        snprintf(what, sizeof what, "missing (expected %s)", expected);
        *st = cluster_fail(r, path, key, what);
    }
    return v;
}

static pdde_status cluster_get_int(cluster_reader *r, const cJSON *obj, const char *path, const char *key,
                                   const char *expected, double min, int64_t *out) {
    pdde_status st = PDDE_OK;
    const cJSON *v = cluster_get(r, obj, path, key, expected, &st);
    if (st) return st;
    char what[160];
    snprintf(what, sizeof what, "expected %s", expected);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || fabs(v->valuedouble) >= CLUSTER_MAX_INT)
        return cluster_fail(r, path, key, what);
    if (v->valuedouble < min) {
        snprintf(what, sizeof what, "expected %s, got %.17g (below %.17g)", expected, v->valuedouble, min);
        return cluster_fail(r, path, key, what);
    }
    *out = (int64_t)v->valuedouble;
    return PDDE_OK;
}

static pdde_status cluster_get_i32(cluster_reader *r, const cJSON *obj, const char *path, const char *key,
                                   const char *expected, double min, int *out) {
    int64_t v;
    pdde_status st = cluster_get_int(r, obj, path, key, expected, min, &v);
    if (!st && v > INT32_MAX) return cluster_fail(r, path, key, "expected a 32-bit integer");
    if (!st) *out = (int)v;
    return st;
}

static pdde_status cluster_get_num(cluster_reader *r, const cJSON *obj, const char *path, const char *key,
                                   const char *expected, double *out) {
    pdde_status st = PDDE_OK;
    const cJSON *v = cluster_get(r, obj, path, key, expected, &st);
    if (st) return st;
    char what[160];
    snprintf(what, sizeof what, "expected %s", expected);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0) return cluster_fail(r, path, key, what);
    *out = v->valuedouble;
    return PDDE_OK;
}

static pdde_status cluster_get_str(cluster_reader *r, const cJSON *obj, const char *path, const char *key,
                                   char *out, size_t n) {
    pdde_status st = PDDE_OK;
    const cJSON *v = cluster_get(r, obj, path, key, "a string", &st);
    if (st) return st;
    if (!cJSON_IsString(v)) return cluster_fail(r, path, key, "expected a string");
    if (strlen(v->valuestring) >= n) {
        char what[96];
        snprintf(what, sizeof what, "expected a string of at most %zu characters", n - 1);
        return cluster_fail(r, path, key, what);
    }
    memcpy(out, v->valuestring, strlen(v->valuestring) + 1);
    return PDDE_OK;
}

/* A string naming one of names[0..n); *out its index. */
static pdde_status cluster_get_enum(cluster_reader *r, const cJSON *obj, const char *path, const char *key,
                                    const char *what_kind, const char *const *names, int n, int *out) {
    char s[64], expected[200];
    int len = snprintf(expected, sizeof expected, "one of");
    for (int i = 0; i < n; i++) len += snprintf(expected + len, sizeof expected - (size_t)len, "%s %s", i ? "," : "", names[i]);
    pdde_status st = cluster_get_str(r, obj, path, key, s, sizeof s);
    if (st) return st;
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) { *out = i; return PDDE_OK; }
    char what[300];
    snprintf(what, sizeof what, "unknown %s \"%s\" (expected %s)", what_kind, s, expected);
    return cluster_fail(r, path, key, what);
}

static pdde_status cluster_get_array(cluster_reader *r, const cJSON *obj, const char *path, const char *key,
                                     const char *expected, const cJSON **out) {
    pdde_status st = PDDE_OK;
    *out = cluster_get(r, obj, path, key, expected, &st);
    if (st) return st;
    if (!cJSON_IsArray(*out)) {
        char what[160];
        snprintf(what, sizeof what, "expected %s", expected);
        return cluster_fail(r, path, key, what);
    }
    return PDDE_OK;
}

/* PDDE_ERR_CORRUPT naming member e of object o if a member before it has the same key: the reader
 * takes the first and would ignore the other in silence (and a class's curves given twice would be
 * appended past the class's room). */
static pdde_status cluster_dup_key(cluster_reader *r, const cJSON *o, const cJSON *e, const char *path) {
    for (const cJSON *x = o->child; x && x != e; x = x->next)
        if (!strcmp(x->string, e->string)) return cluster_fail(r, path, e->string, "given twice (expected each key once)");
    return PDDE_OK;
}

/* PDDE_ERR_CORRUPT naming a key of object o that is not one of keys (NULL-terminated) and the keys
 * allowed there: cluster files are written by hand, and a misspelt key ("memroy") would silently keep
 * a default and so give a wrong plan. */
static pdde_status cluster_only_keys(cluster_reader *r, const cJSON *o, const char *path, const char *const *keys) {
    const cJSON *e;
    cJSON_ArrayForEach(e, o) {
        int k = 0;
        while (keys[k] && strcmp(e->string, keys[k])) k++;
        if (keys[k]) {
            pdde_status st = cluster_dup_key(r, o, e, path);
            if (st) return st;
            continue;
        }
        char what[256];
        int n = snprintf(what, sizeof what, "unknown key (expected ");
        for (k = 0; keys[k] && n > 0 && n < (int)sizeof what; k++)
            n += snprintf(what + n, sizeof what - (size_t)n, "%s%s", k ? ", " : "", keys[k]);
        if (n > 0 && n < (int)sizeof what) snprintf(what + n, sizeof what - (size_t)n, ")");
        return cluster_fail(r, path, e->string, what);
    }
    return PDDE_OK;
}

static pdde_status cluster_read_link(cluster_reader *r, const cJSON *o, const char *path, int endpoints,
                                     pdde_cluster_link *l) {
    pdde_status st;
    int kind = 0;
    if (!cJSON_IsObject(o)) return cluster_fail(r, path, NULL, "expected an object");
    memset(l, 0, sizeof *l);
    static const char *const with_ends[] = {"a", "b", "kind", "bandwidth", "latency", "group", NULL};
    if ((st = cluster_only_keys(r, o, path, endpoints ? with_ends : with_ends + 2))) return st;
    if (endpoints && ((st = cluster_get_i32(r, o, path, "a", "a device id (an integer)", INT32_MIN, &l->a)) ||
                      (st = cluster_get_i32(r, o, path, "b", "a device id (an integer)", INT32_MIN, &l->b))))
        return st;
    if ((st = cluster_get_enum(r, o, path, "kind", "link kind", cluster_link_names, 4, &kind)) ||
        (st = cluster_get_num(r, o, path, "bandwidth", "B/s as a number >= 0", &l->bandwidth)) ||
        (st = cluster_get_num(r, o, path, "latency", "seconds as a number >= 0", &l->latency)) ||
        (st = cluster_get_i32(r, o, path, "group", "-1 or a shared-link group >= 0", -1, &l->group)))
        return st;
    l->kind = (pdde_link_kind)kind;
    return PDDE_OK;
}

static pdde_status cluster_read_spec(cluster_reader *r, const cJSON *o, const char *path, pdde_device_spec *s) {
    pdde_status st;
    int kind = 0;
    char p[128];
    const cJSON *arr, *curves;
    if (!cJSON_IsObject(o)) return cluster_fail(r, path, NULL, "expected an object");
    memset(s, 0, sizeof *s);
    if ((st = cluster_only_keys(r, o, path, (const char *const[]){"name", "kind", "backend", "peak_flops", "mem_bandwidth", "gemm", "curves",
                                                                   "contention", NULL})))
        return st;
    if ((st = cluster_get_str(r, o, path, "name", s->name, sizeof s->name)) ||
        (st = cluster_get_enum(r, o, path, "kind", "device kind", cluster_kind_names, 3, &kind)) ||
        (st = cluster_get_str(r, o, path, "backend", s->backend, sizeof s->backend)) ||
        (st = cluster_get_num(r, o, path, "peak_flops", "FLOP/s as a number >= 0", &s->peak_flops)) ||
        (st = cluster_get_num(r, o, path, "mem_bandwidth", "B/s as a number >= 0", &s->mem_bandwidth)) ||
        (st = cluster_get_array(r, o, path, "gemm", "an array of measured GEMM shapes", &arr)))
        return st;
    s->kind = (pdde_device_kind)kind;
    if (cJSON_GetArraySize(arr) > PDDE_CLUSTER_MAX_GEMM) {
        snprintf(p, sizeof p, "expected at most %d points", PDDE_CLUSTER_MAX_GEMM);
        return cluster_fail(r, path, "gemm", p);
    }
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        pdde_gemm_point *g = &s->gemm[s->n_gemm];
        int dt = 0;
        snprintf(p, sizeof p, "%s.gemm[%d]", path, s->n_gemm);
        if (!cJSON_IsObject(e)) return cluster_fail(r, p, NULL, "expected an object");
        if ((st = cluster_only_keys(r, e, p, (const char *const[]){"dtype", "m", "n", "k", "flops", NULL})) ||
            (st = cluster_get_enum(r, e, p, "dtype", "dtype", (const char *const[]){"f32", "f16", "bf16", "i32", "i64"}, PDDE_DTYPE_COUNT, &dt)) ||
            (st = cluster_get_int(r, e, p, "m", "an integer >= 1", 1, &g->m)) ||
            (st = cluster_get_int(r, e, p, "n", "an integer >= 1", 1, &g->n)) ||
            (st = cluster_get_int(r, e, p, "k", "an integer >= 1", 1, &g->k)) ||
            (st = cluster_get_num(r, e, p, "flops", "FLOP/s as a number > 0", &g->flops)))
            return st;
        if (g->flops <= 0) return cluster_fail(r, p, "flops", "expected FLOP/s as a number > 0");
        g->dtype = (pdde_dtype)dt;
        s->n_gemm++;
    }
    pdde_status st2 = PDDE_OK;
    if (!(curves = cluster_get(r, o, path, "curves", "an object of op-class curves", &st2))) return st2;
    if (!cJSON_IsObject(curves)) return cluster_fail(r, path, "curves", "expected an object of op-class curves");
    cJSON_ArrayForEach(e, curves) {
        int k = 1;
        while (k < PDDE_OPCLASS_COUNT && strcmp(e->string, cluster_class_names[k])) k++;
        snprintf(p, sizeof p, "%s.curves", path);
        if (k == PDDE_OPCLASS_COUNT) {
            char what[160];
            snprintf(what, sizeof what, "unknown op class (expected elementwise, row, attention, embedding or optimizer)");
            return cluster_fail(r, p, e->string, what);
        }
        if ((st = cluster_dup_key(r, curves, e, p))) return st;
        snprintf(p, sizeof p, "%s.curves.%s", path, e->string);
        if (!cJSON_IsArray(e)) return cluster_fail(r, p, NULL, "expected an array of [bytes, seconds] pairs");
        if (cJSON_GetArraySize(e) > PDDE_CLUSTER_MAX_CURVE) return cluster_fail(r, p, NULL, "too many points");
        const cJSON *pt;
        cJSON_ArrayForEach(pt, e) {
            int i = s->n_curve[k];
            const cJSON *b = cJSON_GetArrayItem(pt, 0), *t = cJSON_GetArrayItem(pt, 1);
            if (!cJSON_IsArray(pt) || cJSON_GetArraySize(pt) != 2 || !cJSON_IsNumber(b) || !cJSON_IsNumber(t) ||
                !(b->valuedouble > 0) || !(t->valuedouble > 0) || !isfinite(b->valuedouble) || !isfinite(t->valuedouble)) {
                snprintf(p, sizeof p, "%s.curves.%s[%d]", path, e->string, i);
                return cluster_fail(r, p, NULL, "expected [bytes > 0, seconds > 0]");
            }
            if (i && b->valuedouble <= s->curve[k][i - 1].bytes) {
                snprintf(p, sizeof p, "%s.curves.%s[%d]", path, e->string, i);
                return cluster_fail(r, p, NULL, "expected bytes increasing along the curve");
            }
            s->curve[k][i] = (pdde_curve_point){b->valuedouble, t->valuedouble};
            s->n_curve[k]++;
        }
    }
    return PDDE_OK;
}

/* A spec's optional "contention": {class: slowdown >= 1, ...} (pdde-bench: each class's time with a
 * copy on every core over its time alone); absent in files from before it: 0, not measured. */
static pdde_status cluster_read_contention(cluster_reader *r, const cJSON *o, const char *path, pdde_device_spec *s) {
    const cJSON *obj = cJSON_GetObjectItemCaseSensitive(o, "contention"), *e;
    char p[160];
    if (!obj) return PDDE_OK;
    if (!cJSON_IsObject(obj)) return cluster_fail(r, path, "contention", "expected an object of op-class slowdowns");
    snprintf(p, sizeof p, "%s.contention", path);
    cJSON_ArrayForEach(e, obj) {
        int k = 0;
        while (k < PDDE_OPCLASS_COUNT && strcmp(e->string, cluster_class_names[k])) k++;
        if (k == PDDE_OPCLASS_COUNT) return cluster_fail(r, p, e->string, "unknown op class (expected gemm, elementwise, row, ...)");
        pdde_status st = cluster_dup_key(r, obj, e, p);
        if (st) return st;
        if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || e->valuedouble < 1)
            return cluster_fail(r, p, e->string, "expected a slowdown as a number >= 1");
        s->contention[k] = e->valuedouble;
    }
    return PDDE_OK;
}

static pdde_status cluster_read_machine(cluster_reader *r, const cJSON *o, const char *path, pdde_cluster *c,
                                        pdde_cluster_machine *m) {
    pdde_status st;
    int64_t v;
    char p[128];
    const cJSON *devs;
    if (!cJSON_IsObject(o)) return cluster_fail(r, path, NULL, "expected an object");
    memset(m, 0, sizeof *m);
    if ((st = cluster_only_keys(r, o, path, (const char *const[]){"id", "name", "cores", "numa_nodes", "host_memory", "l3_cache", "intra",
                                                                   "nic", "devices", NULL})) ||
        (st = cluster_get_i32(r, o, path, "id", "an integer >= 0", 0, &m->id)) ||
        (st = cluster_get_str(r, o, path, "name", m->name, sizeof m->name)) ||
        (st = cluster_get_i32(r, o, path, "cores", "an integer >= 0", 0, &m->cores)) ||
        (st = cluster_get_i32(r, o, path, "numa_nodes", "an integer >= 0", 0, &m->numa_nodes)))
        return st;
    if ((st = cluster_get_int(r, o, path, "host_memory", "bytes as an integer", 0, &v))) return st;
    m->host_memory = (uint64_t)v;
    if ((st = cluster_get_int(r, o, path, "l3_cache", "bytes as an integer", 0, &v))) return st;
    m->l3_cache = (uint64_t)v;
    const cJSON *link;
    snprintf(p, sizeof p, "%s.intra", path);
    if (!(link = cluster_get(r, o, path, "intra", "the link between its devices", &st)) ||
        (st = cluster_read_link(r, link, p, 0, &m->intra)))
        return st;
    snprintf(p, sizeof p, "%s.nic", path);
    if (!(link = cluster_get(r, o, path, "nic", "the link to other machines", &st)) ||
        (st = cluster_read_link(r, link, p, 0, &m->nic)))
        return st;
    if ((st = cluster_get_array(r, o, path, "devices", "an array of devices", &devs))) return st;
    m->devices = calloc((size_t)cJSON_GetArraySize(devs) + 1, sizeof *m->devices);
    if (!m->devices) return PDDE_ERR_OOM;
    const cJSON *e;
    cJSON_ArrayForEach(e, devs) {
        pdde_cluster_device *d = &m->devices[m->n_devices];
        char spec[64];
        snprintf(p, sizeof p, "%s.devices[%d]", path, m->n_devices);
        if (!cJSON_IsObject(e)) return cluster_fail(r, p, NULL, "expected an object");
        if ((st = cluster_only_keys(r, e, p, (const char *const[]){"id", "spec", "memory", NULL})) ||
            (st = cluster_get_i32(r, e, p, "id", "an integer >= 0", 0, &d->id)) ||
            (st = cluster_get_str(r, e, p, "spec", spec, sizeof spec)) ||
            (st = cluster_get_int(r, e, p, "memory", "bytes as an integer", 0, &v)))
            return st;
        d->memory = (uint64_t)v;
        d->spec = -1;
        for (int s = 0; s < c->n_specs; s++)
            if (!strcmp(c->specs[s].name, spec)) d->spec = s;
        if (d->spec < 0) {
            char what[128];
            snprintf(what, sizeof what, "no spec named \"%s\" in specs", spec);
            return cluster_fail(r, p, "spec", what);
        }
        m->n_devices++;
    }
    return PDDE_OK;
}

static pdde_status cluster_read(cluster_reader *r, const cJSON *root, pdde_cluster *c) {
    pdde_status st;
    char fmt[32], p[64];
    int64_t version;
    const cJSON *arr, *e;
    if (!cJSON_IsObject(root)) return cluster_fail(r, "(top level)", NULL, "expected an object");
    if ((st = cluster_only_keys(r, root, "", (const char *const[]){"format", "version", "name", "specs", "machines", "links", "collectives",
                                                                   NULL})))
        return st;
    if ((st = cluster_get_str(r, root, "", "format", fmt, sizeof fmt))) return st;
    if (strcmp(fmt, "pdde-cluster")) return cluster_fail(r, "", "format", "expected \"pdde-cluster\"");
    if ((st = cluster_get_int(r, root, "", "version", "1", 1, &version))) return st;
    if (version != 1) return pdde_error(r->ctx, PDDE_ERR_VERSION, "version: cluster format version %lld (this build reads 1)", (long long)version);
    if ((st = cluster_get_str(r, root, "", "name", c->name, sizeof c->name))) return st;
    if ((st = cluster_get_array(r, root, "", "specs", "an array of device specs", &arr))) return st;
    cJSON_ArrayForEach(e, arr) {
        pdde_device_spec s;
        snprintf(p, sizeof p, "specs[%d]", c->n_specs);
        if ((st = cluster_read_spec(r, e, p, &s)) || (st = cluster_read_contention(r, e, p, &s))) return st;
        for (int t = 0; t < c->n_specs; t++)
            if (!strcmp(c->specs[t].name, s.name)) return cluster_fail(r, p, "name", "duplicate spec name");
        if (pdde_cluster_add_spec(c, &s) < 0) return PDDE_ERR_OOM;
    }
    if ((st = cluster_get_array(r, root, "", "machines", "an array of machines", &arr))) return st;
    cJSON_ArrayForEach(e, arr) {
        pdde_cluster_machine m = {0};
        snprintf(p, sizeof p, "machines[%d]", c->n_machines);
        st = cluster_read_machine(r, e, p, c, &m);
        if (!st && cluster_append((void **)&c->machines, &c->n_machines, sizeof m, &m) < 0) st = PDDE_ERR_OOM;
        if (st) { free(m.devices); return st; }
    }
    if ((st = cluster_get_array(r, root, "", "links", "an array of links", &arr))) return st;
    cJSON_ArrayForEach(e, arr) {
        pdde_cluster_link l;
        snprintf(p, sizeof p, "links[%d]", c->n_links);
        if ((st = cluster_read_link(r, e, p, 1, &l))) return st;
        if (pdde_cluster_add_link(c, &l) < 0) return PDDE_ERR_OOM;
    }
    if ((st = cluster_get_array(r, root, "", "collectives", "an array of collective calibrations", &arr))) return st;
    cJSON_ArrayForEach(e, arr) {
        pdde_collective_calib k = {0};
        int op = 0, algo = 0;
        snprintf(p, sizeof p, "collectives[%d]", c->n_calibs);
        if (!cJSON_IsObject(e)) return cluster_fail(r, p, NULL, "expected an object");
        if ((st = cluster_only_keys(r, e, p, (const char *const[]){"op", "algo", "ranks", "intra", "latency", "bandwidth", NULL}))) return st;
        const cJSON *intra = cJSON_GetObjectItemCaseSensitive(e, "intra");
        if ((st = cluster_get_enum(r, e, p, "op", "collective", cluster_coll_names, PDDE_COLL_COUNT, &op)) ||
            (st = cluster_get_enum(r, e, p, "algo", "algorithm", cluster_algo_names, 4, &algo)) ||
            (st = cluster_get_i32(r, e, p, "ranks", "an integer >= 2", 2, &k.ranks)))
            return st;
        if (!cJSON_IsBool(intra)) return cluster_fail(r, p, "intra", "expected true (within a machine) or false");
        if ((st = cluster_get_num(r, e, p, "latency", "seconds as a number >= 0", &k.latency)) ||
            (st = cluster_get_num(r, e, p, "bandwidth", "B/s as a number > 0", &k.bandwidth)))
            return st;
        if (k.bandwidth <= 0) return cluster_fail(r, p, "bandwidth", "expected B/s as a number > 0");
        k.op = (pdde_collective)op, k.algo = (pdde_comm_algo)algo, k.intra = cJSON_IsTrue(intra);
        if (pdde_cluster_add_calib(c, &k) < 0) return PDDE_ERR_OOM;
    }
    /* what the JSON types cannot say: ids unique, links to devices that exist */
    st = pdde_cluster_validate(r->ctx, c);
    return st ? PDDE_ERR_CORRUPT : PDDE_OK;
}

pdde_status pdde_cluster_parse(pdde_context *ctx, const char *json, pdde_cluster **out) {
    if (!json || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_cluster_parse: no %s", json ? "out" : "JSON text");
    *out = NULL;
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        long off = at && at >= json ? (long)(at - json) : -1;
        int line = 1;
        for (long i = 0; i < off; i++) line += json[i] == '\n';
        return pdde_error(ctx, PDDE_ERR_CORRUPT, "cluster JSON: syntax error at line %d (byte %ld)", line, off);
    }
    pdde_cluster *c;
    pdde_status st = pdde_cluster_init("", &c);
    cluster_reader r = {ctx};
    if (!st) st = cluster_read(&r, root, c);
    cJSON_Delete(root);
    if (st) pdde_cluster_free(c);
    else *out = c;
    return st;
}


/* The writer needs no library: it prints what cJSON_Print (1.7) prints for the same tree, byte for
 * byte (tabs, "key":<tab>value, arrays on one line with ", ", numbers as integers when they equal
 * their int, else %.15g when that reads back within a double's epsilon, else %.17g), so files saved
 * with or without cJSON are the same and the canonical form holds either way. */
typedef struct {
    char *s;
    size_t n, cap;
    int depth, oom;
    int members[64]; /* per open object or array: elements written so far */
    char kind[64];   /* '{' or '[' */
} cluster_json;

static void cj_raw(cluster_json *w, const char *t, size_t len) {
    if (w->oom) return;
    if (w->n + len + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->n + len + 1) cap *= 2;
        char *more = realloc(w->s, cap);
        if (!more) { w->oom = 1; return; }
        w->s = more, w->cap = cap;
    }
    memcpy(w->s + w->n, t, len);
    w->n += len;
    w->s[w->n] = 0;
}
static void cj_str(cluster_json *w, const char *t) { cj_raw(w, t, strlen(t)); }
static void cj_tabs(cluster_json *w, int n) {
    for (int i = 0; i < n; i++) cj_raw(w, "\t", 1);
}
static void cj_quoted(cluster_json *w, const char *t) {
    cj_raw(w, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)t; *p; p++) {
        char esc[8];
        switch (*p) {
        case '"': cj_str(w, "\\\""); break;
        case '\\': cj_str(w, "\\\\"); break;
        case '\b': cj_str(w, "\\b"); break;
        case '\f': cj_str(w, "\\f"); break;
        case '\n': cj_str(w, "\\n"); break;
        case '\r': cj_str(w, "\\r"); break;
        case '\t': cj_str(w, "\\t"); break;
        default:
            if (*p < 32) snprintf(esc, sizeof esc, "\\u%04x", *p), cj_str(w, esc);
            else cj_raw(w, (const char *)p, 1);
        }
    }
    cj_raw(w, "\"", 1);
}
/* Before a value: in an object its key (NULL in an array), with the separator from the one before. */
static void cj_key(cluster_json *w, const char *key) {
    int d = w->depth;
    if (d > 0 && w->members[d - 1]++) cj_str(w, w->kind[d - 1] == '{' ? ",\n" : ", ");
    if (d > 0 && w->kind[d - 1] == '{') cj_tabs(w, d), cj_quoted(w, key), cj_str(w, ":\t");
}
static void cj_open(cluster_json *w, const char *key, char kind) {
    cj_key(w, key);
    cj_raw(w, kind == '{' ? "{\n" : "[", kind == '{' ? 2 : 1);
    if (w->depth < 64) w->members[w->depth] = 0, w->kind[w->depth] = kind;
    w->depth++;
}
static void cj_close(cluster_json *w) {
    w->depth--;
    if (w->kind[w->depth] == '{') {
        if (w->members[w->depth]) cj_str(w, "\n");
        cj_tabs(w, w->depth), cj_str(w, "}");
    } else {
        cj_str(w, "]");
    }
}
static void cj_num(cluster_json *w, const char *key, double d) {
    char b[32];
    int vi = d >= INT_MAX ? INT_MAX : d <= (double)INT_MIN ? INT_MIN : (int)d;
    if (isnan(d) || isinf(d)) snprintf(b, sizeof b, "null");
    else if (d == (double)vi) snprintf(b, sizeof b, "%d", vi);
    else {
        double back = 0;
        snprintf(b, sizeof b, "%1.15g", d);
        double big = fabs(back = strtod(b, NULL)) > fabs(d) ? fabs(back) : fabs(d);
        if (!(fabs(back - d) <= big * DBL_EPSILON)) snprintf(b, sizeof b, "%1.17g", d);
    }
    cj_key(w, key);
    cj_str(w, b);
}
static void cj_string(cluster_json *w, const char *key, const char *v) { cj_key(w, key), cj_quoted(w, v); }

static void cluster_write_link(cluster_json *w, const char *key, const pdde_cluster_link *l, int endpoints) {
    cj_open(w, key, '{');
    if (endpoints) cj_num(w, "a", l->a), cj_num(w, "b", l->b);
    cj_string(w, "kind", pdde_link_kind_name(l->kind));
    cj_num(w, "bandwidth", l->bandwidth);
    cj_num(w, "latency", l->latency);
    cj_num(w, "group", l->group);
    cj_close(w);
}

static void cluster_write(cluster_json *w, const pdde_cluster *c) {
    cj_open(w, NULL, '{');
    cj_string(w, "format", "pdde-cluster");
    cj_num(w, "version", 1);
    cj_string(w, "name", c->name);
    cj_open(w, "specs", '[');
    for (int s = 0; s < c->n_specs; s++) {
        const pdde_device_spec *sp = &c->specs[s];
        cj_open(w, NULL, '{');
        cj_string(w, "name", sp->name);
        cj_string(w, "kind", cluster_kind_names[sp->kind]);
        cj_string(w, "backend", sp->backend);
        cj_num(w, "peak_flops", sp->peak_flops);
        cj_num(w, "mem_bandwidth", sp->mem_bandwidth);
        cj_open(w, "gemm", '[');
        for (int i = 0; i < sp->n_gemm; i++) {
            cj_open(w, NULL, '{');
            cj_string(w, "dtype", pdde_dtype_name(sp->gemm[i].dtype));
            cj_num(w, "m", (double)sp->gemm[i].m);
            cj_num(w, "n", (double)sp->gemm[i].n);
            cj_num(w, "k", (double)sp->gemm[i].k);
            cj_num(w, "flops", sp->gemm[i].flops);
            cj_close(w);
        }
        cj_close(w);
        cj_open(w, "curves", '{');
        for (int k = 1; k < PDDE_OPCLASS_COUNT; k++) {
            if (!sp->n_curve[k]) continue;
            cj_open(w, cluster_class_names[k], '[');
            for (int i = 0; i < sp->n_curve[k]; i++) {
                cj_open(w, NULL, '[');
                cj_num(w, NULL, sp->curve[k][i].bytes), cj_num(w, NULL, sp->curve[k][i].seconds);
                cj_close(w);
            }
            cj_close(w);
        }
        cj_close(w);
        int any = 0; /* contention figures, where it has any (so files without them save as they were) */
        for (int k = 0; k < PDDE_OPCLASS_COUNT; k++) any |= sp->contention[k] > 0;
        if (any) {
            cj_open(w, "contention", '{');
            for (int k = 0; k < PDDE_OPCLASS_COUNT; k++)
                if (sp->contention[k] > 0) cj_num(w, cluster_class_names[k], sp->contention[k]);
            cj_close(w);
        }
        cj_close(w);
    }
    cj_close(w);
    cj_open(w, "machines", '[');
    for (int i = 0; i < c->n_machines; i++) {
        const pdde_cluster_machine *m = &c->machines[i];
        cj_open(w, NULL, '{');
        cj_num(w, "id", m->id);
        cj_string(w, "name", m->name);
        cj_num(w, "cores", m->cores);
        cj_num(w, "numa_nodes", m->numa_nodes);
        cj_num(w, "host_memory", (double)m->host_memory);
        cj_num(w, "l3_cache", (double)m->l3_cache);
        cluster_write_link(w, "intra", &m->intra, 0);
        cluster_write_link(w, "nic", &m->nic, 0);
        cj_open(w, "devices", '[');
        for (int d = 0; d < m->n_devices; d++) {
            cj_open(w, NULL, '{');
            cj_num(w, "id", m->devices[d].id);
            cj_string(w, "spec", c->specs[m->devices[d].spec].name);
            cj_num(w, "memory", (double)m->devices[d].memory);
            cj_close(w);
        }
        cj_close(w);
        cj_close(w);
    }
    cj_close(w);
    cj_open(w, "links", '[');
    for (int i = 0; i < c->n_links; i++) cluster_write_link(w, NULL, &c->links[i], 1);
    cj_close(w);
    cj_open(w, "collectives", '[');
    for (int i = 0; i < c->n_calibs; i++) {
        const pdde_collective_calib *k = &c->calibs[i];
        cj_open(w, NULL, '{');
        cj_string(w, "op", cluster_coll_names[k->op]);
        cj_string(w, "algo", cluster_algo_names[k->algo]);
        cj_num(w, "ranks", k->ranks);
        cj_key(w, "intra"), cj_str(w, k->intra ? "true" : "false");
        cj_num(w, "latency", k->latency);
        cj_num(w, "bandwidth", k->bandwidth);
        cj_close(w);
    }
    cj_close(w);
    cj_close(w);
    cj_str(w, "\n");
}

pdde_status pdde_cluster_to_json(pdde_context *ctx, const pdde_cluster *c, char **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_cluster_to_json: no out");
    *out = NULL;
    pdde_status st = pdde_cluster_validate(ctx, c);
    if (st) return st;
    cluster_json w;
    memset(&w, 0, sizeof w);
    cluster_write(&w, c);
    if (w.oom || !w.s) {
        free(w.s);
        return pdde_error(ctx, PDDE_ERR_OOM, "cluster JSON: out of memory");
    }
    *out = w.s;
    return PDDE_OK;
}

pdde_status pdde_cluster_load(pdde_context *ctx, const char *path, pdde_cluster **out) {
    if (!path || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_cluster_load: no %s", path ? "out" : "path");
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return pdde_error(ctx, PDDE_ERR_IO, "%s: %s", path, strerror(errno));
    char *buf = NULL;
    long n = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
    if (n >= 0 && !fseek(f, 0, SEEK_SET) && (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n)
        buf[n] = 0;
    else free(buf), buf = NULL;
    fclose(f);
    if (!buf) return pdde_error(ctx, PDDE_ERR_IO, "%s: cannot read", path);
    pdde_status st = pdde_cluster_parse(ctx, buf, out);
    free(buf);
    if (st && ctx) { /* put the file's name in front of the field path */
        pdde_error(ctx, st, "%s: %s", path, pdde_last_error(ctx));
    }
    return st;
}

pdde_status pdde_cluster_save(pdde_context *ctx, const pdde_cluster *c, const char *path) {
    char *s, tmp[4096];
    if (!path) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_cluster_save: no path");
    pdde_status st = pdde_cluster_to_json(ctx, c, &s);
    if (st) return st;
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    size_t n = strlen(s);
    int ok = f && fwrite(s, 1, n, f) == n;
    if (f && fclose(f)) ok = 0;
    free(s);
    if (!ok || rename(tmp, path)) {
        remove(tmp);
        return pdde_error(ctx, PDDE_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    }
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * This machine */

static void cluster_host_facts(pdde_cluster_machine *m) {
    if (gethostname(m->name, sizeof m->name - 1)) snprintf(m->name, sizeof m->name, "localhost");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) m->host_memory = (uint64_t)pages * (uint64_t)page;
    m->cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    m->numa_nodes = 1;
#ifdef PDDE_HAVE_HWLOC
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) == 0) {
        if (hwloc_topology_load(topo) == 0) {
            int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
            if (n > 0) m->cores = n;
            n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
            if (n > 0) m->numa_nodes = n;
            m->l3_cache = 0;
            for (int i = 0; i < hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_L3CACHE); i++) {
                hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L3CACHE, (unsigned)i);
                if (o && o->attr) m->l3_cache += o->attr->cache.size;
            }
            hwloc_obj_t root = hwloc_get_root_obj(topo);
            if (root && root->total_memory && !m->host_memory) m->host_memory = root->total_memory; /* (hwloc's NUMA nodes can miss a VM's hot-plugged memory) */
        }
        hwloc_topology_destroy(topo);
    }
#endif
}

pdde_status pdde_cluster_detect(pdde_context *ctx, pdde_cluster **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_cluster_detect: no out");
    pdde_cluster *c;
    pdde_status st = pdde_cluster_init("detected", &c);
    if (st) return pdde_error(ctx, st, "cluster: out of memory");
    pdde_cluster_machine m = {0};
    cluster_host_facts(&m);
    /* rates unknown (0) until pdde-bench measures them */
    m.intra = (pdde_cluster_link){-1, -1, PDDE_LINK_SHM, 0, 0, -1};
    m.nic = (pdde_cluster_link){-1, -1, PDDE_LINK_NET, 0, 0, -1};
    int mi = pdde_cluster_add_machine(c, &m);
    for (int d = 0; mi >= 0 && d < pdde_device_count(ctx); d++) {
        pdde_device_props p;
        if ((st = pdde_device_get_props(ctx, d, &p))) break;
        pdde_device_spec sp;
        memset(&sp, 0, sizeof sp);
        sp.kind = p.kind;
        snprintf(sp.name, sizeof sp.name, "%.15s:%.47s", p.backend, p.name);
        snprintf(sp.backend, sizeof sp.backend, "%s", p.backend);
        sp.peak_flops = p.peak_flops_f32, sp.mem_bandwidth = p.mem_bandwidth;
        int s = 0;
        while (s < c->n_specs && strcmp(c->specs[s].name, sp.name)) s++;
        if (s == c->n_specs && (s = pdde_cluster_add_spec(c, &sp)) < 0) { st = PDDE_ERR_OOM; break; }
        pdde_cluster_device dev = {d, s, p.memory_free ? p.memory_free : p.memory_total};
        if (p.kind == PDDE_DEVICE_CPU && !dev.memory) dev.memory = m.host_memory;
        if (pdde_cluster_add_device(c, mi, &dev) < 0) { st = PDDE_ERR_OOM; break; }
        /* a device off the host reaches host memory over its bus (PoCL's "device" is host memory) */
        if (p.kind != PDDE_DEVICE_CPU && d > 0) {
            pdde_cluster_link l = {0, d, PDDE_LINK_PCIE, 0, 0, -1};
            if (pdde_cluster_add_link(c, &l) < 0) { st = PDDE_ERR_OOM; break; }
        }
    }
    if (mi < 0) st = PDDE_ERR_OOM;
    if (st) {
        pdde_cluster_free(c);
        return st == PDDE_ERR_OOM ? pdde_error(ctx, st, "cluster: out of memory") : st;
    }
    *out = c;
    return PDDE_OK;
}
