/* core/plan_apply.c — a planner's plan applied to a graph: annotations, backward, optimizer, session.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

/* ================================================================================================
 * A planner's plan applied to a graph: annotations, backward, optimizer and the session. It joins the
 * planner's strategies (planner/) to autodiff, the optimizers and the executor (core), so it lives
 * here, above both. */

/* Tensor parallelism of any layered graph, Megatron's way: in each layer the GEMMs with a 2-D weight
 * parameter (x @ W) alternate column- and row-parallel (a column-parallel linear, local work, then a
 * row-parallel one whose partial sum is reduced once), each with its bias (an ADD of a 1-D parameter
 * of the output's width). The planner's estimate counts the same allreduces. */
static pdde_status plan_apply_tensor_parallel(pdde_graph *g, const pdde_mesh *mesh, int tp) {
    int n = g->n, max_layer = 0;
    for (int i = 0; i < n; i++)
        if (g->nodes[i]->layer > max_layer) max_layer = g->nodes[i]->layer;
    int *seen = calloc((size_t)max_layer + 2, sizeof *seen);
    if (!seen) return pdde_error(g->ctx, PDDE_ERR_OOM, "plan apply: out of memory");
    pdde_status st = PDDE_OK;
    for (int i = 0; i < n && !st; i++) {
        pdde_tensor *t = g->nodes[i], *w = t->op == PDDE_OP_MATMUL ? t->src[1] : NULL;
        if (!w || t->phase != PDDE_PHASE_FORWARD || !(w->flags & PDDE_TENSOR_PARAM) || w->ndim != 2 || pdde_op_i32(t, PDDE_P_MATMUL_TRANS_A) ||
            pdde_op_i32(t, PDDE_P_MATMUL_TRANS_B))
            continue;
        pdde_tp_kind kind = seen[t->layer + 1]++ % 2 ? PDDE_TP_ROW : PDDE_TP_COLUMN;
        if (w->shape[kind == PDDE_TP_COLUMN ? 1 : 0] % tp) {
            st = pdde_error(g->ctx, PDDE_ERR_DIST_ATTR, "plan apply: tp=%d does not divide %s's %s dim (%lld), as a %s-parallel linear of layer %d", tp,
                            w->name, kind == PDDE_TP_COLUMN ? "output" : "input", (long long)w->shape[kind == PDDE_TP_COLUMN ? 1 : 0],
                            kind == PDDE_TP_COLUMN ? "column" : "row", t->layer);
            break;
        }
        pdde_tensor *bias = NULL;
        for (int j = i + 1; j < n && !bias; j++) {
            pdde_tensor *u = g->nodes[j], *b = u->nsrc == 2 && u->src[0] == t ? u->src[1] : NULL;
            if ((u->op == PDDE_OP_ADD || u->op == PDDE_OP_BIAS_GELU) && b && (b->flags & PDDE_TENSOR_PARAM) && b->ndim == 1 && b->shape[0] == w->shape[1]) bias = b;
        }
        st = pdde_strategy_tensor_parallel_linear(g, w, bias, mesh, "tp", kind);
    }
    free(seen);
    return st;
}

int pdde_plan_process_of_rank(const pdde_plan *p, int mesh_rank) {
    if (!p || p->pp < 1 || mesh_rank < 0) return -1;
    int s = mesh_rank % p->pp, member = mesh_rank / p->pp;
    return p->stage_blocks ? s * p->dp * p->tp + member : mesh_rank;
}

int pdde_plan_layer_recomputed(const pdde_plan *p, int n_layers, int layer) {
    if (!p || p->pp < 1 || p->pp > PDDE_PLAN_MAX_STAGES || layer < 0 || layer >= n_layers) return 0;
    bool cut = p->stage_first[p->pp] > 0 && p->chunks <= 1;
    for (int s = 0; s < p->pp; s++) {
        int first = cut ? p->stage_first[s] : s * n_layers / p->pp, next = cut ? p->stage_first[s + 1] : (s + 1) * n_layers / p->pp;
        if (layer >= first && layer < next) return p->recompute == 1 || layer < first + p->recompute_layers[s];
    }
    return 0;
}

/* The device of each of the L layers under plan p's placement (malloc'ed): those it places on the
 * first device of backend p->place, the others -1 (the rank's own). With stages, each stage's
 * session places those of its layers (the others are not on its rank). */
