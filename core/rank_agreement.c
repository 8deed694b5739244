/* core/rank_agreement.c — the ranks of a session agree that they run the same program.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers).
 *
 * SPMD execution needs every rank to build the same graph under the same plan: ranks that differ (one
 * data-parallel, one tensor-parallel; another width or layer count) would otherwise exchange
 * collectives of matching sizes and train a wrong model without an error. Each rank fingerprints what
 * all ranks share (the global graph, its distributed attributes and meshes, the applied plan), never
 * its local program (pipeline stages, uneven shares and expert ranks legitimately lower differently),
 * and one allgather of 32 bytes per rank compares them before the first collective of the session. */

#ifdef PDDE_HAVE_COMM

#define FP_OFFSET 1469598103934665603ull /* FNV-1a, 64-bit */
#define FP_PRIME 1099511628211ull

static uint64_t fp_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * FP_PRIME;
    return h;
}
static uint64_t fp_i64(uint64_t h, int64_t v) { return fp_bytes(h, &v, sizeof v); }
static uint64_t fp_str(uint64_t h, const char *s) { return fp_bytes(h, s, strlen(s) + 1); }

/* a mesh by its content (meshes are per-graph allocations: their addresses differ between ranks) */
static uint64_t fp_mesh(uint64_t h, const pdde_mesh *m) {
    if (!m) return fp_i64(h, -1);
    h = fp_i64(h, m->ndim);
    for (int a = 0; a < m->ndim; a++) h = fp_i64(h, m->shape[a]), h = fp_str(h, m->names[a]);
    h = fp_i64(h, m->n_ranks);
    for (int r = 0; m->ranks && r < m->n_ranks; r++) h = fp_i64(h, m->ranks[r]);
    return h;
}

/* one node: what it computes, on what, and how it is laid out over the ranks; not where this rank
 * places it (device), nor what a caller keeps to read (PDDE_TENSOR_OUTPUT). In three parts, so that a
 * mismatch can say which part differs. */
static uint64_t fp_node_params(const pdde_tensor *t) {
    return fp_bytes(fp_bytes(FP_OFFSET, t->iparams, sizeof t->iparams), t->fparams, sizeof t->fparams);
}
static uint64_t fp_node_dist(const pdde_tensor *t) {
    uint64_t h = fp_mesh(FP_OFFSET, t->dist.mesh);
    h = fp_i64(h, t->dist.ndim), h = fp_bytes(h, t->dist.dims_mapping, sizeof t->dist.dims_mapping);
    return fp_i64(fp_i64(h, t->dist.partial), t->dist.partial_avg);
}
static uint64_t fp_node(const pdde_tensor *t) {
    uint64_t h = FP_OFFSET;
    h = fp_i64(h, t->op), h = fp_i64(h, t->dtype), h = fp_i64(h, t->ndim);
    for (int d = 0; d < t->ndim; d++) h = fp_i64(h, t->shape[d]);
    h = fp_i64(h, t->nsrc);
    for (int k = 0; k < t->nsrc; k++) h = fp_i64(h, t->src[k] ? t->src[k]->id : -1);
    h = fp_i64(h, t->flags & ~(uint32_t)PDDE_TENSOR_OUTPUT), h = fp_i64(h, t->phase), h = fp_i64(h, t->layer);
    h = fp_str(h, t->name);
    return fp_i64(fp_i64(h, (int64_t)fp_node_params(t)), (int64_t)fp_node_dist(t));
}

/* what the graph holds beside its nodes: the optimizer's schedule, recompute, the planner's meshes and
 * data-parallel shares and groups; and the session's schedule and collective dtype */
