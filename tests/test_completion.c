/* test_completion — meshes, annotations and completion (pure graph analysis: no process is started).
 * Golden dist attrs (exact dims mappings and partial bits) for a matmul chain, an MLP (column then row
 * parallel), a head-parallel attention block and a GPT from examples/gpt.h under data parallel, tensor
 * parallel (head-parallel attention: one forward collective per sublayer; vocab-parallel embedding
 * and cross-entropy), ZeRO-3, DP x TP and DP x PP
 * (stages), forward, backward and optimizer nodes; bad annotations and meshes. */
#define _GNU_SOURCE /* open_memstream */
#include "pdde.h"
#include "pdde_extension.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>

#define MAP(...) ((const int[]){__VA_ARGS__})
#define NAMES(...) ((const char *const[]){__VA_ARGS__})
#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})
enum { DP = 0, TP = 1 }; /* axes of the [2,2] mesh; a 1-d mesh has its one axis at 0 */
#define BIT(a) (1u << (a))

static pdde_context *ctx;

/* a's mapping equals want[0..a->ndim) */
static int dims_are(const pdde_dist_attr *a, const int *want) {
    if (!a || !a->mesh) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims_mapping[d] != want[d]) return 0;
    return 1;
}

static const char *str(const pdde_dist_attr *a) {
    static char buf[4][160];
    static int i;
    i = (i + 1) % 4;
    pdde_dist_attr_str(a, buf[i], sizeof buf[i]);
    return buf[i];
}

/* Checks an attr: mapping, partial bits and which of them average. */
#define CHECK_ATTR(a, want, p, avg)                                                                         \
    CHECK((a) && dims_are((a), (want)) && (a)->partial == (p) && ((a)->partial_avg & (a)->partial) == (avg), \
          "%s: got %s", #a, (a) ? str(a) : "NULL")

static pdde_graph *new_graph(void) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    return g;
}

static const pdde_mesh *mesh_1d(pdde_graph *g, const char *name) { return pdde_mesh_create(g, 1, (int[]){2}, NAMES(name), NULL); }
static const pdde_mesh *mesh_2x2(pdde_graph *g) { return pdde_mesh_create(g, 2, (int[]){2, 2}, NAMES("dp", "tp"), NULL); }

/* The node that consumes t as input k with op (the first one), or NULL. */
static pdde_tensor *consumer(pdde_graph *g, const pdde_tensor *t, pdde_op op, int k) {
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *n = pdde_graph_tensor(g, i);
        if (n->op == op && k < n->nsrc && n->src[k] == t) return n;
    }
    return NULL;
}

static pdde_tensor *accum_of(pdde_graph *g, pdde_tensor *p);

static int has(const char *s, const char *sub) { return s && strstr(s, sub) != NULL; }

/* ---------------------------------------------------------------------------------------------- */

static void test_mesh(void) {
    pdde_graph *g = new_graph();
    const pdde_mesh *m = mesh_2x2(g);
    CHECK(m && m->n_ranks == 4 && pdde_graph_mesh(g) == m, "2x2 mesh");
    CHECK(pdde_mesh_axis(m, "tp") == 1 && pdde_mesh_axis(m, "pp") == -1, "axis lookup");
    int c[2] = {-1, -1};
    CHECK(pdde_mesh_coords(m, 2, c) == PDDE_OK && c[0] == 1 && c[1] == 0, "rank 2 at (1,0): (%d,%d)", c[0], c[1]);
    CHECK(pdde_mesh_coords(m, 7, c) == PDDE_ERR_NOT_FOUND, "rank 7 is not in the mesh");
    CHECK(pdde_mesh_rank_at(m, (int[]){1, 1}) == 3 && pdde_mesh_rank_at(m, (int[]){2, 0}) == -1, "rank_at");
    const pdde_mesh *r = pdde_mesh_create(g, 1, (int[]){2}, NAMES("x"), (int[]){3, 1});
    CHECK(r && pdde_mesh_rank_at(r, (int[]){0}) == 3 && pdde_mesh_coords(r, 1, c) == PDDE_OK && c[0] == 1, "explicit ranks");
    /* a pipeline-stage-like slice: the second row, axis dp dropped */
    const pdde_mesh *s = pdde_mesh_slice(g, m, 0, 1);
    CHECK(s && s->ndim == 1 && s->shape[0] == 2 && s->ranks[0] == 2 && s->ranks[1] == 3 && strcmp(s->names[0], "tp") == 0,
          "slice dp=1: ranks {2,3} on axis tp");
    const pdde_mesh *col = pdde_mesh_slice(g, m, 1, 0);
    CHECK(col && col->ranks[0] == 0 && col->ranks[1] == 2 && strcmp(col->names[0], "dp") == 0, "slice tp=0: ranks {0,2}");
    const pdde_mesh *one = pdde_mesh_slice(g, col, 0, 1);
    CHECK(one && one->ndim == 0 && one->n_ranks == 1 && one->ranks[0] == 2 && pdde_mesh_rank_at(one, NULL) == 2, "a single rank");
    CHECK(!pdde_mesh_slice(g, m, 2, 0) && pdde_graph_status(g) == PDDE_ERR_DIST_ATTR, "slice of a missing axis");
    pdde_graph_free(g);

    /* a mesh of more ranks than the job (the graph's mesh) has: NULL and a sticky error */
    g = new_graph();
    mesh_2x2(g);
    const pdde_mesh *big = pdde_mesh_create(g, 1, (int[]){8}, NAMES("dp"), NULL);
    CHECK(!big && pdde_graph_status(g) == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), "8 ranks"),
          "8 ranks on a 4-rank job: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    g = new_graph();
    mesh_2x2(g);
    CHECK(!pdde_mesh_create(g, 1, (int[]){2}, NAMES("dp"), (int[]){0, 9}) && has(pdde_last_error(ctx), "rank 9"),
          "rank outside the job: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    g = new_graph();
    CHECK(!pdde_mesh_create(g, 2, (int[]){2, 2}, NAMES("dp", "dp"), NULL) && pdde_graph_status(g) == PDDE_ERR_DIST_ATTR &&
              has(pdde_last_error(ctx), "dp"),
          "two axes called dp: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    g = new_graph();
    CHECK(!pdde_mesh_create(g, 1, (int[]){0}, NAMES("dp"), NULL) && pdde_graph_status(g) == PDDE_ERR_DIST_ATTR, "axis of size 0");
    pdde_graph_free(g);
}

static void test_bad_annotations(void) {
    pdde_graph *g = new_graph();
    const pdde_mesh *m = pdde_mesh_create(g, 2, (int[]){2, 4}, NAMES("dp", "tp"), NULL);
    pdde_tensor *w = pdde_param(g, "h0.fc.w", 2, SHAPE(32, 130), 0.02f);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, SHAPE(8, 32));
    pdde_tensor *y = pdde_matmul(g, x, w, 0, 0);
    CHECK(pdde_shard(g, w, m, MAP(-1, 1)) == PDDE_ERR_DIST_ATTR &&
              has(pdde_last_error(ctx), "h0.fc.w dim 1 (size 130) is not divisible by mesh axis tp (size 4)"),
          "not divisible: %s", pdde_last_error(ctx));
    CHECK(pdde_shard(g, w, m, MAP(2, -1)) == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), "h0.fc.w dim 0") &&
              has(pdde_last_error(ctx), "axis 2 is out of range"),
          "axis out of range: %s", pdde_last_error(ctx));
    CHECK(pdde_shard(g, x, m, MAP(0, 0)) == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), "x dims 0 and 1") &&
              has(pdde_last_error(ctx), "mesh axis dp"),
          "same axis twice: %s", pdde_last_error(ctx));
    CHECK(pdde_shard(g, y, m, MAP(0, -1)) == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), y->name), "a computed tensor: %s",
          pdde_last_error(ctx));
    pdde_graph *other = new_graph();
    const pdde_mesh *om = mesh_1d(other, "dp");
    CHECK(pdde_shard(g, x, om, MAP(0, -1)) == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), "x: the mesh"), "foreign mesh: %s",
          pdde_last_error(ctx));
    pdde_graph_free(other);
    CHECK(pdde_shard(g, x, m, MAP(0, 1)) == PDDE_OK, "a good annotation");
    CHECK(pdde_graph_status(g) == PDDE_OK, "annotation errors are not sticky");
    CHECK(pdde_strategy_data_parallel(g, m, "pp") == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), "pp"), "unknown axis");
    CHECK(pdde_strategy_zero(g, m, "dp", 1) == PDDE_ERR_STATE, "zero before the optimizer");
    pdde_graph_free(g);

    g = new_graph();
    pdde_input(g, "x", PDDE_F32, 1, SHAPE(4));
    CHECK(pdde_complete_dist_attrs(g) == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), "no mesh"), "completion needs a mesh");
    pdde_graph_free(g);
}

