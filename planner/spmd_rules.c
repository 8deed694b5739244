/* planner/spmd_rules.c — SPMD rules: for each op family, from the dist attrs its inputs arrive with,
 * the attr of its output and the attr it requires of each input (Paddle's spmd_rules). One small
 * function per family; spmd_rules[] maps every op to one.
 *
 * Most rules are written in einsum style, as Paddle's are: an operand's dims get letters, the same
 * letter on two operands being the same index ("bmk,kn->bmn" is a batched matmul). Merging the
 * inputs' mappings letter by letter gives each letter one mesh axis (or none); each input is then
 * required with its letters' axes (a replicated input meeting a split letter takes a free local
 * slice), the output gets its letters' axes, and a split letter that the output lacks was summed
 * over: the output is partial on that axis. '1' marks a broadcast size-1 dim (never split).
 *
 * Partial inputs: an op linear in an input (matmul, scale, reshape, the backward ops in dy) may take
 * it partial and pass the partial on; anything else requires it reduced first. Ops that add their
 * inputs (add, sub, concat) need them partial on the same axes: a replicated one becomes partial for
 * free (kept on one rank of the axis, zeros on the others), so a residual add after a row-parallel
 * matmul stays partial and the allreduce happens where a non-linear op (the next layernorm) needs the
 * full value. */

#include "planner_impl.h"


/* Records a conflict that a rule resolved; the message says which input gave way and why. */
static void spmd_conflict(spmd_ctx *c, int input, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void spmd_conflict(spmd_ctx *c, int input, const char *fmt, ...) {
    struct planner_graph *pg = c->pg;
    if (pg->n_conflicts == pg->cap_conflicts) {
        int cap = pg->cap_conflicts ? 2 * pg->cap_conflicts : 16;
        planner_conflict *p = realloc(pg->conflicts, (size_t)cap * sizeof *p);
        if (!p) { pg->oom = true; return; }
        pg->conflicts = p, pg->cap_conflicts = cap;
    }
    planner_conflict *r = &pg->conflicts[pg->n_conflicts++];
    r->node = c->node->id, r->input = input;
    int k = snprintf(r->msg, sizeof r->msg, "%s %s input %d (%s): ", pdde_op_name(c->node->op), c->node->name, input,
                     c->node->src[input]->name);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < sizeof r->msg) vsnprintf(r->msg + k, sizeof r->msg - (size_t)k, fmt, ap);
    va_end(ap);
}

static const char *spmd_axis(const spmd_ctx *c, int axis) { return attr_axis_name(c->mesh, axis); }

/* ---- letters ---- */

static void spmd_letters(char *dst, int ndim, char first) {
    if (ndim > PDDE_MAX_DIMS) ndim = PDDE_MAX_DIMS; /* (graph building guarantees it; tells the compiler) */
    for (int i = 0; i < ndim; i++) dst[i] = (char)(first + i);
    dst[ndim] = 0;
}

/* Letters of t broadcast onto `like` (right-aligned, numpy style): t's dim takes the letter of
 * like's dim, or '1' where t has size 1 and like does not. */
static void spmd_letters_broadcast(char *dst, const pdde_tensor *t, const pdde_tensor *like, const char *like_letters) {
    int off = like->ndim - t->ndim, nd = t->ndim < PDDE_MAX_DIMS ? t->ndim : PDDE_MAX_DIMS;
    for (int i = 0; i < nd; i++)
        dst[i] = t->shape[i] == 1 && like->shape[off + i] != 1 ? '1' : like_letters[off + i];
    dst[nd] = 0;
}

/* Every input of the op gets the same letters as the output (same-shape elementwise ops). */
static void spmd_letters_same(spmd_ctx *c) {
    spmd_letters(c->out_dims, c->node->ndim, 'a');
    for (int k = 0; k < c->nsrc; k++) spmd_letters_broadcast(c->dims[k], c->node->src[k], c->node, c->out_dims);
}

static void spmd_pin(spmd_ctx *c, char letter) { c->axis_of[(int)letter] = SPMD_PINNED; }

/* The letter of the last dim of letters (a 0-d tensor has none: '1', never split anyway). */
static char spmd_last(const char *letters) { size_t n = strlen(letters); return n ? letters[n - 1] : '1'; }

/* ---- merging ---- */

/* Gives each letter an axis, walking n inputs in priority order (order = NULL: 0, 1, ...). The
 * first split seen wins; a later input that splits the letter over another axis, or splits another
 * letter over an axis already taken, gives way (it is required with the winner's layout) and the
 * conflict is recorded. A letter only replicated so far takes a later input's split (the replicated
 * input then takes a local slice: no conflict). */
static void spmd_merge(spmd_ctx *c, const int *order, int n) {
    for (int i = 0; i < n; i++) {
        int k = order ? order[i] : i;
        const char *L = c->dims[k];
        for (int d = 0; L[d]; d++) {
            int ax = c->in[k].dims_mapping[d], l = L[d];
            if (ax < 0 || l == '1' || c->axis_of[l] == SPMD_PINNED || c->axis_of[l] == ax) continue;
            if (c->axis_of[l] >= 0) {
                spmd_conflict(c, k, "dim %d is split over %s but input %d (%s) dim %d over %s; input %d follows input %d",
                              d, spmd_axis(c, ax), c->owner_in[l], c->node->src[c->owner_in[l]]->name, c->owner_dim[l],
                              spmd_axis(c, c->axis_of[l]), k, c->owner_in[l]);
            } else if (c->letter_of_axis[ax]) {
                int o = c->letter_of_axis[ax];
                spmd_conflict(c, k, "dim %d is split over %s, which already splits input %d (%s) dim %d; input %d follows input %d",
                              d, spmd_axis(c, ax), c->owner_in[o], c->node->src[c->owner_in[o]]->name, c->owner_dim[o], k,
                              c->owner_in[o]);
            } else {
                c->axis_of[l] = (int8_t)ax, c->letter_of_axis[ax] = (char)l;
                c->owner_in[l] = (int8_t)k, c->owner_dim[l] = (int8_t)d;
            }
        }
    }
}

static int spmd_letter_axis(const spmd_ctx *c, char l) {
    int ax = l == '1' ? -1 : c->axis_of[(int)l];
    return ax == SPMD_PINNED ? -1 : ax;
}

