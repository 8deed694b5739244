/* core/optimizer.c — optimizers: one update node per parameter, plus a chain computing the global gradient norm when
 * clipping. The executor sets the learning rate and step of each update node before running it. */
/* (A part of pdde.c, included there in layer order: it uses the parts before it.) */

float pdde_lr_at(const pdde_optimizer_params *p, int64_t step) {
    if (!p) return pdde_lr_at(&(pdde_optimizer_params)PDDE_OPTIMIZER_PARAMS_INIT, step); /* (the optimizers' defaults) */
    float lr = p->lr > 0 ? p->lr : 1e-3f;
    if (p->warmup_steps > 0 && step < p->warmup_steps) return lr * (float)(step + 1) / (float)p->warmup_steps;
    if (p->schedule == PDDE_LR_COSINE && p->total_steps > p->warmup_steps) {
        double progress = (double)(step - p->warmup_steps) / (double)(p->total_steps - p->warmup_steps);
        if (progress > 1) progress = 1;
        double min_lr = lr * p->min_lr_ratio;
        return (float)(min_lr + 0.5 * (lr - min_lr) * (1 + cos(M_PI * progress)));
    }
    return lr;
}

static pdde_status add_optimizer(pdde_graph *g, const pdde_optimizer_params *params, pdde_op update_op) {
    if (!g) return PDDE_ERR_INVALID_ARG;
    if (g->status) return g->status;
    if (!g->has_backward) return pdde_error(g->ctx, PDDE_ERR_STATE, "optimizer: call pdde_backward first");
    if (g->has_optimizer) return pdde_error(g->ctx, PDDE_ERR_STATE, "optimizer: the graph already has one");
    pdde_optimizer_params p = PDDE_OPTIMIZER_PARAMS_INIT;
    if (params) p = *params;
    /* a NaN or infinite hyperparameter would train on silently into NaN weights: refuse it here */
    const struct { const char *name; float v, hi; bool hi_open; } hp[] = {
        {"lr", p.lr, INFINITY, false}, {"weight_decay", p.weight_decay, INFINITY, false}, {"clip_norm", p.clip_norm, INFINITY, false},
        {"eps", p.eps, INFINITY, false}, {"beta1", p.beta1, 1, true}, {"beta2", p.beta2, 1, true},
        {"momentum", p.momentum, 1, true}, {"min_lr_ratio", p.min_lr_ratio, 1, false},
    };
    for (size_t i = 0; i < sizeof hp / sizeof hp[0]; i++)
        if (!isfinite(hp[i].v) || hp[i].v < 0 || hp[i].v > hp[i].hi || (hp[i].hi_open && hp[i].v == hp[i].hi))
            return isinf(hp[i].hi) ? pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "optimizer: %s = %g must be finite and >= 0", hp[i].name, hp[i].v)
                                   : pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "optimizer: %s = %g must be in [0, %g%c", hp[i].name, hp[i].v, hp[i].hi,
                                                hp[i].hi_open ? ')' : ']');
    if (p.grad_accum_steps < 0 || p.warmup_steps < 0 || p.total_steps < 0 || (p.schedule != PDDE_LR_CONSTANT && p.schedule != PDDE_LR_COSINE))
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "optimizer: grad_accum_steps %d, warmup_steps %lld and total_steps %lld must be >= 0, "
                          "schedule %d constant or cosine", p.grad_accum_steps, (long long)p.warmup_steps, (long long)p.total_steps, (int)p.schedule);
    /* without decay steps, pdde_lr_at would keep cosine at the peak lr: a constant schedule, in silence */
    if (p.schedule == PDDE_LR_COSINE && p.total_steps <= p.warmup_steps)
        return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "optimizer: the cosine schedule needs total_steps (%lld) > warmup_steps (%lld): "
                          "set total_steps to the number of optimizer steps", (long long)p.total_steps, (long long)p.warmup_steps);
    if (p.lr == 0) p.lr = 1e-3f;
    if (p.grad_accum_steps == 0) p.grad_accum_steps = 1;
    if (update_op == PDDE_OP_ADAMW_UPDATE) {
        if (p.beta1 == 0) p.beta1 = 0.9f;
        if (p.beta2 == 0) p.beta2 = 0.999f;
        if (p.eps == 0) p.eps = 1e-8f;
    }
    g->opt = p;
    g->has_optimizer = true;
    int n = g->n;
    float scale = 1.0f / (float)p.grad_accum_steps;
    pdde_tensor *norm_sq = NULL;
    if (g->loss_scaling && g->grad_seed) {
        /* the seed of the backward pass is the loss scale: a constant the session rewrites, and state
         * that checkpoints keep (torch.cuda.amp.GradScaler's initial scale) */
        g->grad_seed->flags |= PDDE_TENSOR_STATE;
        pdde_op_set_f32(g->grad_seed, PDDE_P_CONST_VALUE, PDDE_LOSS_SCALE_INIT);
    }
    /* the squared norm: for clipping, and under loss scaling to see an overflow in any gradient */
    if (p.clip_norm > 0 || g->loss_scaling) {
        for (int i = 0; i < n; i++) {
            pdde_tensor *t = g->nodes[i];
            if (!(t->flags & PDDE_TENSOR_PARAM) || (t->flags & PDDE_TENSOR_SPARSE) || !t->grad) continue;
            pdde_tensor *src[2] = {t->grad, norm_sq};
            int64_t one = 1;
            norm_sq = new_node(g, PDDE_OP_GRAD_NORM_SQ, PDDE_F32, 1, &one, norm_sq ? 2 : 1, src);
            if (norm_sq) pdde_op_set_f32(norm_sq, PDDE_P_UPDATE_GRAD_SCALE, scale);
        }
    }
    for (int i = 0; i < n && g->status == PDDE_OK; i++) {
        pdde_tensor *t = g->nodes[i];
        if (!(t->flags & PDDE_TENSOR_PARAM) || (t->flags & PDDE_TENSOR_SPARSE) || !t->grad) continue; /* sparse: the server's */
        char name[80];
        pdde_tensor *src[6] = {t, t->grad};
        int nsrc = 2;
        g->layer = t->layer; /* the state lives with its parameter (placement, pipeline stage) */
        if (update_op == PDDE_OP_ADAMW_UPDATE) {
            snprintf(name, sizeof name, "%s.adam_m", t->name);
            src[nsrc++] = new_state(g, name, t, 0);
            snprintf(name, sizeof name, "%s.adam_v", t->name);
            src[nsrc++] = new_state(g, name, t, 0);
        } else {
            snprintf(name, sizeof name, "%s.momentum", t->name);
            src[nsrc++] = new_state(g, name, t, 0);
        }
        if (norm_sq) src[nsrc++] = norm_sq;
        /* the low-precision copy the matmuls read (graph.c's autocast): the update rewrites it from the new
         * values in the same pass, so it is not cast again each step (lowering drops this where the update
         * does not write the very tensor the cast reads, e.g. a ZeRO shard) */
        pdde_tensor *shadow = t->id < g->n_cast_of ? g->cast_of[t->id] : NULL;
        if (shadow && shadow->op == PDDE_OP_CAST && shadow->src[0] == t && !(shadow->flags & PDDE_TENSOR_OUTPUT))
            shadow->flags |= PDDE_TENSOR_SHADOW, src[nsrc++] = shadow;
        else shadow = NULL;
        pdde_tensor *u = node_with(g, update_op, t, nsrc, src);
        if (!u) break;
        if (shadow) pdde_op_set_i32(u, PDDE_P_UPDATE_SHADOW, 1);
        u->flags |= PDDE_TENSOR_INPLACE;
        u->device = t->device;
        pdde_op_set_f32(u, PDDE_P_UPDATE_LR, p.lr), pdde_op_set_f32(u, PDDE_P_UPDATE_WEIGHT_DECAY, t->ndim >= 2 ? p.weight_decay : 0.0f);
        pdde_op_set_f32(u, PDDE_P_UPDATE_CLIP, p.clip_norm), pdde_op_set_f32(u, PDDE_P_UPDATE_GRAD_SCALE, scale);
        if (update_op == PDDE_OP_ADAMW_UPDATE)
            pdde_op_set_f32(u, PDDE_P_UPDATE_BETA1, p.beta1), pdde_op_set_f32(u, PDDE_P_UPDATE_BETA2, p.beta2), pdde_op_set_f32(u, PDDE_P_UPDATE_EPS, p.eps);
        else
            pdde_op_set_f32(u, PDDE_P_SGD_MOMENTUM, p.momentum);
    }
    g->layer = -1;
    return g->status;
}

pdde_status pdde_optimizer_adamw(pdde_graph *g, const pdde_optimizer_params *p) { return add_optimizer(g, p, PDDE_OP_ADAMW_UPDATE); }
pdde_status pdde_optimizer_sgd(pdde_graph *g, const pdde_optimizer_params *p) { return add_optimizer(g, p, PDDE_OP_SGD_UPDATE); }