static void test_attr_str(void) {
    pdde_graph *g = new_graph();
    const pdde_mesh *m = mesh_2x2(g);
    pdde_dist_attr a = {.mesh = m, .ndim = 3, .dims_mapping = {DP, -1, TP}, .partial = 0};
    char buf[128];
    pdde_dist_attr_str(&a, buf, sizeof buf);
    CHECK(strcmp(buf, "mesh[2,2] dims[dp,-1,tp]") == 0, "%s", buf);
    a.dims_mapping[2] = -1, a.partial = BIT(TP);
    pdde_dist_attr_str(&a, buf, sizeof buf);
    CHECK(strcmp(buf, "mesh[2,2] dims[dp,-1,-1] partial{tp}") == 0, "%s", buf);
    a.dims_mapping[0] = -1, a.partial = BIT(DP) | BIT(TP), a.partial_avg = BIT(DP);
    pdde_dist_attr_str(&a, buf, sizeof buf);
    CHECK(strcmp(buf, "mesh[2,2] dims[-1,-1,-1] partial{dp:avg,tp}") == 0, "%s", buf);
    a.partial = 0;
    pdde_dist_attr_str(&a, buf, sizeof buf);
    CHECK(strcmp(buf, "mesh[2,2] dims[-1,-1,-1] avg{dp}") == 0, "%s", buf);
    int n = pdde_dist_attr_str(&a, buf, 8);
    CHECK(n == (int)strlen("mesh[2,2] dims[-1,-1,-1] avg{dp}") && strlen(buf) == 7, "truncation: %d '%s'", n, buf);
    pdde_graph_free(g);
}

/* x[dp,-1] @ w1[-1,tp] @ w2[tp,-1] (@ w3^T): M follows x, N follows w1, K split on tp in both: partial */
static void test_matmul_chain(void) {
    pdde_graph *g = new_graph();
    const pdde_mesh *m = mesh_2x2(g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, SHAPE(8, 16));
    pdde_tensor *w1 = pdde_param(g, "w1", 2, SHAPE(16, 32), 0.02f);
    pdde_tensor *w2 = pdde_param(g, "w2", 2, SHAPE(32, 8), 0.02f);
    pdde_tensor *w3 = pdde_param(g, "w3", 2, SHAPE(4, 8), 0.02f); /* used transposed */
    pdde_tensor *w4 = pdde_param(g, "w4", 2, SHAPE(4, 4), 0.02f);
    pdde_tensor *y1 = pdde_matmul(g, x, w1, 0, 0), *y2 = pdde_matmul(g, y1, w2, 0, 0);
    pdde_tensor *y3 = pdde_matmul(g, y2, w3, 0, 1), *y4 = pdde_matmul(g, w4, y3, 0, 1); /* [4,4] x [8,4]^T: weight first */
    CHECK(!pdde_shard(g, x, m, MAP(DP, -1)) && !pdde_shard(g, w1, m, MAP(-1, TP)) && !pdde_shard(g, w2, m, MAP(TP, -1)) &&
              !pdde_shard(g, w3, m, MAP(-1, DP)),
          "annotate");
    CHECK(pdde_complete_dist_attrs(g) == PDDE_OK, "complete: %s", pdde_last_error(ctx));
    CHECK_ATTR(&w4->dist, MAP(-1, -1), 0, 0);
    CHECK_ATTR(&y1->dist, MAP(DP, TP), 0, 0);
    CHECK_ATTR(&y2->dist, MAP(DP, -1), BIT(TP), 0);
    /* y3 = y2 @ w3^T: w3's K (its dim 1) is split over dp, which y2's rows use: the weight follows
     * the activation (w3 gathered), y2's partial passes through (matmul is linear) */
    CHECK_ATTR(&y3->dist, MAP(DP, -1), BIT(TP), 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, y3, 1), MAP(-1, -1), 0, 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, y3, 0), MAP(DP, -1), BIT(TP), 0);
    /* y4 = w4 @ y3^T: src0 is the weight, so y3 (the activation) keeps its rows' split: N = dp */
    CHECK_ATTR(&y4->dist, MAP(-1, DP), BIT(TP), 0);
    CHECK(pdde_complete_conflict_count(g) == 1 && has(pdde_complete_conflict(g, 0), "w3") &&
              has(pdde_complete_conflict(g, 0), "input 1 follows input 0"),
          "one conflict (w3): %d %s", pdde_complete_conflict_count(g), pdde_complete_conflict(g, 0) ? pdde_complete_conflict(g, 0) : "");
    CHECK(!pdde_op_input_dist_attr(g, x, 0) && !pdde_op_input_dist_attr(g, y1, 2) && !pdde_op_input_dist_attr(g, y1, -1), "no requirement");

    /* K split over different axes in the two operands: the weight follows the activation */
    pdde_graph_free(g);
    g = new_graph();
    m = mesh_2x2(g);
    x = pdde_input(g, "x", PDDE_F32, 2, SHAPE(8, 16));
    w1 = pdde_param(g, "w1", 2, SHAPE(16, 32), 0.02f);
    y1 = pdde_matmul(g, x, w1, 0, 0);
    pdde_shard(g, x, m, MAP(-1, TP));
    pdde_shard(g, w1, m, MAP(DP, -1));
    CHECK(pdde_complete_dist_attrs(g) == PDDE_OK, "complete");
    CHECK_ATTR(&y1->dist, MAP(-1, -1), BIT(TP), 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, y1, 1), MAP(TP, -1), 0, 0);
    CHECK(pdde_complete_conflict_count(g) == 1 && has(pdde_complete_conflict(g, 0), "split over dp but input 0 (x) dim 1 over tp"),
          "conflict: %s", pdde_complete_conflict(g, 0) ? pdde_complete_conflict(g, 0) : "none");
    pdde_graph_free(g);
}

/* ln -> fc (column parallel) -> gelu -> fcproj (row parallel) -> + residual -> ln: the row-parallel
 * output is partial on tp, the residual add keeps it partial, the next layernorm needs it whole:
 * that is the one allreduce of the MLP. */