/* Writes the requirements and the output from the merged letters, and resolves partial inputs
 * (see the top of the file). The output is partial on every split letter it lacks. */
static void spmd_finish(spmd_ctx *c, const int *order) {
    unsigned out_axes = 0, contracted = 0, taken = 0;
    c->out = attr_replicated(c->mesh, c->node->ndim);
    for (int d = 0; c->out_dims[d]; d++) {
        int ax = spmd_letter_axis(c, c->out_dims[d]);
        c->out.dims_mapping[d] = (int8_t)ax;
        if (ax >= 0) out_axes |= 1u << ax;
    }
    for (int i = 0; i < c->nsrc; i++) {
        int k = order ? order[i] : i;
        pdde_dist_attr *r = &c->req[k];
        *r = attr_replicated(c->mesh, c->node->src[k]->ndim);
        for (int d = 0; c->dims[k][d]; d++) {
            int ax = spmd_letter_axis(c, c->dims[k][d]);
            r->dims_mapping[d] = (int8_t)ax;
            if (ax >= 0 && !strchr(c->out_dims, c->dims[k][d])) contracted |= 1u << ax;
        }
        /* a tensor is never partial over an axis it (or the output) is split over */
        unsigned keep = c->linear >> k & 1 ? c->in[k].partial & ~out_axes & ~attr_split_axes(r) : 0;
        if (!c->additive) {
            /* a pending average times another factor's mean marker (a local mean's gradient): the
             * product would need both divisions by the axis size and its reduction gives one, so
             * the average is reduced first */
            unsigned marked = 0;
            for (int j = 0; j < c->nsrc; j++)
                if (j != k) marked |= c->in[j].partial_avg & ~c->in[j].partial;
            keep &= ~(c->in[k].partial_avg & marked);
            keep &= ~taken, taken |= keep; /* x*y: one partial factor per axis */
        }
        r->partial = (uint8_t)keep;
        /* reducing a partial gives true values: their mean marker goes */
        r->partial_avg = (uint8_t)(c->in[k].partial_avg & ~(c->in[k].partial & ~keep));
    }
    if (c->additive) {
        /* one partial for all: the union, except axes summed by some and averaged by others */
        unsigned p = 0, avg = 0, sum = 0;
        for (int k = 0; k < c->nsrc; k++)
            if (c->linear >> k & 1) p |= c->req[k].partial, avg |= c->req[k].partial & c->req[k].partial_avg,
                                    sum |= c->req[k].partial & ~c->req[k].partial_avg;
        p &= ~(avg & sum);
        for (int k = 0; k < c->nsrc; k++) {
            if (!(c->linear >> k & 1)) continue;
            pdde_dist_attr *r = &c->req[k];
            unsigned dropped = r->partial & ~p;
            r->partial_avg = (uint8_t)((r->partial_avg & ~dropped & ~p) | (avg & p));
            r->partial = (uint8_t)(p & ~attr_split_axes(r));
        }
    }
    for (int k = 0; k < c->nsrc; k++) c->out.partial |= c->req[k].partial, c->out.partial_avg |= c->req[k].partial_avg;
    c->out.partial |= (uint8_t)contracted;
    c->out.partial_avg |= (uint8_t)(contracted & c->avg_reduce);
}

static void spmd_einsum(spmd_ctx *c, const int *order) {
    spmd_merge(c, order, c->nsrc);
    spmd_finish(c, order);
}

/* Data-parallel groups (pdde_strategy_data_parallel_groups): the group axis splits the batch outside
 * the batch axis, without a layout. Whatever a rule made pending or marked over the batch axis (it
 * reduced the batch there: a loss, a weight gradient, the mean marker of a local mean's gradient) is
 * so over the group axis too; nothing else crosses the groups. Its mask on c's mesh (0: no groups). */
static unsigned spmd_group_axes(const spmd_ctx *c) {
    if (!c->pg || !c->pg->group_axis[0] || !c->mesh) return 0;
    int gax = pdde_mesh_axis(c->mesh, c->pg->group_axis);
    return gax < 0 ? 0 : 1u << gax;
}

static void spmd_groups(spmd_ctx *c) {
    unsigned gbit = spmd_group_axes(c);
    int bax = gbit ? pdde_mesh_axis(c->mesh, c->pg->batch_axis) : -1;
    if (bax < 0) return;
    /* an input reduced over the groups here holds the same values in every group (a reduced gradient:
     * its norm's partial over the batch axis sums experts, not the batch); one split over the group
     * axis (a gradient's ZeRO shard) was reduced there too */
    c->out_group_local = false;
    for (int k = 0; k < c->nsrc; k++)
        if ((c->group_local >> k & 1) && !((c->in[k].partial & gbit) && !(c->req[k].partial & gbit)) && !(attr_split_axes(&c->req[k]) & gbit))
            c->out_group_local = true;
    if (!c->out_group_local) return;
    if (c->out.partial >> bax & 1) c->out.partial |= (uint8_t)gbit;
    if (c->out.partial_avg >> bax & 1) c->out.partial_avg |= (uint8_t)gbit;
}

/* Data-parallel groups: an input holding its group's own rows (the data and what follows from it, not
 * laid out or pending over the group axis) is split over the group axis without saying so. The mask
 * of such inputs (0: none, or no groups). */
static unsigned spmd_group_rows(const spmd_ctx *c) {
    unsigned gbit = spmd_group_axes(c), rows = 0;
    for (int k = 0; k < c->nsrc && gbit; k++)
        if ((c->group_local >> k & 1) && !((attr_split_axes(&c->in[k]) | c->in[k].partial) & gbit)) rows |= 1u << k;
    return rows;
}

/* Then no other input may split a dim over that axis here (ZeRO-3's parameters, split over every data
 * axis): the rule sees those inputs whole on it and requires them so (gathered before use). */
static void spmd_group_reserve(spmd_ctx *c) {
    unsigned gbit = spmd_group_axes(c), rows = spmd_group_rows(c);
    for (int k = 0; k < c->nsrc && rows; k++)
        for (int d = 0; !(rows >> k & 1) && d < c->in[k].ndim; d++)
            if (c->in[k].dims_mapping[d] >= 0 && (gbit >> c->in[k].dims_mapping[d] & 1)) c->in[k].dims_mapping[d] = -1;
}