static pdde_status plan_apply_placement(pdde_graph *g, const pdde_plan *p, int L, int **out) {
    /* this local rank's device of that backend; a host with fewer than its ranks shares them (the
     * planner placed layers there knowing the machine) */
    pdde_device_select_params ds = PDDE_DEVICE_SELECT_PARAMS_INIT;
    pdde_device_choice c;
    ds.backend = p->place, ds.share = 1;
    if (pdde_device_select(g->ctx, &ds, &c))
        return pdde_error(g->ctx, PDDE_ERR_NOT_FOUND, "plan apply: place=%s: this process has no device of backend %s (see pdde-info): %s", p->place,
                          p->place, pdde_last_error(g->ctx));
    int dev = c.device;
    if (p->chunks != 1)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "plan apply: place=%s places layers of one run per stage (chunks 1), not %d chunks",
                          p->place, p->chunks);
    int *d = malloc((size_t)L * sizeof *d);
    if (!d) return pdde_error(g->ctx, PDDE_ERR_OOM, "plan apply: out of memory");
    for (int l = 0; l < L; l++) d[l] = pdde_plan_layer_on_device(p, L, l) ? dev : -1;
    *out = d;
    return PDDE_OK;
}

/* Under tensor parallelism on a device: the layers holding an embedding or a cross-entropy (their
 * vocab-parallel forms are the CPU's) on the CPU, the others (-1) on the rank's device. Fills *layers
 * (kept, when placement made it) or makes it. */
static pdde_status plan_apply_vocab_on_cpu(pdde_graph *g, int L, int **layers) {
    int *d = *layers ? *layers : malloc((size_t)L * sizeof *d);
    if (!d) return pdde_error(g->ctx, PDDE_ERR_OOM, "plan apply: out of memory");
    for (int l = 0; l < L && !*layers; l++) d[l] = -1;
    for (int i = 0; i < g->n; i++) {
        const pdde_tensor *t = g->nodes[i];
        if ((t->op == PDDE_OP_EMBEDDING || t->op == PDDE_OP_CROSS_ENTROPY) && t->layer >= 0 && t->layer < L) d[t->layer] = 0;
    }
    *layers = d;
    return PDDE_OK;
}