static void test_mlp(void) {
    pdde_graph *g = new_graph();
    const pdde_mesh *m = mesh_2x2(g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 3, SHAPE(4, 8, 16));
    pdde_tensor *h = gpt_layernorm(g, NULL, "ln", x, 16);
    pdde_tensor *fc = pdde_matmul(g, h, pdde_param(g, "fc.w", 2, SHAPE(16, 64), 0.02f), 0, 0);
    pdde_tensor *fcb = pdde_bias_add(g, fc, pdde_param(g, "fc.b", 1, SHAPE(64), 0));
    pdde_tensor *act = pdde_gelu(g, fcb);
    pdde_tensor *pr = pdde_matmul(g, act, pdde_param(g, "fcproj.w", 2, SHAPE(64, 16), 0.02f), 0, 0);
    pdde_tensor *prb = pdde_bias_add(g, pr, pdde_param(g, "fcproj.b", 1, SHAPE(16), 0));
    pdde_tensor *res = pdde_add(g, x, prb);
    pdde_tensor *out = gpt_layernorm(g, NULL, "ln2", res, 16);
    CHECK(pdde_graph_status(g) == PDDE_OK, "build");
    CHECK(!pdde_strategy_data_parallel(g, m, "dp"), "dp");
    CHECK(!pdde_strategy_tensor_parallel_linear(g, pdde_graph_find(g, "fc.w"), pdde_graph_find(g, "fc.b"), m, "tp", PDDE_TP_COLUMN) &&
              !pdde_strategy_tensor_parallel_linear(g, pdde_graph_find(g, "fcproj.w"), pdde_graph_find(g, "fcproj.b"), m, "tp", PDDE_TP_ROW),
          "tp: %s", pdde_last_error(ctx));
    CHECK_ATTR(&pdde_graph_find(g, "fc.w")->dist, MAP(-1, TP), 0, 0);
    CHECK_ATTR(&pdde_graph_find(g, "fc.b")->dist, MAP(TP), 0, 0);
    CHECK_ATTR(&pdde_graph_find(g, "fcproj.w")->dist, MAP(TP, -1), 0, 0);
    CHECK_ATTR(&pdde_graph_find(g, "fcproj.b")->dist, MAP(-1), 0, 0);
    CHECK(pdde_complete_dist_attrs(g) == PDDE_OK, "complete: %s", pdde_last_error(ctx));
    CHECK_ATTR(&h->dist, MAP(DP, -1, -1), 0, 0);
    CHECK_ATTR(&fc->dist, MAP(DP, -1, TP), 0, 0);
    CHECK_ATTR(&fcb->dist, MAP(DP, -1, TP), 0, 0);
    CHECK_ATTR(&act->dist, MAP(DP, -1, TP), 0, 0);
    CHECK_ATTR(&pr->dist, MAP(DP, -1, -1), BIT(TP), 0);
    /* the bias is added once: required partial (kept on one tp rank) */
    CHECK_ATTR(&prb->dist, MAP(DP, -1, -1), BIT(TP), 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, prb, 1), MAP(-1), BIT(TP), 0);
    CHECK_ATTR(&res->dist, MAP(DP, -1, -1), BIT(TP), 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, res, 0), MAP(DP, -1, -1), BIT(TP), 0);
    /* the allreduce site: ln2 requires its input whole */
    CHECK_ATTR(pdde_op_input_dist_attr(g, out, 0), MAP(DP, -1, -1), 0, 0);
    CHECK_ATTR(&out->dist, MAP(DP, -1, -1), 0, 0);
    CHECK(pdde_complete_conflict_count(g) == 0, "no conflicts: %d", pdde_complete_conflict_count(g));

    /* the dump shows the allreduce */
    FILE *f = tmpfile();
    pdde_graph_dump_dist(g, f);
    char text[16384] = {0};
    rewind(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    CHECK(n > 0 && has(text, "allreduce(tp)") && has(text, "to_partial(tp)") && has(text, "# 0 conflicts"), "dump:\n%s", text);
    pdde_graph_free(g);
}

/* Attention with separate q, k, v weights (column parallel) is head parallel: [B,T,C] with C split
 * reshapes to [B,T,H,D] with H split; the batched matmuls, the causal softmax and the output
 * projection (row parallel) follow without communication until the partial output. */
static void test_attention(void) {
    enum { B = 2, T = 8, C = 16, H = 4, D = 4 };
    pdde_graph *g = new_graph();
    const pdde_mesh *m = mesh_2x2(g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 3, SHAPE(B, T, C)), *qkv[3], *heads[3];
    const char *names[3] = {"wq", "wk", "wv"};
    for (int i = 0; i < 3; i++) {
        pdde_tensor *w = pdde_param(g, names[i], 2, SHAPE(C, C), 0.02f);
        pdde_strategy_tensor_parallel_linear(g, w, NULL, m, "tp", PDDE_TP_COLUMN);
        qkv[i] = pdde_matmul(g, x, w, 0, 0);
        pdde_tensor *r = pdde_reshape(g, qkv[i], 4, SHAPE(B, T, H, D));
        heads[i] = pdde_permute(g, r, (int[]){0, 2, 1, 3});
    }
    pdde_tensor *s = pdde_matmul(g, heads[0], heads[1], 0, 1);
    pdde_tensor *p = pdde_softmax(g, pdde_scale(g, s, 0.5f), 1);
    pdde_tensor *y = pdde_matmul(g, p, heads[2], 0, 0);
    pdde_tensor *yt = pdde_permute(g, y, (int[]){0, 2, 1, 3});
    pdde_tensor *yc = pdde_reshape(g, yt, 3, SHAPE(B, T, C));
    pdde_tensor *wo = pdde_param(g, "wo", 2, SHAPE(C, C), 0.02f);
    pdde_strategy_tensor_parallel_linear(g, wo, NULL, m, "tp", PDDE_TP_ROW);
    pdde_tensor *o = pdde_matmul(g, yc, wo, 0, 0);
    /* a cut along a split dim needs the dim whole: slicing the heads of q */
    pdde_tensor *cut = pdde_slice(g, heads[0], 1, 0, 2);
    pdde_strategy_data_parallel(g, m, "dp");
    CHECK(pdde_complete_dist_attrs(g) == PDDE_OK, "complete: %s", pdde_last_error(ctx));
    CHECK_ATTR(&qkv[0]->dist, MAP(DP, -1, TP), 0, 0);
    CHECK_ATTR(&heads[0]->src[0]->dist, MAP(DP, -1, TP, -1), 0, 0); /* the reshape: C split -> H split */
    CHECK_ATTR(&heads[0]->dist, MAP(DP, TP, -1, -1), 0, 0);
    CHECK_ATTR(&s->dist, MAP(DP, TP, -1, -1), 0, 0);
    CHECK_ATTR(&p->dist, MAP(DP, TP, -1, -1), 0, 0);
    CHECK_ATTR(&y->dist, MAP(DP, TP, -1, -1), 0, 0);
    CHECK_ATTR(&yt->dist, MAP(DP, -1, TP, -1), 0, 0);
    CHECK_ATTR(&yc->dist, MAP(DP, -1, TP), 0, 0);
    CHECK_ATTR(&o->dist, MAP(DP, -1, -1), BIT(TP), 0);
    for (int i = 0; i < 3; i++)
        for (int k = 0; k < 2; k++) {
            pdde_tensor *mm = k == 0 ? s : y;
            CHECK(dims_are(pdde_op_input_dist_attr(g, mm, k), MAP(DP, TP, -1, -1)), "attention matmul inputs need no reshard");
        }
    CHECK_ATTR(pdde_op_input_dist_attr(g, cut, 0), MAP(DP, -1, -1, -1), 0, 0);
    CHECK_ATTR(&cut->dist, MAP(DP, -1, -1, -1), 0, 0);
    CHECK(pdde_complete_conflict_count(g) == 0, "no conflicts");
    pdde_graph_free(g);
}