/* ---- the rules ---- */

/* add, sub: numpy broadcasting of src1 onto src0; the inputs are added (one shared partial) */
static void spmd_rule_add(spmd_ctx *c) {
    spmd_letters_same(c);
    c->linear = 3, c->additive = true;
    spmd_einsum(c, NULL);
}

/* mul: linear in each factor, but only one of them may be partial on an axis */
static void spmd_rule_mul(spmd_ctx *c) {
    spmd_letters_same(c);
    c->linear = 3;
    spmd_einsum(c, NULL);
}

/* scale, cast, copy, dropout_back, collectives: the layout passes through, partial included */
static void spmd_rule_follow_linear(spmd_ctx *c) {
    spmd_letters_same(c);
    c->linear = 1;
    spmd_einsum(c, NULL);
}

/* gelu, relu, silu, dropout: the layout passes through; a partial input is reduced first */
static void spmd_rule_follow(spmd_ctx *c) {
    spmd_letters_same(c);
    spmd_einsum(c, NULL);
}

/* gelu_back, relu_back, silu_back (x, dy), bias_gelu_back (x, bias, dy): elementwise (a bias
 * broadcast), linear in dy, the last input */
static void spmd_rule_act_back(spmd_ctx *c) {
    spmd_letters_same(c);
    c->linear = 1u << (c->nsrc - 1);
    spmd_einsum(c, NULL);
}

/* layernorm (x, gamma, beta), rmsnorm (x, gamma): the normalised last dim needs whole rows, so it is
 * required replicated; gamma and beta too. Rows keep x's layout. */
static void spmd_rule_norm(spmd_ctx *c) {
    const pdde_tensor *x = c->node->src[0];
    spmd_letters(c->out_dims, x->ndim, 'a');
    char last = spmd_last(c->out_dims);
    strcpy(c->dims[0], c->out_dims);
    for (int k = 1; k < c->nsrc; k++) c->dims[k][0] = last, c->dims[k][1] = 0;
    spmd_pin(c, last);
    spmd_einsum(c, NULL);
}

/* layernorm_back, rmsnorm_back (x, gamma, dy) -> dx: as the forward; linear in dy */
static void spmd_rule_norm_back(spmd_ctx *c) {
    const pdde_tensor *x = c->node->src[0];
    spmd_letters(c->out_dims, x->ndim, 'a');
    char last = spmd_last(c->out_dims);
    strcpy(c->dims[0], c->out_dims), strcpy(c->dims[2], c->out_dims);
    c->dims[1][0] = last, c->dims[1][1] = 0;
    spmd_pin(c, last);
    c->linear = 4;
    spmd_einsum(c, NULL);
}

/* layernorm_back_gamma, rmsnorm_back_gamma (x, dy) -> dgamma [C]: a sum over the rows, so rows split
 * over an axis make dgamma partial on it; linear in dy */
static void spmd_rule_norm_back_gamma(spmd_ctx *c) {
    const pdde_tensor *x = c->node->src[0];
    spmd_letters(c->dims[0], x->ndim, 'a');
    strcpy(c->dims[1], c->dims[0]);
    c->out_dims[0] = spmd_last(c->dims[0]), c->out_dims[1] = 0;
    spmd_pin(c, c->out_dims[0]);
    c->linear = 2;
    spmd_einsum(c, NULL);
}

/* rope (x [B,T,H,D]): batch and heads are independent; a row's angle is its position in the whole T and
 * it pairs columns D/2 apart, so T and D stay whole. Linear in x. */
static void spmd_rule_rope(spmd_ctx *c) {
    spmd_letters_same(c);
    spmd_pin(c, 'b'), spmd_pin(c, 'd');
    c->linear = 1;
    spmd_einsum(c, NULL);
}

/* softmax: over the last dim, required replicated */
static void spmd_rule_softmax(spmd_ctx *c) {
    spmd_letters_same(c);
    spmd_pin(c, spmd_last(c->out_dims));
    spmd_einsum(c, NULL);
}

/* softmax_back (y, dy): as the forward; linear in dy */
static void spmd_rule_softmax_back(spmd_ctx *c) {
    spmd_letters_same(c);
    spmd_pin(c, spmd_last(c->out_dims));
    c->linear = 2;
    spmd_einsum(c, NULL);
}

/* attention (q, k, v [B,H,T,D]) -> [B,H,T,D+1]: batch and heads are independent (data and head
 * parallel); a row needs every key and the whole head dim, so T and D stay whole. The starts of
 * pdde_attention_docs (the last source, [B,T]) follow the batch's split. */
/* The packed form (pdde_attention_qkv): qkv [B,T,H*3D] -> [B,T,H*D], head-major, so a split of the last
 * dim is a split over whole heads in both (the strategy splits on head boundaries) */
static bool spmd_attention_packed(spmd_ctx *c) {
    if (pdde_op_i32(c->node, PDDE_P_ATTENTION_QKV_D) <= 0) return false;
    for (int k = 0; k < c->node->nsrc; k++) strcpy(c->dims[k], "bth");
    if (pdde_attention_starts(c->node)) strcpy(c->dims[c->node->nsrc - 1], "bt");
    strcpy(c->out_dims, "bth");
    spmd_pin(c, 't');
    if (c->node->op == PDDE_OP_ATTENTION_BACK) c->linear = 1u << 2; /* linear in dy */
    spmd_einsum(c, NULL);
    return true;
}

static void spmd_rule_attention(spmd_ctx *c) {
    if (spmd_attention_packed(c)) return;
    for (int k = 0; k < 3; k++) strcpy(c->dims[k], "bhtd");
    if (pdde_attention_starts(c->node)) strcpy(c->dims[3], "bt");
    strcpy(c->out_dims, "bhte");
    spmd_pin(c, 't'), spmd_pin(c, 'd');
    spmd_einsum(c, NULL);
}

