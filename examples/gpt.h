/* gpt.h — a GPT-2-style model built with pdde's graph API (shared by examples/gpt.c, the tests and the
 * benchmarks). Weights are [in, out] and used as x @ W; the head is tied to the token embedding.
 *
 *   x = wte[ids] + wpe[0..T)
 *   per block:  x += proj(attention(ln1(x)))      attention: causal, H heads of D = C / H; q, k, v
 *                                                 from one fused [C, 3C] weight, columns [H, 3, D]
 *               x += fcproj(gelu(fc(ln2(x))))      fc's bias and the gelu: one op (pdde_bias_gelu)
 *   logits = ln_f(x) @ wte^T,  loss = mean cross-entropy(logits, targets) */
#ifndef PDDE_EXAMPLE_GPT_H
#define PDDE_EXAMPLE_GPT_H
#include "pdde.h"
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int vocab, ctx, layers, heads, width, batch;
    int ffn; /* hidden units of a block's MLP; 0 = 4 x width (GPT-2/3) */
    int unfused_attention; /* 1: attention from matmul + causal softmax + matmul (the reference), not fused */
    int unfused_gelu;      /* 1: the MLP's bias add and gelu as two ops (the reference), not pdde_bias_gelu */
} gpt_config;

static inline int64_t gpt_ffn(const gpt_config *c) { return c->ffn > 0 ? c->ffn : 4 * (int64_t)c->width; }

typedef struct {
    gpt_config cfg;
    pdde_tensor *ids, *targets;   /* i32 [B, T] inputs */
    pdde_tensor *logits;          /* [B*T, V] */
    pdde_tensor *loss;
} gpt_model;

/* x @ W + b with the weight <prefix>.w [in, out] and bias <prefix>.b [out]; gelu: gelu(x @ W + b), the
 * bias and the activation in one op (pdde_bias_gelu) */
static inline pdde_tensor *gpt_linear_act(pdde_graph *g, const char *prefix, pdde_tensor *x, int64_t in, int64_t out, float std, bool gelu) {
    char name[64];
    snprintf(name, sizeof name, "%s.w", prefix);
    pdde_tensor *w = pdde_param(g, name, 2, (int64_t[]){in, out}, std);
    snprintf(name, sizeof name, "%s.b", prefix);
    pdde_tensor *b = pdde_param(g, name, 1, (int64_t[]){out}, 0.0f);
    pdde_tensor *xw = pdde_matmul(g, x, w, 0, 0);
    return gelu ? pdde_bias_gelu(g, xw, b) : pdde_bias_add(g, xw, b);
}

static inline pdde_tensor *gpt_linear(pdde_graph *g, const char *prefix, pdde_tensor *x, int64_t in, int64_t out, float std) {
    return gpt_linear_act(g, prefix, x, in, out, std, false);
}

static inline pdde_tensor *gpt_layernorm(pdde_graph *g, const char *prefix, pdde_tensor *x, int64_t C) {
    char name[64];
    snprintf(name, sizeof name, "%s.g", prefix);
    pdde_tensor *gamma = pdde_param(g, name, 1, (int64_t[]){C}, PDDE_INIT_ONES);
    snprintf(name, sizeof name, "%s.b", prefix);
    pdde_tensor *beta = pdde_param(g, name, 1, (int64_t[]){C}, 0.0f);
    return pdde_layernorm(g, x, gamma, beta, 1e-5f);
}

/* Builds the forward graph and the loss; returns pdde_graph_status(g). Layers get layer ids 1..L (0 is
 * the embedding, L+1 the final norm and head), for placement per layer. */