/* The smaller families: reductions, reshape, concat, rmsnorm, mul and a mean loss's backward, SGD. */
static void test_misc_rules(void) {
    pdde_graph *g = new_graph();
    const pdde_mesh *m = mesh_2x2(g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, SHAPE(8, 6));
    pdde_tensor *w = pdde_param(g, "w", 1, SHAPE(6), 0.02f);
    pdde_tensor *z = pdde_input(g, "z", PDDE_F32, 2, SHAPE(6, 4));
    pdde_shard(g, x, m, MAP(DP, -1));
    pdde_shard(g, z, m, MAP(-1, TP));
    pdde_tensor *flat = pdde_reshape(g, x, 1, SHAPE(48));             /* [B,C] -> [B*C]: dp carries */
    pdde_tensor *back = pdde_reshape(g, flat, 3, SHAPE(4, 2, 6));     /* [48] -> [4,2,6]: dp on dim 0 */
    pdde_tensor *zf = pdde_reshape(g, z, 1, SHAPE(24));               /* z's split dim 1 starts at 6: gathered */
    pdde_tensor *s0 = pdde_sum(g, x, 0, 0), *m1 = pdde_mean(g, x, 1, 1), *mall = pdde_mean(g, x, -1, 0);
    pdde_tensor *cat0 = pdde_concat(g, 2, (pdde_tensor *[]){x, x}, 0), *cat1 = pdde_concat(g, 2, (pdde_tensor *[]){x, x}, 1);
    pdde_tensor *zr = pdde_rmsnorm(g, pdde_transpose(g, z, 0, 1), w, 1e-5f); /* [4(tp),6]: rows split, fine */
    pdde_tensor *xn = pdde_rmsnorm(g, pdde_relu(g, pdde_cast(g, x, PDDE_F32)), w, 1e-5f);
    pdde_tensor *loss = pdde_mean(g, pdde_mul(g, pdde_silu(g, pdde_dropout(g, xn, 0.1f, 7)), w), -1, 0);
    CHECK(pdde_graph_status(g) == PDDE_OK && !pdde_backward(g, loss), "build: %s", pdde_last_error(ctx));
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.momentum = 0.9f;
    CHECK(!pdde_optimizer_sgd(g, &op) && !pdde_complete_dist_attrs(g), "complete: %s", pdde_last_error(ctx));
    CHECK_ATTR(&flat->dist, MAP(DP), 0, 0);
    CHECK_ATTR(&back->dist, MAP(DP, -1, -1), 0, 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, zf, 0), MAP(-1, -1), 0, 0);
    CHECK_ATTR(&zf->dist, MAP(-1), 0, 0);
    CHECK_ATTR(&s0->dist, MAP(-1), BIT(DP), 0);            /* a summed split dim: partial sum */
    CHECK_ATTR(&m1->dist, MAP(DP, -1), 0, 0);               /* reduced dim not split: whole */
    CHECK_ATTR(&mall->dist, MAP(-1), BIT(DP), BIT(DP));     /* a mean over the split batch: average */
    CHECK_ATTR(pdde_op_input_dist_attr(g, cat0, 0), MAP(-1, -1), 0, 0); /* cut along the split dim: gathered */
    CHECK_ATTR(&cat1->dist, MAP(DP, -1), 0, 0);
    CHECK_ATTR(&zr->dist, MAP(TP, -1), 0, 0);
    CHECK_ATTR(&xn->dist, MAP(DP, -1), 0, 0);
    CHECK_ATTR(&loss->dist, MAP(-1), BIT(DP), BIT(DP));
    /* backward of the mean: the expanded seed is whole (avg marker), mul slices it; w's gradient is
     * summed over the split batch: partial-avg; SGD momentum follows w */
    pdde_tensor *acc = accum_of(g, w), *u = consumer(g, w, PDDE_OP_SGD_UPDATE, 0);
    CHECK(acc && acc->src[1]->dist.partial == BIT(DP) && acc->src[1]->dist.partial_avg == BIT(DP), "dw: %s", acc ? str(&acc->src[1]->dist) : "?");
    CHECK_ATTR(pdde_op_input_dist_attr(g, acc, 1), MAP(-1), BIT(DP), BIT(DP)); /* accumulated as it comes */
    CHECK_ATTR(pdde_op_input_dist_attr(g, u, 1), MAP(-1), 0, 0);               /* reduced for the update */
    CHECK(u && dims_are(&u->src[2]->dist, MAP(-1)) && dims_are(&u->dist, MAP(-1)), "sgd");
    CHECK(pdde_complete_conflict_count(g) == 0, "no conflicts (%d: %s)", pdde_complete_conflict_count(g),
          pdde_complete_conflict_count(g) ? pdde_complete_conflict(g, 0) : "");
    pdde_graph_free(g);
}

/* rope [B,T,H,D]: heads split over tp and the batch over dp pass through, forward and backward; T split
 * is gathered first (a row's angle is its position in the whole T), and so is D (pairs D/2 apart) */
static void test_rope_rule(void) {
    pdde_graph *g = new_graph();
    const pdde_mesh *m = mesh_2x2(g);
    pdde_tensor *x = pdde_param(g, "x", 4, SHAPE(4, 6, 2, 8), 0.02f);
    pdde_tensor *t = pdde_input(g, "t", PDDE_F32, 4, SHAPE(4, 6, 2, 8));
    pdde_tensor *d = pdde_input(g, "d", PDDE_F32, 4, SHAPE(4, 6, 2, 8));
    pdde_shard(g, x, m, MAP(DP, -1, TP, -1));
    pdde_shard(g, t, m, MAP(-1, DP, -1, -1));
    pdde_shard(g, d, m, MAP(-1, -1, -1, TP));
    pdde_tensor *rx = pdde_rope(g, x, 10000.0f), *rt = pdde_rope(g, t, 10000.0f), *rd = pdde_rope(g, d, 10000.0f);
    pdde_tensor *loss = pdde_add(g, pdde_mean(g, pdde_mul(g, rx, rx), -1, 0), pdde_mean(g, pdde_add(g, rt, rd), -1, 0));
    CHECK(pdde_graph_status(g) == PDDE_OK && !pdde_backward(g, loss), "build: %s", pdde_last_error(ctx));
    CHECK(!pdde_complete_dist_attrs(g), "complete: %s", pdde_last_error(ctx));
    CHECK_ATTR(&rx->dist, MAP(DP, -1, TP, -1), 0, 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, rt, 0), MAP(-1, -1, -1, -1), 0, 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, rd, 0), MAP(-1, -1, -1, -1), 0, 0);
    pdde_tensor *acc = accum_of(g, x), *back = acc ? acc->src[1] : NULL;
    CHECK(back && back->op == PDDE_OP_ROPE && pdde_op_i32(back, PDDE_P_ROPE_INVERSE) == 1, "x's gradient is a rope with ROPE_INVERSE");
    if (back) CHECK_ATTR(&back->dist, MAP(DP, -1, TP, -1), 0, 0);
    pdde_graph_free(g);
}