/* attention_back (q, k, v, y, dy[, starts]) -> [3,B,H,T,D] (dq, dk, dv): as the forward; linear in dy */
static void spmd_rule_attention_back(spmd_ctx *c) {
    if (spmd_attention_packed(c)) return;
    for (int k = 0; k < 3; k++) strcpy(c->dims[k], "bhtd");
    strcpy(c->dims[3], "bhte"), strcpy(c->dims[4], "bhte");
    if (pdde_attention_starts(c->node)) strcpy(c->dims[5], "bt");
    strcpy(c->out_dims, "xbhtd");
    spmd_pin(c, 't'), spmd_pin(c, 'd'), spmd_pin(c, 'e');
    c->linear = 1u << 4;
    spmd_einsum(c, NULL);
}

/* The activation of a matmul: src0, unless src0 is a parameter (or state) and src1 is not. */
static int spmd_matmul_weight(const pdde_tensor *y) {
    const pdde_tensor *a = y->src[0], *b = y->src[1];
    bool a_w = a->op == PDDE_OP_NONE && (a->flags & (PDDE_TENSOR_PARAM | PDDE_TENSOR_STATE));
    bool b_w = b->op == PDDE_OP_NONE && (b->flags & (PDDE_TENSOR_PARAM | PDDE_TENSOR_STATE));
    return a_w && !b_w ? 0 : 1;
}

/* matmul [..,M,K] x [..,K,N] (transposes, batched, a 2-D operand shared over the batch): batch dims
 * merge, M and N follow their operand, K split on one axis in both makes the output partial on it.
 * Where the two disagree, the weight follows the activation (e.g. ZeRO-3's weight, split over the
 * batch axis, is gathered). */
static void spmd_rule_matmul(spmd_ctx *c) {
    const pdde_tensor *y = c->node, *a = y->src[0], *b = y->src[1];
    int ta = pdde_op_i32(y, PDDE_P_MATMUL_TRANS_A), tb = pdde_op_i32(y, PDDE_P_MATMUL_TRANS_B), nb = y->ndim - 2;
    spmd_letters(c->out_dims, nb, 'a');
    c->out_dims[nb] = 'm', c->out_dims[nb + 1] = 'n', c->out_dims[nb + 2] = 0;
    /* an operand's batch dims are the output's (2-D operands have none) */
    spmd_letters(c->dims[0], a->ndim - 2, 'a');
    spmd_letters(c->dims[1], b->ndim - 2, 'a');
    strcpy(c->dims[0] + a->ndim - 2, ta ? "km" : "mk");
    strcpy(c->dims[1] + b->ndim - 2, tb ? "nk" : "kn");
    int w = spmd_matmul_weight(y), order[2] = {1 - w, w};
    c->linear = 3;
    spmd_einsum(c, order);
}

/* The logits' vocab dim of a cross-entropy (and its backward) may stay split over an axis (a
 * vocab-parallel tied head): the op's distributed form (Megatron's, Paddle's
 * c_softmax_with_cross_entropy; run by the executor, run_cross_entropy_vocab in core/session.c) reduces each
 * row's max and sum of exponentials over that axis inside, so no rank needs whole rows and nothing
 * the op gives is partial over it. Clears that axis from the loss's partial bits (the backward's
 * dlogits keeps the split, so it is never partial there anyway). */
static void spmd_vocab_reduced_inside(spmd_ctx *c) {
    int v = spmd_letter_axis(c, 'v');
    if (v < 0) return;
    c->out.partial &= (uint8_t)~(1u << v);
    c->out.partial_avg &= (uint8_t)~(1u << v);
}

/* cross_entropy (logits [N,V], targets [N]) -> the mean loss: rows split over an axis make the loss
 * partial with an average over it (a mean of the ranks' means: ignored targets aside, an exact mean
 * of equal shards); a vocab split over another axis gives a loss whole over it (see above). */
static void spmd_rule_cross_entropy(spmd_ctx *c) {
    strcpy(c->dims[0], "nv"), strcpy(c->dims[1], "n"), strcpy(c->out_dims, "1");
    c->avg_reduce = ~0u;
    spmd_einsum(c, NULL);
    spmd_vocab_reduced_inside(c);
}

/* cross_entropy_back (logits, targets, dloss) -> dlogits: rows and vocab as the forward (dlogits
 * split like the logits); each rank divides by its own row count, so dlogits carries a mean marker
 * on the rows' axis (pdde_dist_attr): the weight gradients summing those rows are then averaged over
 * it — data parallelism's average. */
static void spmd_rule_cross_entropy_back(spmd_ctx *c) {
    strcpy(c->dims[0], "nv"), strcpy(c->dims[1], "n"), strcpy(c->dims[2], "1"), strcpy(c->out_dims, "nv");
    c->linear = 4;
    spmd_einsum(c, NULL);
    if (c->out.dims_mapping[0] >= 0) c->out.partial_avg |= (uint8_t)(1u << c->out.dims_mapping[0]);
}

/* embedding (table [V,C], ids [...]) -> [...,C]: ids' layout carries to the output; a table split
 * over the vocab gives partial rows (each rank looks up its own range, zeros elsewhere: the
 * vocab-parallel embedding); where they disagree the table follows the ids. */
static void spmd_rule_embedding(spmd_ctx *c) {
    const pdde_tensor *ids = c->node->src[1];
    strcpy(c->dims[0], "VC");
    spmd_letters(c->dims[1], ids->ndim, 'a');
    strcpy(c->out_dims, c->dims[1]), strcat(c->out_dims, "C");
    static const int order[2] = {1, 0};
    spmd_einsum(c, order);
}

/* The table whose gradient an embedding_back computes: the forward embedding reading the same ids. */
static const pdde_tensor *spmd_embedding_table(const pdde_graph *g, const pdde_tensor *ids) {
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i]->op == PDDE_OP_EMBEDDING && g->nodes[i]->src[1] == ids) return g->nodes[i]->src[0];
    return NULL;
}

/* embedding_back ([base,] ids, dy) -> dtable [V,C] = base + scatter-add of dy's rows: summing rows
 * split over an axis makes it partial there (data parallel: the table's gradient is reduced like any
 * other); the vocab dim keeps the table's split (each rank scatters into its own range). base is
 * added, so it is required with the same partial. */
