/* test_reshard — every reshard conversion of the SPMD executor on meshes [2], [4] and [2,2], through
 * the public path: inputs annotated with pdde_shard, an op whose SPMD rule requires another layout of
 * them, pdde_complete_dist_attrs, and a session on forked rank processes. Each case checks which reshard nodes
 * the session inserted and that every rank's block of the result equals the same graph run whole in
 * one process (shapes with odd unsplit dims and splits on inner dims, so blocks are packed).
 *
 *   allreduce sum / avg  relu(sum or mean of U over its split dim 0)   partial -> replicated
 *   reduce_scatter       sum(U) + Z, Z split on dim j                  partial -> split on j
 *   allgather            slice(X) over the whole of its split dim i    split on i -> replicated
 *   alltoall             X + Z: Z follows X                            split on j -> split on i
 *   slice                Z + R, R replicated                           replicated -> split on j
 *   to partial           relu(R + sum(U))                              replicated -> partial, reduced
 *   swap ([2,2])         X + Z, X split i over a and j over b, Z the other way round */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    printf("SKIP ucx: pdde was built without comm (no UCX)\n0 passed, 0 failed, 1 skipped\n");
    return 0;
}
#else
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include <stdbool.h>
#include <stdint.h>

typedef enum { ALLREDUCE_SUM, ALLREDUCE_AVG, REDUCE_SCATTER, ALLGATHER, ALLTOALL, SLICE, TO_PARTIAL, SWAP, N_CONVERSIONS } conversion;
static const char *const conv_names[N_CONVERSIONS] = {"allreduce sum", "allreduce avg", "reduce_scatter", "allgather",
                                                     "alltoall", "slice", "to partial", "swap"};
/* the reshard nodes each conversion must insert, in schedule order */
static const char *const conv_nodes[N_CONVERSIONS] = {"allreduce", "allreduce", "reduce_scatter", "allgather",
                                                     "alltoall", "slice", "scale allreduce", "allgather alltoall slice"};

/* A tensor shape and the dims the conversions move a split between (i, j); `other` is split over the
 * second axis of a 2-d mesh throughout (-1 on a 1-d mesh). */
typedef struct { int ndim; int64_t shape[4]; int i, j, other; } shape_case;

typedef struct {
    int ndim, shape[2];
    const shape_case *shapes;
    int n_shapes;
} mesh_case;

static const shape_case shapes_1d[] = {
    {3, {3, 4, 8}, 2, 1, -1},    /* the alltoall (j -> i) packs what it sends and unpacks what it receives */
    {3, {8, 5, 4}, 0, 2, -1},    /* it sends blocks along dim 0: contiguous, no packing */
    {4, {4, 3, 1, 8}, 3, 0, -1}, /* it receives blocks along dim 0: no unpacking */
};
static const shape_case shapes_2d[] = {
    {3, {2, 6, 4}, 2, 1, 0},
    {4, {4, 3, 2, 6}, 0, 3, 2},
};
/* 3 ranks: splits of 3, 6 and 9 next to odd whole dims (5, 7), packed on inner dims */
static const shape_case shapes_3[] = {
    {3, {3, 5, 6}, 2, 0, -1},
    {3, {7, 9, 3}, 1, 2, -1},
};
static const mesh_case meshes[] = {
    {1, {2}, shapes_1d, 3},
    {1, {3}, shapes_3, 2},
    {1, {4}, shapes_1d, 3},
    {2, {2, 2}, shapes_2d, 2},
};
static bool as_params; /* the inputs are parameters, and a backward and an SGD step follow */

static void fill(float *x, int64_t n, int seed) {
    for (int64_t k = 0; k < n; k++) x[k] = sinf(0.37f * (float)k + 1.3f * (float)seed) + 0.1f * (float)(k % 5) - 0.2f;
}

/* An input; annotated with map on mesh (when there is one). */
static pdde_tensor *input(pdde_graph *g, const pdde_mesh *mesh, const char *name, int ndim, const int64_t *shape, const int *map) {
    pdde_tensor *t = as_params ? pdde_param(g, name, ndim, shape, 0.0f) : pdde_input(g, name, PDDE_F32, ndim, shape);
    if (mesh) pdde_shard(g, t, mesh, map);
    return t;
}

/* Builds the case's graph (mesh NULL: the one-process reference) and returns its output. Axis a, of
 * size n, is the one the conversion works on; b is the other one (-1 on a 1-d mesh). */