static uint64_t fp_graph_settings(const pdde_graph *g, const pdde_session_params *p) {
    uint64_t h = FP_OFFSET;
    const pdde_optimizer_params *o = &g->opt;
    h = fp_i64(h, g->has_backward), h = fp_i64(h, g->has_optimizer);
    float f[] = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay, o->momentum, o->clip_norm, o->min_lr_ratio};
    h = fp_bytes(h, f, sizeof f);
    h = fp_i64(h, o->schedule), h = fp_i64(h, o->warmup_steps), h = fp_i64(h, o->total_steps), h = fp_i64(h, o->grad_accum_steps);
    for (int l = 0; l < g->n_recompute; l++) h = fp_i64(h, g->recompute[l]);
    const struct planner_graph *pg = g->planner;
    if (pg) {
        h = fp_mesh(h, pg->mesh);
        for (int l = 0; l < pg->n_layer_mesh; l++) h = fp_mesh(h, pg->layer_mesh[l]);
        h = fp_mesh(h, pg->share_mesh), h = fp_i64(h, pg->share_axis);
        for (int i = 0; pg->share_mesh && pg->shares && i < pg->share_mesh->shape[pg->share_axis]; i++) h = fp_i64(h, pg->shares[i]);
        h = fp_str(fp_str(h, pg->group_axis), pg->batch_axis);
        h = fp_i64(h, pg->n_completed);
    }
    return fp_i64(fp_i64(h, p->pipeline_schedule), p->comm_dtype);
}

/* What each rank sends first, and on a mismatch, what names the difference (small graphs node by node) */
enum { AGREE_GRAPH, AGREE_SETTINGS, AGREE_PLAN, AGREE_NODES, AGREE_WORDS };
#define AGREE_MAX_NODES 2048
typedef struct {
    uint32_t hash, params_hash, dist_hash;
    int16_t op;
    int8_t dtype, ndim;
    int64_t shape[4];
    char name[24];
} agree_node;
typedef struct {
    char plan[sizeof ((pdde_graph *)0)->plan_text];
    char mesh[96];
    agree_node nodes[AGREE_MAX_NODES];
} agree_detail;

static void agree_describe_mesh(const pdde_graph *g, char *buf, size_t n) {
    const pdde_mesh *m = g->planner ? g->planner->mesh : NULL;
    int k = snprintf(buf, n, m ? "[" : "none");
    for (int a = 0; m && a < m->ndim && k >= 0 && (size_t)k < n; a++) k += snprintf(buf + k, n - (size_t)k, "%s%d %s", a ? ", " : "", m->shape[a], m->names[a]);
    if (m && k >= 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, "]");
}

static void agree_shape_str(const agree_node *a, char *buf, size_t n) {
    char dims[96];
    dims_str(a->ndim < 4 ? a->ndim : 4, a->shape, dims, sizeof dims);
    if (a->ndim > 4 && strlen(dims) > 0) dims[strlen(dims) - 1] = '\0'; /* (the dims past 4 are not sent: "[a,b,c,d,...]") */
    snprintf(buf, n, "%s %s%s", pdde_dtype_name((pdde_dtype)a->dtype), dims, a->ndim > 4 ? ",...]" : "");
}

/* The difference between rank 0's and rank `other`'s program, into why. Every rank takes part in the
 * one collective it needs (all of them saw the same mismatch). */