static void spmd_rule_embedding_back(spmd_ctx *c, const pdde_graph *g) {
    int nb = c->nsrc == 3, ids_k = nb, dy_k = nb + 1;
    const pdde_tensor *ids = c->node->src[ids_k], *table = spmd_embedding_table(g, ids);
    spmd_letters(c->dims[ids_k], ids->ndim, 'a');
    strcpy(c->dims[dy_k], c->dims[ids_k]), strcat(c->dims[dy_k], "C");
    strcpy(c->out_dims, "VC");
    if (nb) strcpy(c->dims[0], "VC");
    /* the ids and dy first; then the vocab dim takes the table's split if that axis is still free
     * (else the gradient comes out whole over it and its accumulation slices it), then base */
    int order[3] = {ids_k, dy_k, 0};
    spmd_merge(c, order, 2);
    int ax = table && mesh_same(table->dist.mesh, c->mesh) ? table->dist.dims_mapping[0] : -1;
    if (ax >= 0 && !c->letter_of_axis[ax] && !(spmd_group_rows(c) && (spmd_group_axes(c) >> ax & 1))) /* (the ids' group axis: not free) */
        c->axis_of['V'] = (int8_t)ax, c->letter_of_axis[ax] = 'V', c->owner_in['V'] = (int8_t)ids_k, c->owner_dim['V'] = 0;
    if (nb) spmd_merge(c, order + 2, 1);
    c->linear = 1u << dy_k | (nb ? 1u : 0u);
    spmd_finish(c, order);
    if (nb) { /* base + contributions: the same pending reduction */
        c->req[0].partial_avg = (uint8_t)((c->req[0].partial_avg & ~c->out.partial) | (c->out.partial_avg & c->out.partial));
        c->req[0].partial = c->out.partial;
    }
}

/* The output dim that starts at flat prefix `prefix` (the product of the dims before it) and that an
 * axis of size n divides, or -1. */
static int spmd_reshape_dim_at(const pdde_tensor *y, int64_t prefix, int n) {
    int64_t p = 1;
    for (int j = 0; j < y->ndim; p *= y->shape[j], j++)
        if (p == prefix && y->shape[j] % n == 0 && (y->shape[j] > 1 || n == 1)) return j;
    return -1;
}

/* reshape: a split dim carries to the output dim that starts at the same flat offset when the axis
 * divides it ([B,T]->[B*T], [B*T,C]->[B,T,C], [B,T,C]->[B,T,H,D] with C split: H split; a fused
 * head-major [B,T,3C]->[B,T,H,3,D] likewise). Both then cut each run of elements behind that offset
 * into the same n contiguous blocks, so no data moves. A split dim with no such counterpart (the split
 * would land on an inner factor) is gathered first. Partial passes through. */
static void spmd_rule_reshape(spmd_ctx *c) {
    const pdde_tensor *x = c->node->src[0], *y = c->node;
    c->req[0] = c->in[0];
    c->out = attr_replicated(c->mesh, y->ndim);
    c->out.partial = c->in[0].partial, c->out.partial_avg = c->in[0].partial_avg;
    int64_t prefix = 1;
    for (int i = 0; i < x->ndim; prefix *= x->shape[i], i++) {
        int ax = c->in[0].dims_mapping[i];
        if (ax < 0) continue;
        int j = spmd_reshape_dim_at(y, prefix, c->mesh->shape[ax]);
        if (j >= 0 && c->out.dims_mapping[j] < 0) c->out.dims_mapping[j] = (int8_t)ax;
        else c->req[0].dims_mapping[i] = -1;
    }
}

/* permute: output dim i is input dim perm[i] */
static void spmd_rule_permute(spmd_ctx *c) {
    const pdde_tensor *y = c->node;
    spmd_letters(c->dims[0], y->ndim, 'a');
    for (int i = 0; i < y->ndim; i++) c->out_dims[i] = (char)('a' + pdde_op_i32(y, PDDE_P_PERMUTE_DIM0 + i));
    c->out_dims[y->ndim] = 0;
    c->linear = 1;
    spmd_einsum(c, NULL);
}

/* concat: the cut axis is required replicated; the inputs are laid side by side (one partial) */
static void spmd_rule_concat(spmd_ctx *c) {
    spmd_letters_same(c);
    spmd_pin(c, c->out_dims[pdde_op_i32(c->node, PDDE_P_CONCAT_AXIS)]);
    c->linear = (1u << c->nsrc) - 1, c->additive = true;
    spmd_einsum(c, NULL);
}

/* slice, slice_back: the cut axis is required replicated */
static void spmd_rule_slice(spmd_ctx *c) {
    spmd_letters_same(c);
    spmd_pin(c, c->out_dims[pdde_op_i32(c->node, PDDE_P_SLICE_AXIS)]);
    c->linear = 1;
    spmd_einsum(c, NULL);
}

/* sum, mean over one axis or all: a reduced split dim makes the output partial (a mean: averaged) */
static void spmd_rule_reduce(spmd_ctx *c) {
    const pdde_tensor *x = c->node->src[0], *y = c->node;
    int axis = pdde_op_i32(y, PDDE_P_REDUCE_AXIS), keep = pdde_op_i32(y, PDDE_P_REDUCE_KEEPDIM), nd = 0;
    spmd_letters(c->dims[0], x->ndim, 'a');
    for (int i = 0; i < x->ndim; i++) {
        bool reduced = axis == -1 || i == axis;
        if (!reduced) c->out_dims[nd++] = c->dims[0][i];
        else if (keep) c->out_dims[nd++] = '1';
    }
    while (nd < y->ndim) c->out_dims[nd++] = '1'; /* a full reduction is [1] */
    c->out_dims[nd] = 0;
    c->linear = 1;
    c->avg_reduce = y->op == PDDE_OP_MEAN ? ~0u : 0;
    spmd_einsum(c, NULL);
}

/* sum_to (dy -> the broadcast input's shape): the summed dims, split, make the output partial */
static void spmd_rule_sum_to(spmd_ctx *c) {
    const pdde_tensor *dy = c->node->src[0], *y = c->node;
    spmd_letters(c->dims[0], dy->ndim, 'a');
    int off = dy->ndim - y->ndim;
    for (int i = 0; i < y->ndim; i++) c->out_dims[i] = y->shape[i] == 1 && dy->shape[off + i] != 1 ? '1' : c->dims[0][off + i];
    c->out_dims[y->ndim] = 0;
    c->linear = 1;
    spmd_einsum(c, NULL);
}