static pdde_tensor *build(pdde_graph *g, const pdde_mesh *mesh, conversion c, const shape_case *sc, int a, int n, int b) {
    int nd = sc->ndim, base[PDDE_MAX_DIMS], xmap[PDDE_MAX_DIMS], zmap[PDDE_MAX_DIMS], umap[PDDE_MAX_DIMS];
    for (int d = 0; d < PDDE_MAX_DIMS; d++) base[d] = -1;
    if (b >= 0 && c != SWAP) base[sc->other] = b;
    memcpy(xmap, base, sizeof base), memcpy(zmap, base, sizeof base);
    xmap[sc->i] = a, zmap[sc->j] = a;
    if (c == SWAP) xmap[sc->j] = b, zmap[sc->i] = b;
    /* U [2n, shape...] split on dim 0 over a: its sum over dim 0 is partial over a */
    int64_t ushape[PDDE_MAX_DIMS] = {2 * n};
    memcpy(ushape + 1, sc->shape, (size_t)nd * sizeof *ushape);
    umap[0] = a;
    memcpy(umap + 1, base, (size_t)nd * sizeof *umap);
    pdde_tensor *x = input(g, mesh, "x", nd, sc->shape, xmap), *z = input(g, mesh, "z", nd, sc->shape, zmap);
    pdde_tensor *r = input(g, mesh, "r", nd, sc->shape, base), *u = input(g, mesh, "u", nd + 1, ushape, umap);
    switch (c) {
    case ALLREDUCE_SUM: return pdde_relu(g, pdde_sum(g, u, 0, 0));
    case ALLREDUCE_AVG: return pdde_relu(g, pdde_mean(g, u, 0, 0));
    case REDUCE_SCATTER: return pdde_add(g, pdde_sum(g, u, 0, 0), z);
    case ALLGATHER: return pdde_slice(g, x, sc->i, 0, sc->shape[sc->i]);
    case ALLTOALL: case SWAP: return pdde_add(g, x, z);
    case SLICE: return pdde_add(g, z, r);
    default: return pdde_relu(g, pdde_add(g, r, pdde_sum(g, u, 0, 0))); /* TO_PARTIAL */
    }
}

static const char *const input_names[4] = {"x", "z", "r", "u"};

/* Whether a node of g reads t (a case leaves some of its four inputs unused, out of the schedule). */
static bool used(pdde_graph *g, const pdde_tensor *t) {
    for (int i = 0; i < pdde_graph_tensor_count(g); i++)
        for (int k = 0; k < pdde_graph_tensor(g, i)->nsrc; k++)
            if (pdde_graph_tensor(g, i)->src[k] == t) return true;
    return false;
}

/* The global index of element k of t's local block (t->shape local, gshape global) at mesh coords. */
static int64_t global_index(const pdde_tensor *t, const int64_t *gshape, const int *coords, int64_t k) {
    int64_t idx = 0, stride = pdde_tensor_numel(t);
    for (int d = 0; d < t->ndim; d++) {
        stride /= t->shape[d];
        int64_t i = k / stride % t->shape[d];
        int ax = t->dist.dims_mapping[d];
        idx = idx * gshape[d] + i + (ax >= 0 ? coords[ax] * t->shape[d] : 0);
    }
    return idx;
}

/* Writes the inputs of s's graph g from their global data (shapes from the reference graph ref),
 * runs the forward and reads out (local block) into result. */
static pdde_status run(pdde_session *s, pdde_graph *g, pdde_graph *ref, pdde_tensor *out, float *result) {
    pdde_status st = PDDE_OK;
    for (int k = 0; k < 4 && !st; k++) {
        const pdde_tensor *whole = pdde_graph_find(ref, input_names[k]);
        if (!used(ref, whole)) continue;
        size_t bytes = pdde_tensor_nbytes(whole);
        float *buf = malloc(bytes);
        if (!buf) return PDDE_ERR_OOM;
        fill(buf, pdde_tensor_numel(whole), k);
        st = pdde_session_write_global(s, pdde_graph_find(g, input_names[k]), buf, bytes);
        free(buf);
    }
    if (!st && as_params) { /* loss = sum(out * w): every conversion's backward, then x -= dx */
        const pdde_tensor *whole = pdde_graph_find(ref, "w");
        size_t bytes = pdde_tensor_nbytes(whole);
        float *buf = malloc(bytes);
        if (!buf) return PDDE_ERR_OOM;
        fill(buf, pdde_tensor_numel(whole), 9);
        st = pdde_session_write_global(s, pdde_graph_find(g, "w"), buf, bytes);
        free(buf);
        if (!st) st = pdde_session_run(s, PDDE_RUN_STEP);
        return st;
    }
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s, out, result, pdde_tensor_nbytes(pdde_session_tensor(s, out))); /* (this rank's block) */
    return st;
}