static inline pdde_status gpt_build(pdde_graph *g, const gpt_config *c, gpt_model *m) {
    *m = (gpt_model){.cfg = *c};
    if (c->heads < 1 || c->width % c->heads || c->layers < 0)
        return pdde_error(pdde_graph_context(g), PDDE_ERR_INVALID_ARG, "gpt: width %d must be a multiple of heads %d >= 1 (layers %d >= 0)",
                          c->width, c->heads, c->layers);
    int64_t B = c->batch, T = c->ctx, C = c->width, V = c->vocab, H = c->heads, D = c->width / c->heads, F = gpt_ffn(c);
    float proj_std = 0.02f / sqrtf(2.0f * (float)c->layers);
    pdde_graph_set_layer(g, 0);
    m->ids = pdde_input(g, "ids", PDDE_I32, 2, (int64_t[]){B, T});
    m->targets = pdde_input(g, "targets", PDDE_I32, 1, (int64_t[]){B * T});
    pdde_tensor *wte = pdde_param(g, "wte", 2, (int64_t[]){V, C}, 0.02f);
    pdde_tensor *wpe = pdde_param(g, "wpe", 2, (int64_t[]){T, C}, 0.02f);
    pdde_tensor *x = pdde_add(g, pdde_embedding(g, wte, m->ids), wpe); /* [B, T, C] + [T, C] */
    for (int l = 0; l < c->layers; l++) {
        char p[32];
        pdde_graph_set_layer(g, l + 1);
        snprintf(p, sizeof p, "h%d.ln1", l);
        pdde_tensor *a = gpt_layernorm(g, p, x, C);
        snprintf(p, sizeof p, "h%d.attn", l);
        /* the fused qkv columns are head-major, [H, 3, D]: q, k, v of head h are adjacent */
        pdde_tensor *qkv = gpt_linear(g, p, a, C, 3 * C, 0.02f), *part[3];
        pdde_split(g, pdde_reshape(g, qkv, 5, (int64_t[]){B, T, H, 3, D}), 3, 3, part);
        for (int i = 0; i < 3; i++)
            part[i] = pdde_permute(g, pdde_reshape(g, part[i], 4, (int64_t[]){B, T, H, D}), (int[]){0, 2, 1, 3});
        pdde_tensor *y = (c->unfused_attention ? pdde_attention_unfused : pdde_attention)(g, part[0], part[1], part[2]); /* [B, H, T, D] */
        y = pdde_reshape(g, pdde_permute(g, y, (int[]){0, 2, 1, 3}), 3, (int64_t[]){B, T, C});
        snprintf(p, sizeof p, "h%d.proj", l);
        x = pdde_add(g, x, gpt_linear(g, p, y, C, C, proj_std));
        snprintf(p, sizeof p, "h%d.ln2", l);
        pdde_tensor *h = gpt_layernorm(g, p, x, C);
        snprintf(p, sizeof p, "h%d.fc", l);
        h = c->unfused_gelu ? pdde_gelu(g, gpt_linear(g, p, h, C, F, 0.02f)) : gpt_linear_act(g, p, h, C, F, 0.02f, true);
        snprintf(p, sizeof p, "h%d.fcproj", l);
        x = pdde_add(g, x, gpt_linear(g, p, h, F, C, proj_std));
    }
    pdde_graph_set_layer(g, c->layers + 1);
    x = gpt_layernorm(g, "lnf", x, C);
    m->logits = pdde_matmul(g, pdde_reshape(g, x, 2, (int64_t[]){B * T, C}), wte, 0, 1);
    m->loss = pdde_cross_entropy(g, m->logits, m->targets);
    pdde_graph_set_layer(g, -1);
    return pdde_graph_status(g);
}

/* Megatron tensor parallelism of every block over mesh axis `axis` (call after gpt_build; combine
 * with pdde_strategy_data_parallel on another axis). Each sublayer is a column-parallel linear, local
 * work, then a row-parallel linear whose partial sum is reduced once, where the next layernorm needs
 * the whole residual:
 *   MLP:        fc column parallel (each rank its ffn/tp hidden units), gelu local, fcproj row parallel.
 *   attention:  head parallel. The fused qkv weight's columns are head-major, [H, 3, D], so its
 *               column split gives each rank q, k and v of its own H/tp heads: [B,T,3C] split on the
 *               last dim reshapes to [B,T,H,3,D] split on H (the split lands on the outermost factor),
 *               slicing the "3" dim and permuting to [B,H,T,D] keep H split, and the fused
 *               attention (or the scores, causal softmax and att @ v) is per head. The output
 *               [B,T,C] comes out split on C, which is what the row-parallel proj needs: no
 *               communication from ln1 to proj's partial sum.
 * Forward: one allreduce per sublayer (after proj, after fcproj). Backward: the input gradient of a
 * column-parallel linear sums over its split columns, so it is partial over the axis and reduced where
 * the layernorm's backward needs it. Biases of column layers are split with them; those of row
 * layers, and the layernorms, stay whole (added once).
 * The token embedding wte (tied: also the head) is vocab parallel when the vocab divides by the axis
 * size (pdde_strategy_vocab_parallel): each rank holds V/tp rows, the lookup is a partial sum reduced
 * at ln1 of block 0, the logits come out split on the vocab and the cross-entropy reduces row max and
 * sum over the axis instead of gathering [B*T, V] logits. Otherwise wte stays whole on every rank. */