/* ---- GPT (examples/gpt.h), forward + backward + AdamW ---- */

static const gpt_config gpt_cfg = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 4};

static pdde_graph *gpt_graph(gpt_model *mdl, int clip) {
    pdde_graph *g = new_graph();
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.clip_norm = clip ? 1.0f : 0.0f;
    if (gpt_build(g, &gpt_cfg, mdl) || pdde_backward(g, mdl->loss) || pdde_optimizer_adamw(g, &op))
        fprintf(stderr, "gpt: %s\n", pdde_last_error(ctx));
    return g;
}

static pdde_tensor *find(pdde_graph *g, const char *name) {
    pdde_tensor *t = pdde_graph_find(g, name);
    if (!t) fprintf(stderr, "no tensor %s\n", name);
    return t;
}

/* The grad_accum of parameter p and the gradient backward produced for it. */
static pdde_tensor *accum_of(pdde_graph *g, pdde_tensor *p) { return p && p->grad ? consumer(g, p->grad, PDDE_OP_GRAD_ACCUM, 0) : NULL; }

static pdde_tensor *update_of(pdde_graph *g, pdde_tensor *p) { return consumer(g, p, PDDE_OP_ADAMW_UPDATE, 0); }

/* Whether turning attr have into want takes communication (a collective), not just a local slice or
 * zeros: a partial sum reduced, or a split dim gathered or moved (see planner/README.md). */
static int needs_comm(const pdde_dist_attr *have, const pdde_dist_attr *want, int ndim) {
    if (have->partial & ~want->partial) return 1;
    for (int d = 0; d < ndim; d++)
        if (have->dims_mapping[d] >= 0 && want->dims_mapping[d] != have->dims_mapping[d]) return 1;
    return 0;
}

/* The forward inputs of layer `layer`'s nodes that need a collective: count, and the last one's
 * consumer. */
static int forward_collectives(pdde_graph *g, int layer, pdde_tensor **last) {
    int n = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->layer != layer || t->phase != PDDE_PHASE_FORWARD || t->op == PDDE_OP_NONE) continue;
        for (int k = 0; k < t->nsrc; k++) {
            const pdde_dist_attr *want = pdde_op_input_dist_attr(g, t, k);
            if (want && needs_comm(&t->src[k]->dist, want, t->src[k]->ndim)) n++, *last = t;
        }
    }
    return n;
}

/* Head-parallel attention of block 0 (split over axis tp, batch over dp or -1): q, k, v, the fused
 * attention's output [B,H,T,D+1] and its backward's [3,B,H,T,D] are split on H; the fused qkv output [B,T,3C] split on its
 * columns becomes [B,T,H,3,D] split on H; and the block's forward needs two collectives besides the
 * MLP's (which is at the next block's ln1): the allreduce of the vocab-parallel embedding's partial
 * sum where ln1 reads it, and that of proj's partial sum where ln2 reads it. */
static void check_head_parallel(pdde_graph *g, int dp, int tp) {
    pdde_tensor *aw = find(g, "h0.attn.w"), *pw = find(g, "h0.proj.w");
    CHECK_ATTR(&aw->dist, MAP(-1, tp), 0, 0);
    CHECK_ATTR(&find(g, "h0.attn.b")->dist, MAP(tp), 0, 0);
    CHECK_ATTR(&pw->dist, MAP(tp, -1), 0, 0);
    CHECK_ATTR(&find(g, "h0.proj.b")->dist, MAP(-1), 0, 0);
    pdde_tensor *qkv = consumer(g, consumer(g, aw, PDDE_OP_MATMUL, 1), PDDE_OP_ADD, 0);
    CHECK(qkv && dims_are(&qkv->dist, MAP(dp, -1, tp)), "qkv: %s", qkv ? str(&qkv->dist) : "none");
    pdde_tensor *att = NULL, *back = NULL;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_ATTENTION && t->layer == 1 && !att) att = t;
        if (t->op == PDDE_OP_ATTENTION_BACK && att && t->src[pdde_op_i32(t, PDDE_P_ATTENTION_QKV_D) > 0 ? 1 : 3] == att) back = t;
    }
    CHECK(att && back, "attention nodes");
    if (!att || !back) return;
    if (pdde_op_i32(att, PDDE_P_ATTENTION_QKV_D) > 0) {
        /* packed (pdde_attention_qkv): qkv read in place, its columns split over tp are whole heads; the
         * output [B,T,C] and the backward's [B,T,3C] split on their columns alike */
        CHECK(att->src[0] == qkv, "the packed attention reads qkv itself");
        CHECK_ATTR(&att->dist, MAP(dp, -1, tp), 0, 0);
        CHECK_ATTR(&back->dist, MAP(dp, -1, tp), 0, 0);
        for (int k = 0; k < back->nsrc; k++) CHECK_ATTR(pdde_op_input_dist_attr(g, back, k), MAP(dp, -1, tp), 0, 0);
    } else {
        pdde_tensor *heads5 = consumer(g, qkv, PDDE_OP_RESHAPE, 0);
        CHECK(heads5 && heads5->ndim == 5 && dims_are(&heads5->dist, MAP(dp, -1, tp, -1, -1)), "[B,T,H,3,D]: %s",
              heads5 ? str(&heads5->dist) : "none");
        const pdde_tensor *heads[] = {att->src[0], att->src[1], att->src[2], att};
        for (int i = 0; i < 4; i++) {
            CHECK_ATTR(&heads[i]->dist, MAP(dp, tp, -1, -1), 0, 0);
            CHECK(heads[i]->shape[1] == gpt_cfg.heads, "[B,H,T,x]");
        }
        CHECK_ATTR(&back->dist, MAP(-1, dp, tp, -1, -1), 0, 0);
        for (int k = 0; k < back->nsrc; k++) CHECK_ATTR(pdde_op_input_dist_attr(g, back, k), MAP(dp, tp, -1, -1), 0, 0);
    }
    pdde_tensor *ln1 = consumer(g, find(g, "h0.ln1.g"), PDDE_OP_LAYERNORM, 1);
    pdde_tensor *ln2 = consumer(g, find(g, "h0.ln2.g"), PDDE_OP_LAYERNORM, 1), *at = NULL;
    int n = forward_collectives(g, 1, &at);
    CHECK(n == 2 && at == ln2, "block 0 forward: %d collectives, the last at %s (want 2, the last at ln2's input)", n, at ? at->name : "-");
    CHECK(ln1 && ln1->src[0]->dist.partial == BIT(tp), "ln1 reads the embedding's partial sum: %s", ln1 ? str(&ln1->src[0]->dist) : "?");
    CHECK(ln2 && ln2->src[0]->dist.partial == BIT(tp), "ln2 reads proj's partial sum: %s", ln2 ? str(&ln2->src[0]->dist) : "?");
    /* backward: the per-head gradients reshape back to qkv's split columns, so the fused weight's
     * gradient comes out split like it (partial over dp only: the batch rows) */
    unsigned rows = dp >= 0 ? BIT(dp) : 0;
    CHECK_ATTR(&accum_of(g, aw)->src[1]->dist, MAP(-1, tp), rows, rows);
}