/* The parameters after one SGD step (lr 1) of loss = sum(out * w) from the same values, on this rank
 * against one process: the gradients crossed every reshard backwards (allgather <-> reduce-scatter
 * or slice, alltoall back, partial sums reduced) and the replicated ones were reduced. */
static void check_backward(pdde_context *ctx, pdde_comm *comm, const mesh_case *mc, conversion c, const shape_case *sc, int a) {
    int b = mc->ndim == 2 ? 1 - a : -1;
    char what[160];
    snprintf(what, sizeof what, "backward: mesh [%d%s%.0d] %s over axis %d, shape %dd", mc->shape[0], mc->ndim == 2 ? "," : "",
             mc->ndim == 2 ? mc->shape[1] : 0, conv_names[c], a, sc->ndim);
    pdde_graph *gs[2];
    pdde_session *ss[2] = {NULL, NULL};
    pdde_status st = PDDE_OK;
    as_params = true;
    for (int k = 0; k < 2 && !st; k++) { /* 0: one process, 1: on the mesh */
        pdde_graph_init(ctx, &gs[k]);
        const pdde_mesh *mesh = k ? pdde_mesh_create(gs[k], mc->ndim, mc->shape, (const char *[]){"a0", "a1"}, NULL) : NULL;
        pdde_tensor *out = build(gs[k], mesh, c, sc, a, mc->shape[a], b);
        pdde_tensor *w = out ? pdde_input(gs[k], "w", PDDE_F32, out->ndim, out->shape) : NULL;
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        op.lr = 1.0f;
        st = pdde_graph_status(gs[k]);
        if (!st) st = pdde_backward(gs[k], pdde_sum(gs[k], pdde_mul(gs[k], out, w), -1, 0));
        if (!st) st = pdde_optimizer_sgd(gs[k], &op);
        if (!st && k) st = pdde_complete_dist_attrs(gs[k]);
        pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
        sp.world = k ? comm : NULL;
        if (!st) st = pdde_session_init(gs[k], &sp, &ss[k]);
    }
    for (int k = 0; k < 2 && !st; k++) st = run(ss[k], gs[k], gs[0], NULL, NULL);
    CHECK(!st, "%s: %s", what, pdde_last_error(ctx));
    int coords[2] = {0, 0}, n_params = 0;
    for (int i = 0; i < 4 && !st; i++) {
        pdde_tensor *rt = pdde_graph_find(gs[0], input_names[i]), *t = pdde_graph_find(gs[1], input_names[i]);
        if (!used(gs[0], rt)) continue;
        float *want = malloc(pdde_tensor_nbytes(rt)), *got = malloc(pdde_tensor_nbytes(rt)), *exp = malloc(pdde_tensor_nbytes(rt));
        pdde_session_read(ss[0], rt, want, pdde_tensor_nbytes(rt));
        const pdde_tensor *lt = pdde_session_tensor(ss[1], t); /* this rank's block (the graph keeps global shapes) */
        CHECK(pdde_session_read(ss[1], t, got, pdde_tensor_nbytes(lt)) == PDDE_OK, "%s: read %s: %s", what, input_names[i], pdde_last_error(ctx));
        if (lt->dist.mesh) pdde_mesh_coords(lt->dist.mesh, pdde_comm_rank(comm), coords);
        for (int64_t k = 0; k < pdde_tensor_numel(lt); k++) exp[k] = want[global_index(lt, rt->shape, coords, k)];
        char label[200];
        snprintf(label, sizeof label, "%s: %s after one step, rank %d", what, input_names[i], pdde_comm_rank(comm));
        test_close_all(label, got, exp, (size_t)pdde_tensor_numel(lt), 1, 1e-6);
        n_params++;
        free(want), free(got), free(exp);
    }
    CHECK(st || n_params > 0, "%s: no parameter compared", what);
    as_params = false;
    for (int k = 0; k < 2; k++) pdde_session_free(ss[k]), pdde_graph_free(gs[k]);
}

/* One case on this rank: the reference in one process, then the SPMD run on comm, its collectives
 * communicating in comm_dtype (bf16: a cast on each side, results within bf16's rounding). */