pdde_status pdde_plan_apply(pdde_graph *g, const pdde_plan *plan, pdde_tensor *loss, const pdde_optimizer_params *opt,
                            const pdde_session_params *params, pdde_session **out) {
    if (!g || !plan || !loss) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    const pdde_plan *p = plan;
    if (p->dp < 1 || p->tp < 1 || p->pp < 1 || p->pp > PDDE_PLAN_MAX_STAGES || p->micro < 1 || p->chunks < 1 || p->zero < 0 || p->zero > 3)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "plan apply: dp %d, tp %d, pp %d, mb %d, chunks %d, zero %d out of range", p->dp, p->tp, p->pp,
                          p->micro, p->chunks, p->zero);
    bool uneven = false;
    for (int i = 0; i < PDDE_PLAN_MAX_SHARES; i++) uneven |= p->shares[i] != 0;
    for (int i = 0; i < PDDE_PLAN_MAX_SHARES && uneven; i++)
        if ((i < p->dp) != (p->shares[i] > 0) || p->dp < 2 || p->dp > PDDE_PLAN_MAX_SHARES || (p->pp > 1 && p->zero >= 2))
            return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "plan apply: shares: want dp = %d shares >= 1 (dp 2..%d), and with pipeline "
                              "stages (pp %d) ZeRO 0 or 1 (zero %d); share %d is %d", p->dp, PDDE_PLAN_MAX_SHARES, p->pp, p->zero, i, p->shares[i]);
    if (pdde_plan_str(p, g->plan_text, sizeof g->plan_text) >= (int)sizeof g->plan_text) /* (what a session's ranks compare, whole) */
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "plan apply: the plan's text is longer than %zu characters", sizeof g->plan_text - 1);
    int L = p->stage_first[p->pp]; /* the layers the plan cut; a parsed plan without stages: the graph's */
    for (int i = 0; i < g->n && p->stage_first[p->pp] == 0; i++)
        if (g->nodes[i]->layer + 1 > L) L = g->nodes[i]->layer + 1;
    int first[PDDE_PLAN_MAX_STAGES + 1];
    for (int s = 0; s <= p->pp; s++) first[s] = p->stage_first[p->pp] > 0 && p->chunks == 1 ? p->stage_first[s] : s * L / p->pp;
    if (p->pp * p->chunks > L || first[p->pp] != L)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "plan apply: the plan cuts %d layers into %d stages x %d chunks, the graph has %d", first[p->pp],
                          p->pp, p->chunks, L);
    int ranks = p->dp * p->tp * p->pp, world = params && params->world ? pdde_comm_size(params->world) : ranks;
    if (ranks != world)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "plan apply: the plan has %d rank%s (dp %d x tp %d x pp %d), the session's world %d: plan for every "
                          "rank (pdde_plan_params.use_all_devices = 1, on a cluster of the world's devices)", ranks, ranks > 1 ? "s" : "", p->dp, p->tp, p->pp, world);
    const pdde_mesh *mesh = NULL;
    pdde_status st = PDDE_OK;
    if (ranks > 1) { /* a [dp, tp, pp] mesh of the axes bigger than 1; with stage blocks, stage s on the s-th block of processes */
        int shape[3], n = 0, *proc = malloc((size_t)ranks * sizeof *proc);
        const char *names[3];
        if (!proc) return pdde_error(g->ctx, PDDE_ERR_OOM, "plan apply: out of memory");
        if (p->dp > 1) shape[n] = p->dp, names[n++] = "dp";
        if (p->tp > 1) shape[n] = p->tp, names[n++] = "tp";
        if (p->pp > 1) shape[n] = p->pp, names[n++] = "pp";
        for (int r = 0; r < ranks; r++) proc[r] = pdde_plan_process_of_rank(p, r);
        mesh = pdde_mesh_create(g, n, shape, names, proc);
        free(proc);
        if (!mesh) return pdde_graph_status(g);
        if (p->dp > 1) st = pdde_strategy_data_parallel(g, mesh, "dp");
        if (!st && p->dp > 1 && uneven) st = pdde_strategy_data_parallel_shares(g, mesh, "dp", p->shares);
        if (!st && p->tp > 1) st = plan_apply_tensor_parallel(g, mesh, p->tp);
        if (!st && p->pp > 1 && p->chunks > 1) st = pdde_strategy_pipeline_interleaved(g, mesh, "pp", L, p->chunks);
        for (int s = 0; s < p->pp && p->pp > 1 && p->chunks == 1 && !st; s++) {
            const pdde_mesh *stage = pdde_mesh_slice(g, mesh, n - 1, s);
            st = stage ? pdde_graph_set_layer_mesh(g, first[s], first[s + 1] - 1, stage) : pdde_graph_status(g);
        }
    }
    for (int l = 0; l < L && !st; l++) /* every layer, or each stage's first recompute_layers[s] */
        if (pdde_plan_layer_recomputed(p, L, l)) st = pdde_graph_set_recompute(g, l, 1);
    pdde_optimizer_params op = opt ? *opt : (pdde_optimizer_params)PDDE_OPTIMIZER_PARAMS_INIT;
    op.grad_accum_steps = p->micro;
    if (!st) st = pdde_backward(g, loss);
    if (!st) st = pdde_optimizer_adamw(g, &op);
    if (!st && mesh && p->zero && p->dp > 1) st = pdde_strategy_zero(g, mesh, "dp", p->zero);
    if (!st && mesh) st = pdde_complete_dist_attrs(g);
    if (st || !out) return st;
    pdde_session_params sp = params ? *params : (pdde_session_params)PDDE_SESSION_PARAMS_INIT;
    sp.pipeline_schedule = p->schedule, sp.comm_dtype = p->comm_dtype;
    if (!params) { /* the rank's device: $PDDE_DEVICE, else the one the cost model predicts fastest for g */
        pdde_device_select_params ds = PDDE_DEVICE_SELECT_PARAMS_INIT;
        pdde_device_choice c;
        ds.graph = g;
        if ((st = pdde_device_select(g->ctx, &ds, &c))) return st;
        sp.device = c.device;
    }
    int *layer_devices = NULL;
    if (p->place[0] && (st = plan_apply_placement(g, p, L, &layer_devices))) return st;
    if (!st && !sp.layer_devices && p->tp > 1 && !registry_device_is_host(g->ctx->registry, sp.device) &&
        (st = plan_apply_vocab_on_cpu(g, L, &layer_devices)))
        return st;
    if (layer_devices) sp.layer_devices = layer_devices, sp.n_layer_devices = L;
    st = pdde_session_init(g, &sp, out);
    free(layer_devices); /* (read while the session lowers its program) */
    return st;
}