static inline pdde_status gpt_shard_tensor_parallel(pdde_graph *g, const pdde_mesh *mesh, const char *axis) {
    char w[64], b[64];
    pdde_tensor *wte = pdde_graph_find(g, "wte");
    int ax = mesh ? pdde_mesh_axis(mesh, axis) : -1;
    if (wte && ax >= 0 && wte->shape[0] % mesh->shape[ax] == 0) {
        pdde_status st = pdde_strategy_vocab_parallel(g, wte, mesh, axis);
        if (st) return st;
    }
    for (int l = 0;; l++) {
        static const char *const names[4] = {"attn", "proj", "fc", "fcproj"};
        static const pdde_tp_kind kinds[4] = {PDDE_TP_COLUMN, PDDE_TP_ROW, PDDE_TP_COLUMN, PDDE_TP_ROW};
        snprintf(w, sizeof w, "h%d.fc.w", l);
        if (!pdde_graph_find(g, w)) return l > 0 ? PDDE_OK : PDDE_ERR_NOT_FOUND;
        for (int i = 0; i < 4; i++) {
            snprintf(w, sizeof w, "h%d.%s.w", l, names[i]);
            snprintf(b, sizeof b, "h%d.%s.b", l, names[i]);
            pdde_status st = pdde_strategy_tensor_parallel_linear(g, pdde_graph_find(g, w), pdde_graph_find(g, b), mesh, axis, kinds[i]);
            if (st) return st;
        }
    }
}

/* A parallel plan: dp x tp x pp ranks, micro-batches per step, ZeRO stage (over dp), recompute of
 * every block. */
typedef struct {
    int dp, tp, pp, micro, zero, recompute;
    int pp_chunks; /* runs of layers per pipeline stage (interleaved stages); 0 or 1: one */
    /* with pp > 1 and one run per stage: stage s runs layer ids [stage_first[s], stage_first[s+1]) of
     * the layers + 2 (embedding, blocks, head), as the planner cuts them; NULL = an even cut */
    const int *stage_first;
    /* uneven data parallelism: dp index i runs shares[i] x micro micro-batches of the batch's
     * batch / (micro x the sum of shares) rows (pdde_strategy_data_parallel_shares); NULL = equal */
    const int *shares;
    /* the planner's plan this one runs (NULL: none, the fields above by hand): its layers recomputed
     * (recompute 1, or each stage's first recompute_layers, pdde_plan_layer_recomputed) instead of the
     * blocks when recompute is set, and its ranks' processes (stage_blocks, pdde_plan_process_of_rank) */
    const pdde_plan *plan;
} gpt_plan;

/* The gpt_plan of a planner's plan (pdde_plan_search or pdde_plan_parse); stage cuts and plan point
 * into p. The session takes p's schedule and comm_dtype (pdde_session_params). */
static inline gpt_plan gpt_plan_of(const pdde_plan *p) {
    int rc = p->recompute == 1;
    for (int s = 0; s < p->pp && s < PDDE_PLAN_MAX_STAGES; s++) rc |= p->recompute_layers[s] > 0;
    gpt_plan g = {.dp = p->dp, .tp = p->tp, .pp = p->pp, .micro = p->micro, .zero = p->zero, .recompute = rc, .pp_chunks = p->chunks, .plan = p};
    if (p->pp > 1 && p->chunks <= 1 && p->stage_first[p->pp] > 0) g.stage_first = p->stage_first;
    if (p->dp > 1 && p->shares[0] > 0) g.shares = p->shares;
    return g;
}

/* The micro-batch units of a step's batch per micro-batch count: dp (equal shares) or the sum of the
 * shares (0 when one is < 1). */
static inline int gpt_plan_units(const gpt_plan *p) {
    if (!p->shares || p->dp < 2) return p->dp;
    int units = 0;
    for (int i = 0; i < p->dp; i++) {
        if (p->shares[i] < 1) return 0;
        units += p->shares[i];
    }
    return units;
}

/* Writes this rank's micro-batches of a step's global batch x (and targets y, may be NULL; [rows, ctx]
 * each) into session s of model m (built by gpt_build_plan: m->cfg.batch is the graph's micro-batch)
 * under plan p; dp_index: the rank's data-parallel index. Equal shares: micro-batch i is the i-th block
 * of the global batch, of which each rank keeps its rows. Uneven shares: dp index d takes its share of
 * consecutive blocks of m->cfg.batch / dp rows (the blocks of the indices before it first), each
 * written where index d's rows of the graph's micro-batch sit. */