/* expand (a reduction's gradient, broadcast back): kept dims follow, the broadcast ones are replicated
 * (consumers split them by a local slice). Partition contract: a mean's gradient carrying the mean
 * marker on axis a (avg{a}: each rank differentiates its own mean) is scaled by the local count, i.e.
 * its PDDE_P_SCALE (1/global count) times the size of a. */
static void spmd_rule_expand(spmd_ctx *c) {
    const pdde_tensor *x = c->node->src[0], *y = c->node;
    spmd_letters(c->out_dims, y->ndim, 'a');
    for (int i = 0; i < x->ndim; i++) c->dims[0][i] = x->shape[i] == 1 && y->shape[i] != 1 ? '1' : c->out_dims[i];
    c->dims[0][x->ndim] = 0;
    c->linear = 1;
    spmd_einsum(c, NULL);
}

/* grad_accum (acc, g): the accumulator (persistent, following its parameter) decides; the gradient
 * must arrive as the accumulator holds it. An unannotated accumulator keeps the gradient's pending
 * reduction (completion_leaf), so micro-batches add up locally and the update's requirement (the
 * parameter's layout, reduced) brings data parallelism's allreduce — once a step. A split one
 * (ZeRO-2/3) takes the reduce-scatter (partial -> split) here. */
static void spmd_rule_grad_accum(spmd_ctx *c) {
    c->out = c->in[0];
    c->req[0] = c->in[0];
    c->req[1] = c->in[0]; /* the gradient comes as the accumulator holds it, pending reduction included */
    c->req[1].ndim = (int8_t)c->node->src[1]->ndim;
}

/* grad_norm_sq (g [, partial sum so far]) -> [1]: squares summed over a split gradient are partial
 * over its axes. The running sum must be partial over exactly those axes (making a replicated value
 * partial is free; a partial over another axis would be counted once per rank, so it is reduced). */
static void spmd_rule_grad_norm_sq(spmd_ctx *c) {
    c->req[0] = c->in[0];
    c->req[0].partial = c->req[0].partial_avg = 0;
    c->out = attr_replicated(c->mesh, 1);
    c->out.partial = (uint8_t)attr_split_axes(&c->req[0]);
    if (c->nsrc > 1) c->req[1] = c->out;
}

/* sgd_update (param, grad, momentum [, gnorm]), adamw_update (param, grad, m, v [, gnorm]): the
 * update runs where the state lives. State split where the parameter is replicated (ZeRO-1) makes
 * the update split too: the parameter and gradient are required split (local slices) and the
 * output — the updated values — is split; the executor gathers it back into the parameter where
 * the two differ. State split against the parameter's own split follows the parameter (a conflict). */
static void spmd_rule_update(spmd_ctx *c) {
    pdde_dist_attr m = c->in[0];
    m.partial = m.partial_avg = 0;
    /* the parameter's bf16 copy (its last source, PDDE_P_UPDATE_SHADOW) is taken as it is: lowering keeps
     * it only where the update writes the whole parameter the cast reads */
    int shadow = pdde_op_i32(c->node, PDDE_P_UPDATE_SHADOW) ? c->nsrc - 1 : -1;
    for (int k = 2; k < c->nsrc; k++) {
        const pdde_tensor *s = c->node->src[k];
        if (s->op == PDDE_OP_GRAD_NORM_SQ || k == shadow) continue;
        for (int d = 0; d < s->ndim; d++) {
            int ax = c->in[k].dims_mapping[d];
            if (ax < 0 || m.dims_mapping[d] == ax) continue;
            if (m.dims_mapping[d] < 0 && !(attr_split_axes(&m) >> ax & 1)) m.dims_mapping[d] = (int8_t)ax;
            else spmd_conflict(c, k, "state dim %d is split over %s, the parameter's layout differs; the state follows the parameter",
                               d, spmd_axis(c, ax));
        }
    }
    for (int k = 0; k < c->nsrc; k++) {
        if (c->node->src[k]->op == PDDE_OP_GRAD_NORM_SQ) c->req[k] = attr_replicated(c->mesh, 1);
        else if (k == shadow) c->req[k] = c->in[k];
        else c->req[k] = m, c->req[k].ndim = (int8_t)c->node->src[k]->ndim;
    }
    c->out = m;
}

/* An op without a rule is computed replicated, and the completion says so (nothing silently guessed). */
static void spmd_rule_replicated(spmd_ctx *c) {
    for (int k = 0; k < c->nsrc; k++) c->req[k] = attr_replicated(c->mesh, c->node->src[k]->ndim);
    c->out = attr_replicated(c->mesh, c->node->ndim);
    if (c->nsrc) spmd_conflict(c, 0, "no SPMD rule for %s: every input is required replicated", pdde_op_name(c->node->op));
}

/* Mixture-of-Experts (pdde.h PDDE_OP_MOE_*): tokens n may be split (data parallel); a token's rows of
 * the expert-ordered buffer [R, C] are on the rank of the token (its dispatch writes them there), so R
 * takes n's split: the buffer of a rank is its own tokens' rows in expert order, the ops' kernels
 * compute that layout from the local ids. With a capacity a rank's buffer is E x (its share of the
 * capacity): the capacity applies to each rank's tokens (GShard's groups). The experts E stay whole. */
static void spmd_moe_tokens(spmd_ctx *c, char rows) {
    (void)rows;
    spmd_pin(c, 'e');
}

/* moe_topk (logits [N,E] [, bias [E]]), moe_gate (logits, ids), moe_gate_back (logits, ids, dw) */
static void spmd_rule_moe_route(spmd_ctx *c) {
    const pdde_tensor *y = c->node;
    strcpy(c->dims[0], "ne");
    if (y->op == PDDE_OP_MOE_TOPK) strcpy(c->dims[1], "e");
    else strcpy(c->dims[1], "nj");
    if (y->op == PDDE_OP_MOE_GATE_BACK) strcpy(c->dims[2], "nj"), c->linear = 1u << 2;
    strcpy(c->out_dims, y->op == PDDE_OP_MOE_GATE_BACK ? "ne" : "nj");
    spmd_pin(c, 'e');
    spmd_einsum(c, NULL);
}