/* The vocab-parallel embedding and cross-entropy (gpt_shard_tensor_parallel splits wte, tied to the
 * head, on the vocab over tp): the lookup is a partial sum over tp; the head's logits come out split
 * on the vocab and the cross-entropy takes them so (no allgather): its loss is whole over tp and
 * partial-avg over dp (the rows), dlogits split like the logits. The table's gradient is split like
 * the table: embedding_back needs its dy whole over tp and scatters into its own rows. */
static void check_vocab_parallel(pdde_graph *g, const gpt_model *mdl, int dp, int tp) {
    unsigned rows = dp >= 0 ? BIT(dp) : 0;
    pdde_tensor *wte = find(g, "wte"), *emb = consumer(g, wte, PDDE_OP_EMBEDDING, 0), *eb = NULL;
    CHECK_ATTR(&wte->dist, MAP(tp, -1), 0, 0);
    CHECK_ATTR(&emb->dist, MAP(dp, -1, -1), BIT(tp), 0);
    CHECK_ATTR(&mdl->logits->dist, MAP(dp, tp), 0, 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, mdl->loss, 0), MAP(dp, tp), 0, 0);
    CHECK_ATTR(&mdl->loss->dist, MAP(-1), rows, rows);
    pdde_tensor *dlogits = consumer(g, mdl->logits, PDDE_OP_CROSS_ENTROPY_BACK, 0);
    CHECK(dlogits && dims_are(&dlogits->dist, MAP(dp, tp)) && dlogits->dist.partial == 0 && dlogits->dist.partial_avg == rows,
          "dlogits split on the vocab: %s", dlogits ? str(&dlogits->dist) : "none");
    CHECK_ATTR(pdde_op_input_dist_attr(g, dlogits, 0), MAP(dp, tp), 0, 0);
    for (int i = 0; i < pdde_graph_tensor_count(g) && !eb; i++)
        if (pdde_graph_tensor(g, i)->op == PDDE_OP_EMBEDDING_BACK) eb = pdde_graph_tensor(g, i);
    CHECK(eb != NULL, "embedding_back");
    if (!eb) return;
    CHECK_ATTR(&eb->dist, MAP(tp, -1), rows, rows);
    CHECK_ATTR(pdde_op_input_dist_attr(g, eb, eb->nsrc - 1), MAP(dp, -1, -1), 0, 0);
    pdde_tensor *acc = accum_of(g, wte);
    CHECK_ATTR(&acc->src[1]->dist, MAP(tp, -1), rows, rows);
    CHECK_ATTR(pdde_op_input_dist_attr(g, acc, 1), MAP(tp, -1), rows, rows);
    /* the program gathers nothing (the logits above all) */
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    pdde_graph_dump_dist(g, f);
    fclose(f);
    CHECK(len > 0 && has(text, "cross_entropy") && !has(text, "allgather"), "the program has an allgather:\n%s", text);
    free(text);
}

static void test_gpt_dp(void) {
    gpt_model mdl;
    pdde_graph *g = gpt_graph(&mdl, 1);
    const pdde_mesh *m = mesh_1d(g, "dp");
    CHECK(!pdde_strategy_data_parallel(g, m, "dp") && !pdde_complete_dist_attrs(g), "dp: %s", pdde_last_error(ctx));
    CHECK_ATTR(&mdl.ids->dist, MAP(0, -1), 0, 0);
    CHECK_ATTR(&mdl.targets->dist, MAP(0), 0, 0);
    CHECK_ATTR(&mdl.logits->dist, MAP(0, -1), 0, 0);
    CHECK_ATTR(&mdl.loss->dist, MAP(-1), BIT(0), BIT(0)); /* a mean over the batch: partial-avg */
    CHECK_ATTR(pdde_op_input_dist_attr(g, mdl.loss, 0), MAP(0, -1), 0, 0);
    pdde_tensor *dlogits = consumer(g, mdl.logits, PDDE_OP_CROSS_ENTROPY_BACK, 0);
    CHECK(dlogits && dims_are(&dlogits->dist, MAP(0, -1)) && dlogits->dist.partial == 0 && dlogits->dist.partial_avg == BIT(0),
          "dlogits carries the mean marker: %s", dlogits ? str(&dlogits->dist) : "none");
    int n_params = 0, n_ok = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *p = pdde_graph_tensor(g, i);
        if (!(p->flags & PDDE_TENSOR_PARAM)) continue;
        n_params++;
        pdde_tensor *acc = accum_of(g, p), *u = update_of(g, p);
        const pdde_dist_attr *need = pdde_op_input_dist_attr(g, acc, 1);
        static const int none[PDDE_MAX_DIMS] = {-1, -1, -1, -1, -1, -1};
        /* every gradient backward produces is partial-avg on dp; the accumulator holds it so (the
         * micro-batches add up locally) and the update needs it replicated: one allreduce a step */
        int ok = acc && dims_are(&p->dist, none) && acc->src[1]->dist.partial == BIT(0) && acc->src[1]->dist.partial_avg == BIT(0) &&
                 need && dims_are(need, none) && need->partial == BIT(0) && need->partial_avg == BIT(0) &&
                 dims_are(&p->grad->dist, none) && p->grad->dist.partial == BIT(0) && u && dims_are(&u->dist, none) &&
                 dims_are(&u->src[2]->dist, none) && dims_are(&u->src[3]->dist, none) && dims_are(pdde_op_input_dist_attr(g, u, 1), none) &&
                 pdde_op_input_dist_attr(g, u, 1)->partial == 0;
        CHECK(ok, "%s: grad %s needs %s", p->name, acc ? str(&acc->src[1]->dist) : "?", need ? str(need) : "?");
        n_ok += ok;
    }
    CHECK(n_params == 4 + 12 * gpt_cfg.layers && n_ok == n_params, "%d of %d parameters", n_ok, n_params);
    /* the clipping norm: squares of replicated accumulators are whole */
    pdde_tensor *u = update_of(g, find(g, "wte"));
    CHECK_ATTR(&u->src[4]->dist, MAP(-1), 0, 0);
    CHECK(pdde_complete_conflict_count(g) == 0, "dp: no conflicts (%d)", pdde_complete_conflict_count(g));
    /* completion can run again and gives the same */
    pdde_dist_attr before = mdl.loss->dist;
    CHECK(!pdde_complete_dist_attrs(g) && !memcmp(&before, &mdl.loss->dist, sizeof before) && dims_are(&mdl.ids->dist, MAP(0, -1)), "again");
    pdde_graph_free(g);
}