static inline pdde_status gpt_write_batch(pdde_session *s, const gpt_model *m, const gpt_plan *p, int dp_index, const int32_t *x,
                                          const int32_t *y) {
    size_t T = (size_t)m->cfg.ctx, graph_rows = (size_t)m->cfg.batch;
    pdde_status st = PDDE_OK;
    if (!p->shares || p->dp < 2) {
        size_t block = graph_rows * T;
        for (int i = 0; i < pdde_session_micro_batches(s) && st == PDDE_OK; i++) {
            st = pdde_session_write_micro(s, m->ids, i, x + i * block, block * sizeof *x);
            if (st == PDDE_OK && y) st = pdde_session_write_micro(s, m->targets, i, y + i * block, block * sizeof *y);
        }
        return st;
    }
    size_t block = graph_rows / (size_t)p->dp * T, first = 0;
    for (int d = 0; d < dp_index; d++) first += (size_t)p->shares[d] * (size_t)(p->micro > 1 ? p->micro : 1);
    int32_t *scratch = (int32_t *)calloc(graph_rows * T, sizeof *scratch);
    if (!scratch) return PDDE_ERR_OOM;
    for (int i = 0; i < pdde_session_micro_batches(s) && st == PDDE_OK; i++) {
        memcpy(scratch + (size_t)dp_index * block, x + (first + i) * block, block * sizeof *x);
        st = pdde_session_write_micro(s, m->ids, i, scratch, graph_rows * T * sizeof *x);
        if (st == PDDE_OK && y) {
            memcpy(scratch + (size_t)dp_index * block, y + (first + i) * block, block * sizeof *y);
            st = pdde_session_write_micro(s, m->targets, i, scratch, graph_rows * T * sizeof *y);
        }
    }
    free(scratch);
    return st;
}

/* The training graph of a plan: the model for one micro-batch (c->batch / micro rows of the global
 * batch), each block recomputed in backward if asked, AdamW (opt, with grad_accum_steps = micro).
 * With more than one rank it is annotated on a mesh of the plan's axes bigger than 1 (dp, tp, pp in
 * that order) with data, tensor (gpt_shard_tensor_parallel) and pipeline parallelism (one stage per
 * pp index over the embedding, blocks and head) and ZeRO, and completed. */
static inline pdde_status gpt_build_plan(pdde_graph *g, const gpt_config *c, const gpt_plan *p, const pdde_optimizer_params *opt,
                                         gpt_model *m) {
    int micro = p->micro > 1 ? p->micro : 1, units = gpt_plan_units(p);
    *m = (gpt_model){.cfg = *c};
    if (p->dp < 1 || p->tp < 1 || p->pp < 1 || p->zero < 0 || p->zero > 3 || units < 1 || c->batch % (micro * units))
        return pdde_error(pdde_graph_context(g), PDDE_ERR_INVALID_ARG, "gpt: plan dp %d, tp %d, pp %d (each >= 1), ZeRO stage %d (0..3), "
                          "%d micro-batches x %d shares (each >= 1) dividing the batch %d", p->dp, p->tp, p->pp, p->zero, micro, units, c->batch);
    bool parallel = p->dp * p->tp * p->pp > 1;
    gpt_config local = *c;
    local.batch = c->batch / (micro * units) * p->dp; /* one micro-batch of every dp index */
    pdde_status st = gpt_build(g, &local, m);
    const pdde_mesh *mesh = NULL;
    if (!st && parallel) {
        int shape[3], n = 0;
        const char *names[3];
        if (p->dp > 1) shape[n] = p->dp, names[n++] = "dp";
        if (p->tp > 1) shape[n] = p->tp, names[n++] = "tp";
        if (p->pp > 1) shape[n] = p->pp, names[n++] = "pp";
        int *proc = (int *)malloc((size_t)p->dp * p->tp * p->pp * sizeof *proc); /* mesh rank -> process */
        if (!proc) return pdde_error(pdde_graph_context(g), PDDE_ERR_OOM, "gpt: out of memory");
        for (int r = 0; r < p->dp * p->tp * p->pp; r++) proc[r] = p->plan ? pdde_plan_process_of_rank(p->plan, r) : r;
        mesh = pdde_mesh_create(g, n, shape, names, proc);
        free(proc);
        if (!mesh) return pdde_graph_status(g);
        if (p->dp > 1) st = pdde_strategy_data_parallel(g, mesh, "dp");
        if (!st && p->dp > 1 && p->shares) st = pdde_strategy_data_parallel_shares(g, mesh, "dp", p->shares);
        if (!st && p->tp > 1) st = gpt_shard_tensor_parallel(g, mesh, "tp");
        if (!st && p->pp > 1 && p->stage_first && p->pp_chunks <= 1) {
            if (p->stage_first[0] != 0 || p->stage_first[p->pp] != c->layers + 2) {
                pdde_error(pdde_graph_context(g), PDDE_ERR_INVALID_ARG, "gpt: the stages cut %d..%d, not the %d layers", p->stage_first[0],
                           p->stage_first[p->pp], c->layers + 2);
                return PDDE_ERR_INVALID_ARG;
            }
            for (int s = 0; s < p->pp && !st; s++) {
                const pdde_mesh *stage = pdde_mesh_slice(g, mesh, n - 1, s);
                st = stage ? pdde_graph_set_layer_mesh(g, p->stage_first[s], p->stage_first[s + 1] - 1, stage) : pdde_graph_status(g);
            }
        } else if (!st && p->pp > 1) {
            st = pdde_strategy_pipeline_interleaved(g, mesh, "pp", c->layers + 2, p->pp_chunks > 1 ? p->pp_chunks : 1);
        }
    }
    for (int l = 0; l < c->layers + 2 && !st && p->recompute; l++) /* the plan's layers, or every block */
        if (p->plan ? pdde_plan_layer_recomputed(p->plan, c->layers + 2, l) : l >= 1 && l <= c->layers) st = pdde_graph_set_recompute(g, l, 1);
    pdde_optimizer_params op = *opt;
    op.grad_accum_steps = micro;
    if (!st) st = pdde_backward(g, m->loss);
    if (!st) st = pdde_optimizer_adamw(g, &op);
    if (!st && parallel && p->zero) st = pdde_strategy_zero(g, mesh, "dp", p->zero);
    if (!st && parallel) st = pdde_complete_dist_attrs(g);
    return st;
}