static pdde_status agree_explain(const pdde_graph *g, pdde_comm *world, const int64_t *all, int other, char *why, size_t n) {
    int size = pdde_comm_size(world);
    agree_detail *mine = calloc(1, sizeof *mine), *every = calloc((size_t)size, sizeof *every);
    if (!mine || !every) {
        free(mine), free(every);
        return pdde_error(g->ctx, PDDE_ERR_OOM, "session: out of memory");
    }
    snprintf(mine->plan, sizeof mine->plan, "%s", g->plan_text);
    agree_describe_mesh(g, mine->mesh, sizeof mine->mesh);
    for (int i = 0; i < g->n && i < AGREE_MAX_NODES; i++) {
        const pdde_tensor *t = g->nodes[i];
        agree_node *a = &mine->nodes[i];
        a->hash = (uint32_t)fp_node(t), a->params_hash = (uint32_t)fp_node_params(t), a->dist_hash = (uint32_t)fp_node_dist(t);
        a->op = (int16_t)t->op, a->dtype = (int8_t)t->dtype, a->ndim = (int8_t)t->ndim;
        for (int d = 0; d < t->ndim && d < 4; d++) a->shape[d] = t->shape[d];
        snprintf(a->name, sizeof a->name, "%s", t->name);
    }
    pdde_status st = pdde_comm_allgather(world, mine, every, sizeof *mine / 4, PDDE_I32);
    if (st) {
        free(mine), free(every);
        return st;
    }
    const agree_detail *a = &every[0], *b = &every[other];
    const int64_t *va = all, *vb = all + (size_t)other * AGREE_WORDS;
    size_t at = 0; /* (long plans: from a little before their first difference) */
    while (a->plan[at] && a->plan[at] == b->plan[at]) at++;
    at = strlen(a->plan) < 160 && strlen(b->plan) < 160 ? 0 : at > 20 ? at - 20 : 0;
    if (strcmp(a->plan, b->plan))
        snprintf(why, n, "the plans differ ('%s%.100s' vs '%s%.100s')", at ? "..." : "", a->plan[0] ? a->plan + at : "none", at ? "..." : "",
                 b->plan[0] ? b->plan + at : "none");
    else if (strcmp(a->mesh, b->mesh))
        snprintf(why, n, "the meshes differ (%s vs %s)", a->mesh, b->mesh);
    else if (va[AGREE_GRAPH] != vb[AGREE_GRAPH]) {
        int64_t common = va[AGREE_NODES] < vb[AGREE_NODES] ? va[AGREE_NODES] : vb[AGREE_NODES], i = 0;
        while (i < common && i < AGREE_MAX_NODES && a->nodes[i].hash == b->nodes[i].hash) i++;
        const agree_node *x = &a->nodes[i < AGREE_MAX_NODES ? i : 0], *y = &b->nodes[i < AGREE_MAX_NODES ? i : 0];
        char sx[96], sy[96];
        if (i >= AGREE_MAX_NODES)
            snprintf(why, n, "the graphs differ past their first %d nodes (fingerprints %016llx vs %016llx)", AGREE_MAX_NODES,
                     (unsigned long long)va[AGREE_GRAPH], (unsigned long long)vb[AGREE_GRAPH]);
        else if (i == common)
            snprintf(why, n, "the graphs differ (%lld nodes vs %lld)", (long long)va[AGREE_NODES], (long long)vb[AGREE_NODES]);
        else if (x->op != y->op)
            snprintf(why, n, "the graphs differ (node %lld: op %s '%s' vs %s '%s')", (long long)i, pdde_op_name((pdde_op)x->op), x->name,
                     pdde_op_name((pdde_op)y->op), y->name);
        else if (agree_shape_str(x, sx, sizeof sx), agree_shape_str(y, sy, sizeof sy), strcmp(sx, sy) || strcmp(x->name, y->name))
            snprintf(why, n, "the graphs differ (node %lld: %s '%s' %s vs '%s' %s)", (long long)i, pdde_op_name((pdde_op)x->op), x->name, sx, y->name, sy);
        else
            snprintf(why, n, "the graphs differ (node %lld: %s '%s': %s)", (long long)i, pdde_op_name((pdde_op)x->op), x->name,
                     x->dist_hash != y->dist_hash     ? "its distributed attributes"
                     : x->params_hash != y->params_hash ? (x->op ? "its op parameters" : "its initial values")
                                                        : "its inputs, flags, phase or layer");
    } else
        snprintf(why, n, "the graphs' settings differ (optimizer, recompute, pipeline stages, data-parallel shares, or the session's "
                         "pipeline schedule or collective dtype)");
    free(mine), free(every);
    return PDDE_OK;
}