static void run_case(pdde_context *ctx, pdde_comm *comm, const mesh_case *mc, conversion c, const shape_case *sc, int a,
                     pdde_dtype comm_dtype) {
    int b = mc->ndim == 2 ? 1 - a : -1;
    char what[160];
    snprintf(what, sizeof what, "mesh [%d%s%.0d] %s over axis %d, shape %dd (i %d, j %d)%s", mc->shape[0], mc->ndim == 2 ? "," : "",
             mc->ndim == 2 ? mc->shape[1] : 0, conv_names[c], a, sc->ndim, sc->i, sc->j, comm_dtype == PDDE_BF16 ? " in bf16" : "");
    pdde_graph *ref, *g;
    pdde_session *rs = NULL, *s = NULL;
    pdde_graph_init(ctx, &ref), pdde_graph_init(ctx, &g);
    pdde_tensor *rout = build(ref, NULL, c, sc, a, mc->shape[a], b);
    const pdde_mesh *mesh = pdde_mesh_create(g, mc->ndim, mc->shape, (const char *[]){"a0", "a1"}, NULL);
    pdde_tensor *out = build(g, mesh, c, sc, a, mc->shape[a], b);
    pdde_mark_output(rout), pdde_mark_output(out);
    pdde_status st = pdde_graph_status(ref) ? pdde_graph_status(ref) : pdde_graph_status(g);
    if (!st) st = pdde_complete_dist_attrs(g);
    int n_graph = pdde_graph_tensor_count(g);
    int64_t gshape[PDDE_MAX_DIMS];
    memcpy(gshape, out->shape, sizeof gshape);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = comm, sp.comm_dtype = comm_dtype;
    if (!st) st = pdde_session_init(ref, NULL, &rs);
    if (!st) st = pdde_session_init(g, &sp, &s);
    CHECK(!st, "%s: setup: %s", what, pdde_last_error(ctx));
    float *want = malloc(pdde_tensor_nbytes(rout)), *got = malloc(pdde_tensor_nbytes(rout));
    if (!st && (!want || !got)) st = PDDE_ERR_OOM;
    if (!st) st = run(rs, ref, ref, rout, want);
    if (!st) st = run(s, g, ref, out, got);
    CHECK(!st, "%s: run: %s", what, pdde_last_error(ctx));
    if (!st) {
        /* the reshard nodes the session inserted (its nodes that are no tensor of g), in schedule order */
        char nodes[128] = "";
        for (int i = 0; i < pdde_session_node_count(s); i++) {
            const pdde_tensor *t = pdde_session_node(s, i);
            bool inserted = true;
            for (int k = 0; k < n_graph && inserted; k++) inserted = pdde_session_tensor(s, pdde_graph_tensor(g, k)) != t;
            if (inserted) snprintf(nodes + strlen(nodes), sizeof nodes - strlen(nodes), "%s%s", *nodes ? " " : "", pdde_op_name(t->op));
        }
        char want_nodes[128];
        snprintf(want_nodes, sizeof want_nodes, comm_dtype == PDDE_BF16 ? "cast %s cast" : "%s", conv_nodes[c]);
        CHECK(strcmp(nodes, want_nodes) == 0, "%s: inserted \"%s\", want \"%s\"", what, nodes, want_nodes);
        int coords[2] = {0, 0};
        pdde_mesh_coords(mesh, pdde_comm_rank(comm), coords);
        double worst = 0;
        const pdde_tensor *block = pdde_session_tensor(s, out);
        for (int64_t k = 0; k < pdde_tensor_numel(block); k++) {
            float w = want[global_index(block, gshape, coords, k)];
            double e = fabs(got[k] - w) / (1 + fabs(w));
            if (!(e <= worst)) worst = e; /* (NaN counts) */
        }
        if (comm_dtype == PDDE_F32)
            CHECK(out->dist.partial == 0 && worst <= 1e-6, "%s: rank %d differs from one process by %.3g", what, pdde_comm_rank(comm), worst);
        else /* rounded to bf16 (8 significant bits) on the way: close, and not exact */
            CHECK(worst > 0 && worst <= 2e-2, "%s: rank %d differs from one process by %.3g", what, pdde_comm_rank(comm), worst);
    }
    free(want), free(got);
    pdde_session_free(s), pdde_session_free(rs);
    pdde_graph_free(g), pdde_graph_free(ref);
}