/* What pdde_plan_params.build wants (user: a gpt_plan_builder): the training graph of a planner's plan
 * for the GPT of cfg with optimizer opt, for the planner to simulate its real programs. */
typedef struct {
    gpt_config cfg;
    pdde_optimizer_params opt;
} gpt_plan_builder;

static inline pdde_status gpt_plan_build(pdde_graph *g, const pdde_plan *p, void *user) {
    const gpt_plan_builder *b = (const gpt_plan_builder *)user;
    pdde_plan even = *p;
    if (even.pp > 1 && even.chunks <= 1 && even.stage_first[even.pp] == 0) /* no cut given: the even one */
        for (int s = 0; s <= even.pp; s++) even.stage_first[s] = s * (b->cfg.layers + 2) / even.pp;
    gpt_plan gp = gpt_plan_of(&even);
    gpt_model m;
    return gpt_build_plan(g, &b->cfg, &gp, &b->opt, &m);
}

/* The planner's devices for training the GPT of c: the devices of a cluster file (pdde-bench writes
 * one), timed on the nodes of the model's training step as one of the ranks runs them
 * (pdde_plan_devices_init_graph). With ranks > 0 the
 * job has that many ranks: a one-machine cluster (this machine, as pdde-bench measured it with the
 * threads a rank gets, PDDE_NUM_THREADS) gives every rank a copy of its first device (the CPU) and a
 * share of its memory; a cluster of several machines must list one device per rank. */