static void test_gpt_tp(void) {
    gpt_model mdl;
    pdde_graph *g = gpt_graph(&mdl, 0);
    const pdde_mesh *m = mesh_1d(g, "tp");
    CHECK(!gpt_shard_tensor_parallel(g, m, "tp") && !pdde_complete_dist_attrs(g), "tp: %s", pdde_last_error(ctx));
    pdde_tensor *fcw = find(g, "h0.fc.w"), *fcb = find(g, "h0.fc.b"), *fpw = find(g, "h0.fcproj.w"), *pw = find(g, "h0.proj.w");
    CHECK_ATTR(&fcw->dist, MAP(-1, 0), 0, 0);
    CHECK_ATTR(&fcb->dist, MAP(0), 0, 0);
    CHECK_ATTR(&fpw->dist, MAP(0, -1), 0, 0);
    CHECK_ATTR(&pw->dist, MAP(0, -1), 0, 0);
    pdde_tensor *fc = consumer(g, fcw, PDDE_OP_MATMUL, 1), *fp = consumer(g, fpw, PDDE_OP_MATMUL, 1), *pr = consumer(g, pw, PDDE_OP_MATMUL, 1);
    CHECK_ATTR(&fc->dist, MAP(-1, -1, 0), 0, 0);
    CHECK_ATTR(&fp->dist, MAP(-1, -1, -1), BIT(0), 0);
    CHECK_ATTR(&pr->dist, MAP(-1, -1, -1), BIT(0), 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, pr, 0), MAP(-1, -1, 0), 0, 0); /* the attention output, sliced locally */
    /* the next layernorm (h1.ln1 after block 0's MLP) is an allreduce site */
    pdde_tensor *ln = consumer(g, find(g, "h1.ln1.g"), PDDE_OP_LAYERNORM, 1);
    CHECK(ln && ln->src[0]->dist.partial == BIT(0), "residual partial: %s", ln ? str(&ln->src[0]->dist) : "?");
    CHECK_ATTR(pdde_op_input_dist_attr(g, ln, 0), MAP(-1, -1, -1), 0, 0);
    /* backward: the column-parallel weight's gradient comes out split like the weight, whole */
    pdde_tensor *acc = accum_of(g, fcw);
    CHECK_ATTR(&acc->src[1]->dist, MAP(-1, 0), 0, 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, acc, 1), MAP(-1, 0), 0, 0);
    CHECK_ATTR(&accum_of(g, fpw)->src[1]->dist, MAP(0, -1), 0, 0);
    CHECK_ATTR(&accum_of(g, fcb)->src[1]->dist, MAP(0), 0, 0);
    /* fc's input gradient sums over the split hidden dim: partial on tp */
    pdde_tensor *dx = NULL;
    for (int i = fc->id + 1; i < pdde_graph_tensor_count(g) && !dx; i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_MATMUL && t->src[1] == fcw && t->phase == PDDE_PHASE_BACKWARD) dx = t;
    }
    CHECK(dx && dx->dist.partial == BIT(0) && dims_are(&dx->dist, MAP(-1, -1, -1)), "dx of fc: %s", dx ? str(&dx->dist) : "?");
    /* state follows the parameter */
    pdde_tensor *u = update_of(g, fcw);
    CHECK_ATTR(&u->dist, MAP(-1, 0), 0, 0);
    CHECK_ATTR(&find(g, "h0.fc.w.adam_m")->dist, MAP(-1, 0), 0, 0);
    check_head_parallel(g, -1, 0);
    check_vocab_parallel(g, &mdl, -1, 0);
    CHECK(pdde_complete_conflict_count(g) == 0, "tp: no conflicts (%d)", pdde_complete_conflict_count(g));
    pdde_graph_free(g);
}

static void test_gpt_zero3(void) {
    gpt_model mdl;
    pdde_graph *g = gpt_graph(&mdl, 1);
    const pdde_mesh *m = mesh_1d(g, "dp");
    CHECK(!pdde_strategy_data_parallel(g, m, "dp") && !pdde_strategy_zero(g, m, "dp", 3) && !pdde_complete_dist_attrs(g), "zero3: %s",
          pdde_last_error(ctx));
    int n_params = 0, n_ok = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *p = pdde_graph_tensor(g, i);
        if (!(p->flags & PDDE_TENSOR_PARAM)) continue;
        n_params++;
        /* every parameter of this model has an even dim 0: split there, with its gradient
         * accumulator and AdamW state; the gradient arrives by reduce-scatter (partial-avg -> split) */
        int want[PDDE_MAX_DIMS] = {0, -1, -1, -1, -1, -1};
        pdde_tensor *acc = accum_of(g, p), *u = update_of(g, p);
        const pdde_dist_attr *need = pdde_op_input_dist_attr(g, acc, 1);
        int ok = dims_are(&p->dist, want) && dims_are(&p->grad->dist, want) && dims_are(&u->src[2]->dist, want) &&
                 dims_are(&u->src[3]->dist, want) && dims_are(&u->dist, want) && need && dims_are(need, want) && need->partial == 0 &&
                 acc->src[1]->dist.partial == BIT(0) && acc->src[1]->dist.partial_avg == BIT(0);
        CHECK(ok, "%s %s: grad %s needs %s", p->name, str(&p->dist), str(&acc->src[1]->dist), need ? str(need) : "?");
        n_ok += ok;
    }
    CHECK(n_ok == n_params, "%d of %d parameters", n_ok, n_params);
    /* forward: the weight follows the activation (batch on dp): gathered, recorded as a conflict */
    pdde_tensor *fc = consumer(g, find(g, "h0.fc.w"), PDDE_OP_MATMUL, 1);
    CHECK_ATTR(pdde_op_input_dist_attr(g, fc, 1), MAP(-1, -1), 0, 0);
    CHECK_ATTR(&fc->dist, MAP(0, -1, -1), 0, 0);
    pdde_tensor *ln = consumer(g, find(g, "h0.ln1.g"), PDDE_OP_LAYERNORM, 1);
    CHECK_ATTR(pdde_op_input_dist_attr(g, ln, 1), MAP(-1), 0, 0);
    /* per layer 4 linear weights + 4 biases, twice (forward, and the backward's dx for weights), and
     * fc's bias a third time (bias_gelu's backward reads it); wte in the embedding, the head and its
     * backward; wpe's add */
    int n = pdde_complete_conflict_count(g), follows = 0;
    for (int i = 0; i < n; i++) follows += has(pdde_complete_conflict(g, i), "follows");
    CHECK(n == gpt_cfg.layers * 13 + 4 && follows == n, "%d conflicts, %d resolved by a rule", n, follows);
    /* the clipping norm of split gradients is partial over dp, reduced where the updates read it */
    pdde_tensor *u = update_of(g, find(g, "wte"));
    CHECK(u->src[4]->op == PDDE_OP_GRAD_NORM_SQ && u->src[4]->dist.partial == BIT(0), "norm partial: %s", str(&u->src[4]->dist));
    CHECK_ATTR(pdde_op_input_dist_attr(g, u, 4), MAP(-1), 0, 0);
    pdde_graph_free(g);
}

static void test_gpt_zero1(void) {
    gpt_model mdl;
    pdde_graph *g = gpt_graph(&mdl, 0);
    const pdde_mesh *m = mesh_1d(g, "dp");
    CHECK(!pdde_strategy_data_parallel(g, m, "dp") && !pdde_strategy_zero(g, m, "dp", 1) && !pdde_complete_dist_attrs(g), "zero1");
    pdde_tensor *w = find(g, "h0.fc.w"), *u = update_of(g, w);
    CHECK_ATTR(&w->dist, MAP(-1, -1), 0, 0);
    CHECK_ATTR(&w->grad->dist, MAP(-1, -1), BIT(0), BIT(0)); /* a step's sum, reduce-scattered for the update */
    CHECK_ATTR(&u->src[2]->dist, MAP(0, -1), 0, 0);
    /* the update runs on this rank's shard: parameter and gradient sliced, the result gathered back */
    CHECK_ATTR(&u->dist, MAP(0, -1), 0, 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, u, 0), MAP(0, -1), 0, 0);
    CHECK_ATTR(pdde_op_input_dist_attr(g, u, 1), MAP(0, -1), 0, 0);
    CHECK(pdde_complete_conflict_count(g) == 0, "zero1: no conflicts");
    pdde_graph_free(g);
}