static void rank_main(pdde_context *ctx, pdde_comm *comm, void *arg) {
    const mesh_case *mc = arg;
    for (int k = 0; k < mc->n_shapes; k++)
        for (int c = 0; c < N_CONVERSIONS; c++)
            for (int a = 0; a < mc->ndim; a++)
                if (c != SWAP || mc->ndim == 2) {
                    run_case(ctx, comm, mc, (conversion)c, &mc->shapes[k], a, PDDE_F32);
                    if (k == 0) check_backward(ctx, comm, mc, (conversion)c, &mc->shapes[k], a);
                }
    /* a split that does not divide a dim is refused, naming the tensor (pdde splits evenly only) */
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    const pdde_mesh *mesh = pdde_mesh_create(g, 1, (int[]){pdde_comm_size(comm)}, (const char *[]){"a0"}, NULL);
    pdde_tensor *odd = pdde_input(g, "odd", PDDE_F32, 2, (int64_t[]){pdde_comm_size(comm) + 1, 4});
    CHECK(pdde_shard(g, odd, mesh, (int[]){0, -1}) == PDDE_ERR_DIST_ATTR && strstr(pdde_last_error(ctx), "odd") &&
              strstr(pdde_last_error(ctx), "not divisible"), "an uneven split: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    /* the collectives in bf16 (pdde_session_params.comm_dtype) */
    static const conversion collectives[] = {ALLREDUCE_SUM, REDUCE_SCATTER, ALLGATHER, ALLTOALL};
    for (int k = 0; k < 4; k++) run_case(ctx, comm, mc, collectives[k], &mc->shapes[0], 0, PDDE_BF16);
}

/* Plans that cannot run say why, on every rank, instead of hanging or guessing. */
static void bad_plans(pdde_context *ctx, pdde_comm *comm, void *arg) {
    (void)arg;
    int rank = pdde_comm_rank(comm);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = comm;
    for (int k = 0; k < 2; k++) {
        pdde_graph *g;
        pdde_session *s = NULL;
        pdde_graph_init(ctx, &g);
        /* k 0: a mesh of 4 ranks for a world of 2; k 1: layer 1 on a slice of layer 0's mesh, so rank 1
         * would be in two pipeline stages */
        const pdde_mesh *mesh = k == 0 ? pdde_mesh_create(g, 2, (int[]){2, 2}, (const char *[]){"a0", "a1"}, NULL)
                                       : pdde_mesh_create(g, 1, (int[]){2}, (const char *[]){"pp"}, NULL);
        pdde_graph_set_layer(g, 0);
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){4, 8});
        pdde_tensor *h = pdde_matmul(g, x, pdde_param(g, "w0", 2, (int64_t[]){8, 8}, 0.1f), 0, 0);
        pdde_graph_set_layer(g, 1);
        pdde_mark_output(pdde_matmul(g, h, pdde_param(g, "w1", 2, (int64_t[]){8, 8}, 0.1f), 0, 0));
        if (k == 1) pdde_graph_set_layer_mesh(g, 0, 0, mesh), pdde_graph_set_layer_mesh(g, 1, 1, pdde_mesh_slice(g, mesh, 0, 1));
        pdde_status st = pdde_complete_dist_attrs(g);
        if (!st) st = pdde_session_init(g, &sp, &s);
        if (k == 0)
            CHECK(st == PDDE_ERR_DIST_ATTR && strstr(pdde_last_error(ctx), "the mesh has 4 ranks, the world 2"),
                  "rank %d: a mesh larger than the world: %s", rank, pdde_last_error(ctx));
        else if (rank == 1)
            CHECK(st == PDDE_ERR_UNSUPPORTED && strstr(pdde_last_error(ctx), "rank 1 is in two pipeline stages"),
                  "rank 1: overlapping stages: %s", pdde_last_error(ctx));
        pdde_session_free(s);
        pdde_graph_free(g);
    }
}

int main(void) {
    /* ranks are fork()ed from this process: device runtimes do not survive a fork */
    setenv("PDDE_BACKENDS", "cpu", 1);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    if (!srv) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    for (size_t m = 0; m < sizeof meshes / sizeof meshes[0]; m++) {
        const mesh_case *mc = &meshes[m];
        char prefix[32];
        snprintf(prefix, sizeof prefix, "reshard%zu", m);
        test_ranks_params tp = {.addr = addr, .prefix = prefix, .timeout_s = 60, .peer_timeout_s = 5, .server = srv};
        int before = test_failed, n = mc->shape[0] * (mc->ndim == 2 ? mc->shape[1] : 1);
        double t0 = test_now();
        test_run_ranks(n, &tp, rank_main, (void *)mc, 120);
        printf("mesh [%d%s%.0d] on %d ranks: %s (%.1f s)\n", mc->shape[0], mc->ndim == 2 ? "," : "", mc->ndim == 2 ? mc->shape[1] : 0, n,
               test_failed == before ? "ok" : "FAILED", test_now() - t0);
        fflush(stdout);
    }
    test_ranks_params tp = {.addr = addr, .prefix = "reshard_bad", .timeout_s = 60, .peer_timeout_s = 5, .server = srv};
    test_run_ranks(2, &tp, bad_plans, NULL, 60);
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
#endif