static inline pdde_status gpt_plan_devices(pdde_context *ctx, const char *cluster_path, const gpt_config *c, int ranks, pdde_plan_devices *d) {
    pdde_cluster *cl = NULL;
    pdde_graph *g = NULL;
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_status st = pdde_cluster_load(ctx, cluster_path, &cl);
    if (!st) st = pdde_graph_init(ctx, &g);
    if (!st) st = gpt_build(g, c, &m);
    if (!st) st = pdde_backward(g, m.loss);
    if (!st) st = pdde_optimizer_adamw(g, &op);
    if (!st) st = pdde_plan_devices_init_graph(ctx, cl, g, ranks, d);
    pdde_graph_free(g);
    int have = st ? 0 : d->n_devices;
    if (!st && ranks > 0 && (cl->n_machines == 1 || have != ranks)) {
        if (cl->n_machines != 1) {
            st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s lists %d devices on %d machines, the job has %d ranks", cluster_path, have, cl->n_machines, ranks);
        } else {
            /* the machine's first device of another backend than the first's (a CPU's OpenCL or GPU
             * device): each rank may place layers there (shared by the ranks: a share of its memory) */
            const pdde_cluster_machine *mc = &cl->machines[0];
            int second = 0;
            for (int i = 1; i < mc->n_devices && i < have && !second; i++)
                if (strcmp(cl->specs[mc->devices[i].spec].backend, cl->specs[mc->devices[0].spec].backend)) second = i;
            pdde_cluster_link link = {0};
            if (second && pdde_cluster_link_between(cl, mc->devices[0].id, mc->devices[second].id, &link)) second = 0;
            double *a = (double *)malloc((size_t)ranks * 7 * sizeof *a);
            int *host = (int *)calloc((size_t)ranks, sizeof *host);
            if (!a || !host) {
                free(a), free(host);
                st = pdde_error(ctx, PDDE_ERR_OOM, "gpt: out of memory");
            } else {
                for (int r = 0; r < ranks; r++)
                    a[r] = d->flops[0], a[ranks + r] = d->mem_bw[0], a[2 * ranks + r] = d->memory[0] / ranks,
                    a[3 * ranks + r] = d->op_latency ? d->op_latency[0] : 0, a[4 * ranks + r] = second ? d->flops[second] : 0,
                    a[5 * ranks + r] = second ? d->mem_bw[second] : 0, a[6 * ranks + r] = second ? d->memory[second] / ranks : 0;
                free((void *)d->flops), free((void *)d->host);
                d->n_devices = ranks, d->flops = a, d->mem_bw = a + ranks, d->memory = a + 2 * ranks, d->op_latency = a + 3 * ranks;
                d->host = host;
                if (!(d->intra_bw > 0)) d->intra_bw = cl->machines[0].intra.bandwidth, d->intra_lat = cl->machines[0].intra.latency;
                if (second && link.bandwidth > 0) {
                    d->place_flops = a + 4 * ranks, d->place_mem_bw = a + 5 * ranks, d->place_memory = a + 6 * ranks;
                    d->place_bw = link.bandwidth, d->place_lat = link.latency;
                    snprintf(d->place_backend, sizeof d->place_backend, "%s", cl->specs[mc->devices[second].spec].backend);
                }
            }
        }
        if (st && have) pdde_plan_devices_free(d);
    }
    pdde_cluster_free(cl);
    return st;
}

/* The planner's plans for training the GPT of c on d (fastest first, then rejected ones with why):
 * pdde_plan_search over the model's training graph at its global batch, tensor parallelism by heads;
 * with a cluster (d's devices), the best ones ranked by simulating their real programs on it. */
static inline pdde_status gpt_plan_search_simulated(pdde_context *ctx, const gpt_config *c, const pdde_plan_devices *d, int use_all_devices,
                                                    const pdde_cluster *cluster, pdde_plan *plans, int max_plans, int *n_fit, int *n_rejected) {
    pdde_graph *g = NULL;
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_status st = pdde_graph_init(ctx, &g);
    if (!st) st = gpt_build(g, c, &m);
    if (!st) st = pdde_backward(g, m.loss);
    if (!st) st = pdde_optimizer_adamw(g, &op);
    pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
    gpt_plan_builder b;
    b.cfg = *c, b.opt = (pdde_optimizer_params)PDDE_OPTIMIZER_PARAMS_INIT;
    pp.batch = c->batch, pp.tp_divisor = c->heads, pp.use_all_devices = use_all_devices;
    if (cluster) pp.cluster = cluster, pp.build = gpt_plan_build, pp.build_user = &b;
    if (!st) st = pdde_plan_search(g, d, &pp, plans, max_plans, n_fit, n_rejected);
    pdde_graph_free(g);
    return st;
}

/* The same by the estimate alone. */
static inline pdde_status gpt_plan_search(pdde_context *ctx, const gpt_config *c, const pdde_plan_devices *d, int use_all_devices,
                                          pdde_plan *plans, int max_plans, int *n_fit, int *n_rejected) {
    return gpt_plan_search_simulated(ctx, c, d, use_all_devices, NULL, plans, max_plans, n_fit, n_rejected);
}

static inline int64_t gpt_n_params(const gpt_config *c) {
    int64_t C = c->width, F = gpt_ffn(c);
    return (int64_t)c->vocab * C + (int64_t)c->ctx * C + 2 * C +
           (int64_t)c->layers * (4 * C + 3 * C * C + 3 * C + C * C + C + C * F + F + F * C + C);
}
#endif