static void test_gpt_dp_tp(void) {
    gpt_model mdl;
    pdde_graph *g = gpt_graph(&mdl, 0);
    const pdde_mesh *m = mesh_2x2(g);
    CHECK(!pdde_strategy_data_parallel(g, m, "dp") && !gpt_shard_tensor_parallel(g, m, "tp") && !pdde_complete_dist_attrs(g), "dp x tp: %s",
          pdde_last_error(ctx));
    pdde_tensor *fcw = find(g, "h1.fc.w"), *fpw = find(g, "h1.fcproj.w"), *lng = find(g, "h1.ln2.g");
    CHECK_ATTR(&mdl.ids->dist, MAP(DP, -1), 0, 0);
    CHECK_ATTR(&fcw->dist, MAP(-1, TP), 0, 0);
    CHECK_ATTR(&consumer(g, fcw, PDDE_OP_MATMUL, 1)->dist, MAP(DP, -1, TP), 0, 0);
    CHECK_ATTR(&consumer(g, fpw, PDDE_OP_MATMUL, 1)->dist, MAP(DP, -1, -1), BIT(TP), 0);
    CHECK_ATTR(&mdl.loss->dist, MAP(-1), BIT(DP), BIT(DP));
    /* weight gradients: partial-avg over dp (rows), already split like the weight over tp */
    pdde_tensor *acc = accum_of(g, fcw);
    CHECK_ATTR(&acc->src[1]->dist, MAP(-1, TP), BIT(DP), BIT(DP));
    CHECK_ATTR(pdde_op_input_dist_attr(g, acc, 1), MAP(-1, TP), BIT(DP), BIT(DP));
    CHECK_ATTR(pdde_op_input_dist_attr(g, update_of(g, fcw), 1), MAP(-1, TP), 0, 0);
    acc = accum_of(g, fpw);
    CHECK_ATTR(&acc->src[1]->dist, MAP(TP, -1), BIT(DP), BIT(DP));
    /* a layernorm gain after the row-parallel output: its gradient sums a tp-partial dy over dp
     * rows: partial on both, averaged on dp only */
    acc = accum_of(g, lng);
    CHECK_ATTR(&acc->src[1]->dist, MAP(-1), BIT(DP) | BIT(TP), BIT(DP));
    CHECK_ATTR(pdde_op_input_dist_attr(g, acc, 1), MAP(-1), BIT(DP) | BIT(TP), BIT(DP));
    CHECK_ATTR(pdde_op_input_dist_attr(g, update_of(g, lng), 1), MAP(-1), 0, 0);
    check_head_parallel(g, DP, TP);
    check_vocab_parallel(g, &mdl, DP, TP);
    CHECK(pdde_complete_conflict_count(g) == 0, "dp x tp: no conflicts (%d)", pdde_complete_conflict_count(g));
    pdde_graph_free(g);
}

/* Pipeline: a dp x pp mesh, the layers cut into two stages. Each op runs on its stage's slice of the
 * mesh, parameters and their state live there, data-parallel annotations on the whole mesh are seen
 * from the slice, and tensors crossing stages (the residual stream, the tied embedding, the targets)
 * are required on the consumer's stage: send/recv. */
static void test_gpt_pp(void) {
    gpt_model mdl;
    pdde_graph *g = gpt_graph(&mdl, 1);
    const pdde_mesh *m = pdde_mesh_create(g, 2, (int[]){2, 2}, NAMES("dp", "pp"), NULL);
    CHECK(pdde_strategy_pipeline(g, m, "pp", 1) == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), "1 layers cannot fill 2 stages"),
          "too few layers: %s", pdde_last_error(ctx));
    CHECK(pdde_strategy_pipeline(g, m, "tp", 4) == PDDE_ERR_DIST_ATTR, "no such axis");
    const pdde_mesh *other = pdde_mesh_create(g, 1, (int[]){2}, NAMES("x"), NULL);
    CHECK(pdde_graph_set_layer_mesh(g, 0, 1, other) == PDDE_ERR_DIST_ATTR && has(pdde_last_error(ctx), "slice"),
          "a mesh that is not a slice of the graph's: %s", pdde_last_error(ctx));
    CHECK(!pdde_strategy_data_parallel(g, m, "dp") && !pdde_strategy_pipeline(g, m, "pp", gpt_cfg.layers + 2) && !pdde_complete_dist_attrs(g),
          "dp x pp: %s", pdde_last_error(ctx));
    /* stage 0 = the slice pp=0: ranks 0 and 2 (row-major dp x pp); stage 1: ranks 1 and 3 */
    const pdde_mesh *s0 = find(g, "wte")->dist.mesh, *s1 = find(g, "lnf.g")->dist.mesh;
    CHECK(s0 && s0->n_ranks == 2 && s0->ranks[0] == 0 && s0->ranks[1] == 2 && s1 && s1->ranks[0] == 1 && s1->ranks[1] == 3,
          "stages: wte on %s, lnf on %s", str(&find(g, "wte")->dist), str(&find(g, "lnf.g")->dist));
    char last[32];
    snprintf(last, sizeof last, "h%d.fc.w", gpt_cfg.layers - 1);
    pdde_tensor *w = find(g, last), *u = update_of(g, w);
    CHECK(w->dist.mesh == s1 && u && u->dist.mesh == s1 && u->src[2]->dist.mesh == s1 && w->grad->dist.mesh == s1,
          "%s, its update, state and gradient on stage 1: %s", last, u ? str(&u->src[2]->dist) : "?");
    CHECK_ATTR(&mdl.ids->dist, MAP(0, -1), 0, 0); /* split over dp, seen on the slice */
    CHECK(mdl.ids->dist.mesh == s0, "ids on stage 0: %s", str(&mdl.ids->dist));
    CHECK(mdl.loss->dist.mesh == s1 && mdl.loss->dist.partial == BIT(0), "the loss on stage 1, a pending mean over dp: %s", str(&mdl.loss->dist));
    const pdde_dist_attr *need = pdde_op_input_dist_attr(g, mdl.loss, 1);
    CHECK(need && need->mesh == s1 && mdl.targets->dist.mesh == s0 && dims_are(need, MAP(0)), "targets cross to stage 1: %s",
          need ? str(need) : "?");
    /* the tied head reads wte from stage 0 */
    const pdde_dist_attr *wte_need = pdde_op_input_dist_attr(g, mdl.logits, 1);
    CHECK(wte_need && wte_need->mesh == s1, "the head wants wte on stage 1: %s", wte_need ? str(wte_need) : "?");
    char *dump = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&dump, &len);
    pdde_graph_dump_dist(g, f);
    fclose(f);
    CHECK(has(dump, "mesh[2]@1,3 dims[dp") && has(dump, "[send/recv]"), "the dump names the stages and the send/recv");
    free(dump);
    pdde_graph_free(g);
}

int main(void) {
    if (pdde_context_init(NULL, &ctx)) return 1;
    test_mesh();
    test_bad_annotations();
    test_attr_str();
    test_matmul_chain();
    test_mlp();
    test_attention();
    test_misc_rules();
    test_rope_rule();
    test_gpt_dp();
    test_gpt_tp();
    test_gpt_zero3();
    test_gpt_zero1();
    test_gpt_dp_tp();
    test_gpt_pp();
    pdde_context_free(ctx);
    return test_finish();
}