/* moe_counts (ids [N,k]) -> [E], of all the tokens: the ids are gathered (N x k integers) rather than
 * the counts left partial, since the balance loss multiplies them with the mean probabilities, whose
 * gradient must not be a product of two pending reductions */
static void spmd_rule_moe_counts(spmd_ctx *c) {
    strcpy(c->dims[0], "nj"), strcpy(c->out_dims, "e");
    spmd_pin(c, 'e'), spmd_pin(c, 'n');
    spmd_einsum(c, NULL);
    if (c->group_local & 1) c->out.partial |= (uint8_t)spmd_group_axes(c); /* a group's counts: a part of the sum over the groups */
}

/* moe_dispatch (x [N,C], ids [, w]) -> [R,C]; moe_combine (ye [R,C], ids [, w]) -> [N,C];
 * moe_combine_back_w (ye, ids, dy [N,C]) -> [N,k]: rows and tokens one letter */
static void spmd_rule_moe_permute(spmd_ctx *c) {
    const pdde_tensor *y = c->node;
    /* the buffer by expert ([E, S, C], pdde_moe_dispatch_experts): its S rows are the tokens' too, and
     * a buffer split by expert (after the experts) gives way to the tokens' split: all-to-all back */
    bool by_expert = (y->op == PDDE_OP_MOE_DISPATCH ? y : y->src[0])->ndim == 3;
    const char *buf = by_expert ? "enc" : "nc";
    strcpy(c->dims[0], y->op == PDDE_OP_MOE_DISPATCH ? "nc" : buf), strcpy(c->dims[1], "nj");
    if (c->nsrc > 2) strcpy(c->dims[2], y->op == PDDE_OP_MOE_COMBINE_BACK_W ? "nc" : "nj");
    strcpy(c->out_dims, y->op == PDDE_OP_MOE_COMBINE_BACK_W ? "nj" : y->op == PDDE_OP_MOE_DISPATCH ? buf : "nc");
    c->linear = 1u | (c->nsrc > 2 ? 1u << 2 : 0);
    /* the kernels address a token's rows by its global expert id: the experts stay whole here (a
     * buffer split by expert is gathered or exchanged back, never combined as a partial sum) */
    spmd_moe_tokens(c, 'n');
    int order[3] = {1, 0, 2}; /* the ids first: their tokens' split wins */
    spmd_einsum(c, by_expert ? order : NULL);
}

/* moe_grouped_matmul (x [R,K], w [E,K,M] or [E,M,K], ids) -> [R,M]; its weight gradient (a [R,K],
 * b [R,M], ids) -> [E,K,M], summed over the rows (partial where they are split, averaged as a matmul's
 * weight gradient is) */
static void spmd_rule_moe_grouped_matmul(spmd_ctx *c) {
    const pdde_tensor *y = c->node;
    if (y->src[0]->ndim == 3) {
        /* by expert, [E, S, K]: the weights first, so experts split over an axis bring the rows to
         * them (all-to-all from the tokens' split: expert parallelism); the weight gradient sums the
         * rows where the tokens are split (the experts whole: a reduce-scatter into split weights) */
        c->linear = 3;
        if (y->op == PDDE_OP_MOE_GROUPED_MATMUL) {
            strcpy(c->dims[0], "enk"), strcpy(c->dims[1], pdde_op_i32(y, PDDE_P_MOE_TRANS_B) ? "emk" : "ekm"), strcpy(c->out_dims, "enm");
            int order[2] = {1, 0};
            spmd_einsum(c, order);
        } else {
            /* experts split over the tokens' axis (expert parallelism on the dp axis): E whole, the
             * rows summed where the tokens are (a reduce-scatter into the experts' shards), since on
             * the experts' side the rows come from several ranks' local means (their sum would be
             * the axis size too big). Experts split over another axis (the tokens whole there: the
             * tensor-parallel axis) keep that split: each rank sums its own experts' rows and the
             * gradient is partial over the tokens' axis only. */
            strcpy(c->dims[0], "enk"), strcpy(c->dims[1], "enm"), strcpy(c->out_dims, "ekm");
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 2; b++)
                    if (c->in[a].dims_mapping[1] >= 0 && c->in[a].dims_mapping[1] == c->in[b].dims_mapping[0]) spmd_pin(c, 'e');
            spmd_einsum(c, NULL);
        }
        return;
    }
    if (y->op == PDDE_OP_MOE_GROUPED_MATMUL) {
        strcpy(c->dims[0], "rk"), strcpy(c->dims[1], pdde_op_i32(y, PDDE_P_MOE_TRANS_B) ? "emk" : "ekm"), strcpy(c->out_dims, "rm");
    } else {
        strcpy(c->dims[0], "rk"), strcpy(c->dims[1], "rm"), strcpy(c->out_dims, "ekm");
    }
    strcpy(c->dims[2], "rj");
    c->linear = 3;
    spmd_moe_tokens(c, 'r');
    spmd_einsum(c, NULL);
}

/* moe_aux_loss (logits [N,E], counts [E]) -> [1]: a mean over the rows, as the cross-entropy's (rows
 * split: the loss partial with an average); moe_aux_loss_back (logits, counts, dloss) -> dlogits, each
 * rank's gradient of its own mean, with the mean marker (see spmd_rule_cross_entropy_back) */
static void spmd_rule_moe_aux_loss(spmd_ctx *c) {
    bool back = c->node->op == PDDE_OP_MOE_AUX_LOSS_BACK;
    strcpy(c->dims[0], "ne"), strcpy(c->dims[1], "e");
    if (back) strcpy(c->dims[2], "1"), c->linear = 4;
    strcpy(c->out_dims, back ? "ne" : "1");
    spmd_pin(c, 'e');
    c->avg_reduce = ~0u;
    spmd_einsum(c, NULL);
    if (back && c->out.dims_mapping[0] >= 0) c->out.partial_avg |= (uint8_t)(1u << c->out.dims_mapping[0]);
}

typedef void (*spmd_rule_fn)(spmd_ctx *c);