/* PDDE_ERR_MISMATCH on every rank when the ranks' programs differ, naming the ranks and the difference */
static pdde_status session_agree_program(const pdde_graph *g, const pdde_session_params *p, pdde_comm *world) {
    int size = pdde_comm_size(world);
    int64_t mine[AGREE_WORDS], *all = malloc((size_t)size * sizeof mine);
    if (!all) return pdde_error(g->ctx, PDDE_ERR_OOM, "session: out of memory");
    uint64_t nodes = FP_OFFSET;
    for (int i = 0; i < g->n; i++) nodes = fp_i64(nodes, (int64_t)fp_node(g->nodes[i]));
    mine[AGREE_GRAPH] = (int64_t)nodes, mine[AGREE_SETTINGS] = (int64_t)fp_graph_settings(g, p);
    mine[AGREE_PLAN] = (int64_t)fp_str(FP_OFFSET, g->plan_text), mine[AGREE_NODES] = g->n;
    pdde_status st = pdde_comm_allgather(world, mine, all, AGREE_WORDS, PDDE_I64);
    if (st) {
        free(all);
        return pdde_error(g->ctx, st, "session: comparing the ranks' programs: %s", pdde_last_error(g->ctx));
    }
    char ranks[128] = "";
    int k = 0, first = 0;
    for (int r = 1; r < size; r++)
        if (memcmp(all, all + (size_t)r * AGREE_WORDS, sizeof mine)) {
            if (!first) first = r;
            if (k >= 0 && (size_t)k < sizeof ranks) k += snprintf(ranks + k, sizeof ranks - (size_t)k, "%s%d", k ? ", " : "", r);
        }
    if (!first) {
        free(all);
        return PDDE_OK;
    }
    char why[512];
    st = agree_explain(g, world, all, first, why, sizeof why);
    free(all);
    if (st) return pdde_error(g->ctx, st, "session: the ranks' programs differ; describing how: %s", pdde_last_error(g->ctx));
    return pdde_error(g->ctx, PDDE_ERR_MISMATCH,
                      "session: rank%s %s run%s another program than rank 0: %s (every rank must build the same graph under the same plan)",
                      strchr(ranks, ',') ? "s" : "", ranks, strchr(ranks, ',') ? "" : "s", why);
}

/* Every rank that reached this point of session init says whether it started its session (st): a rank
 * that failed alone (its memory, a device it cannot open) would otherwise
 * leave its peers waiting at their first collective until PDDE_COMM_TIMEOUT. On a failure anywhere,
 * every rank returns the first failed rank's status and message. */
static pdde_status session_agree_started(pdde_context *ctx, pdde_comm *world, pdde_status st) {
    int size = pdde_comm_size(world);
    int32_t mine = st, *all = malloc((size_t)size * sizeof *all);
    char why[256] = "", *msgs = malloc((size_t)size * sizeof why);
    if (st) snprintf(why, sizeof why, "%s", pdde_last_error(ctx));
    pdde_status cst = all && msgs ? pdde_comm_allgather(world, &mine, all, 1, PDDE_I32) : PDDE_ERR_OOM;
    int failed = -1;
    for (int r = 0; !cst && r < size && failed < 0; r++)
        if (all[r]) failed = r;
    /* (every rank takes part in the second collective: all of them saw the same failure) */
    if (failed >= 0) cst = pdde_comm_allgather(world, why, msgs, sizeof why / 4, PDDE_I32);
    pdde_status out = st;
    if (st == PDDE_OK && cst) out = pdde_error(ctx, cst, "session: telling the ranks this one started: %s", pdde_last_error(ctx));
    else if (st == PDDE_OK && failed >= 0)
        out = pdde_error(ctx, (pdde_status)all[failed], "session: rank %d could not start its session: %s", failed, msgs + (size_t)failed * sizeof why);
    free(all), free(msgs);
    return out;
}

#endif