static const spmd_rule_fn spmd_rules[PDDE_OP_COUNT] = {
    [PDDE_OP_MATMUL] = spmd_rule_matmul,
    [PDDE_OP_ADD] = spmd_rule_add, [PDDE_OP_SUB] = spmd_rule_add,
    [PDDE_OP_MUL] = spmd_rule_mul,
    [PDDE_OP_SCALE] = spmd_rule_follow_linear, [PDDE_OP_CAST] = spmd_rule_follow_linear,
    [PDDE_OP_DROPOUT_BACK] = spmd_rule_follow_linear, [PDDE_OP_COPY] = spmd_rule_follow_linear,
    [PDDE_OP_GELU] = spmd_rule_follow, [PDDE_OP_RELU] = spmd_rule_follow, [PDDE_OP_SILU] = spmd_rule_follow,
    [PDDE_OP_DROPOUT] = spmd_rule_follow,
    [PDDE_OP_GELU_BACK] = spmd_rule_act_back, [PDDE_OP_RELU_BACK] = spmd_rule_act_back,
    [PDDE_OP_SILU_BACK] = spmd_rule_act_back,
    [PDDE_OP_LAYERNORM] = spmd_rule_norm, [PDDE_OP_RMSNORM] = spmd_rule_norm,
    [PDDE_OP_LAYERNORM_BACK] = spmd_rule_norm_back, [PDDE_OP_RMSNORM_BACK] = spmd_rule_norm_back,
    [PDDE_OP_LAYERNORM_BACK_GAMMA] = spmd_rule_norm_back_gamma, [PDDE_OP_RMSNORM_BACK_GAMMA] = spmd_rule_norm_back_gamma,
    [PDDE_OP_SOFTMAX] = spmd_rule_softmax, [PDDE_OP_SOFTMAX_BACK] = spmd_rule_softmax_back,
    [PDDE_OP_ATTENTION] = spmd_rule_attention, [PDDE_OP_ATTENTION_BACK] = spmd_rule_attention_back,
    [PDDE_OP_CROSS_ENTROPY] = spmd_rule_cross_entropy, [PDDE_OP_CROSS_ENTROPY_BACK] = spmd_rule_cross_entropy_back,
    [PDDE_OP_EMBEDDING] = spmd_rule_embedding,
    /* PDDE_OP_EMBEDDING_BACK: spmd_rule_embedding_back, which also reads the graph (see spmd_apply) */
    [PDDE_OP_RESHAPE] = spmd_rule_reshape, [PDDE_OP_PERMUTE] = spmd_rule_permute,
    [PDDE_OP_CONCAT] = spmd_rule_concat, [PDDE_OP_SLICE] = spmd_rule_slice, [PDDE_OP_SLICE_BACK] = spmd_rule_slice,
    [PDDE_OP_SUM] = spmd_rule_reduce, [PDDE_OP_MEAN] = spmd_rule_reduce,
    [PDDE_OP_SUM_TO] = spmd_rule_sum_to, [PDDE_OP_EXPAND] = spmd_rule_expand,
    [PDDE_OP_GRAD_ACCUM] = spmd_rule_grad_accum, [PDDE_OP_GRAD_NORM_SQ] = spmd_rule_grad_norm_sq,
    [PDDE_OP_SGD_UPDATE] = spmd_rule_update, [PDDE_OP_ADAMW_UPDATE] = spmd_rule_update,
    /* the session's reshard collectives (inserted after completion): their layout passes through */
    [PDDE_OP_ALLREDUCE] = spmd_rule_follow_linear, [PDDE_OP_REDUCE_SCATTER] = spmd_rule_follow_linear,
    [PDDE_OP_ALLGATHER] = spmd_rule_follow_linear, [PDDE_OP_COMM_WAIT] = spmd_rule_follow_linear,
    /* bias_gelu (x, bias): gelu's rule, the bias broadcast as ADD's is */
    [PDDE_OP_BIAS_GELU] = spmd_rule_follow, [PDDE_OP_BIAS_GELU_BACK] = spmd_rule_act_back,
    [PDDE_OP_MOE_TOPK] = spmd_rule_moe_route, [PDDE_OP_MOE_GATE] = spmd_rule_moe_route, [PDDE_OP_MOE_GATE_BACK] = spmd_rule_moe_route,
    [PDDE_OP_MOE_COUNTS] = spmd_rule_moe_counts,
    [PDDE_OP_MOE_DISPATCH] = spmd_rule_moe_permute, [PDDE_OP_MOE_COMBINE] = spmd_rule_moe_permute,
    [PDDE_OP_MOE_COMBINE_BACK_W] = spmd_rule_moe_permute,
    [PDDE_OP_MOE_GROUPED_MATMUL] = spmd_rule_moe_grouped_matmul, [PDDE_OP_MOE_GROUPED_MATMUL_BACK_W] = spmd_rule_moe_grouped_matmul,
    [PDDE_OP_MOE_AUX_LOSS] = spmd_rule_moe_aux_loss, [PDDE_OP_MOE_AUX_LOSS_BACK] = spmd_rule_moe_aux_loss,
    [PDDE_OP_ROPE] = spmd_rule_rope,
};

/* Runs the rule of c->node (c->in filled); checks the invariants every rule must keep: 0, or -1 where
 * the rules made an attribute that cannot be (a layout they do not cover). */
PDDE_PRIVATE int spmd_apply(spmd_ctx *c, const pdde_graph *g) {
    memset(c->axis_of, -1, sizeof c->axis_of);
    spmd_group_reserve(c);
    if (c->node->op == PDDE_OP_EMBEDDING_BACK) spmd_rule_embedding_back(c, g);
    else if ((unsigned)c->node->op < PDDE_OP_COUNT && spmd_rules[c->node->op]) spmd_rules[c->node->op](c);
    else spmd_rule_replicated(c);
    c->out.ndim = (int8_t)c->node->ndim;
    spmd_groups(c);
    /* an axis splits at most one dim, and a tensor is never both split and partial over one axis */
    unsigned seen = 0;
    for (int d = 0; d < c->out.ndim; d++) {
        int ax = c->out.dims_mapping[d];
        if (ax >= 0 && (seen >> ax & 1)) return -1;
        if (ax >= 0) seen |= 1u << ax;
    }
    return seen & c->out.partial ? -1 : 0;
}
