/* gpt.h — Demonstrates how to build a transformer with pdde's graph API and annotate it for every
 * parallelism: a GPT-2-style model, or a LLaMA-style one (shared by examples/gpt.c, the tests and the
 * benchmarks). Weights are [in, out] and used as x @ W; the head is tied to the token embedding unless
 * cfg.untied_head gives it a parameter of its own ("head" [V, C], LLaMA 2's and TinyLlama's).
 *
 * GPT (cfg.arch GPT_ARCH_GPT, the default):
 *   x = wte[ids] + wpe[0..T)
 *   per block:  x += proj(attention(ln1(x)))      attention: causal, H heads of D = C / H; q, k, v
 *                                                 from one fused [C, 3C] weight, columns [H, 3, D]
 *               x += fcproj(gelu(fc(ln2(x))))      fc's bias and the gelu: one op (pdde_bias_gelu)
 *   logits = ln_f(x) @ wte^T,  loss = mean cross-entropy(logits, targets)
 * LLaMA (GPT_ARCH_LLAMA): no position embedding, no biases (cfg.qkv_bias: q, k and v with biases, as
 *   Qwen2's), RMSNorm instead of LayerNorm (gains only),
 *   per block:  x += proj(attention(rope(q), rope(k), v)) on rmsnorm(x)   grouped-query attention:
 *                                                 Hkv = kv_heads groups of H / Hkv query heads sharing
 *                                                 one k and v head; qkv columns [Hkv, H/Hkv + 2, D];
 *                                                 D = C / H unless cfg.head_dim says (proj: H D -> C);
 *                                                 cfg.qk_norm: rmsnorm of each head of q and k first
 *               x += fcproj(silu(fc(h)) * fc3(h)),  h = rmsnorm(x)        (SwiGLU: w1, w3, w2)
 *   logits = rmsnorm_f(x) @ wte^T (tied, as GPT's), or @ head^T (untied_head) */
#ifndef PDDE_EXAMPLE_GPT_H
#define PDDE_EXAMPLE_GPT_H
#include "pdde.h"
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { GPT_ARCH_GPT = 0, GPT_ARCH_LLAMA = 1 } gpt_arch;

typedef struct {
    int vocab, ctx, layers, heads, width, batch;
    int ffn; /* hidden units of a block's MLP; 0 = 4 x width (GPT), 8/3 x width rounded up (LLaMA: gpt_ffn) */
    int unfused_attention; /* 1: attention from matmul + causal softmax + matmul (the reference), not fused */
    int unfused_gelu;      /* 1: the MLP's bias add and gelu as two ops (the reference), not pdde_bias_gelu */
    int separate_qkv;      /* 1: q, k, v sliced from qkv and permuted to [B, H, T, D] for pdde_attention (and
                              its output back), not pdde_attention_qkv on qkv in place; gpt_separate_qkv */
    /* Mixture-of-Experts (gpt_moe_ffn): moe_experts > 1 replaces the MLP of every moe_every-th block
     * (0 or 1: every block) by moe_experts expert MLPs of ffn hidden units each, moe_topk (0 = 2) of
     * them per token; moe_capacity > 0: that capacity factor (tokens past it dropped), 0 dropless;
     * moe_aux: weight of the balance loss in the loss; moe_bias: 1 = DeepSeek's balancing bias (an
     * input "h<l>.moe.bias" [E] the caller updates, gpt_moe_update_bias); moe_ep: the experts' buffer
     * by expert (pdde_moe_dispatch_experts, capacity N when dropless), and under data parallelism the
     * experts split over the dp axis (expert parallelism: gpt_shard_experts) */
    int moe_experts, moe_topk, moe_every, moe_bias, moe_ep;
    float moe_capacity, moe_aux;
    gpt_arch arch;
    int kv_heads;    /* LLaMA: key/value heads (grouped-query attention), dividing heads; 0 = heads */
    float rope_base; /* LLaMA: RoPE's base; 0 = 10000 */
    float rope_scaling[4]; /* LLaMA 3.1's long-context frequencies (pdde_rope_llama3): factor, low_freq,
                              high_freq, original context; factor 0: none */
    float norm_eps;  /* the layernorms' (RMSNorms') epsilon; 0 = 1e-5 */
    int untied_head; /* 1: the head is its own parameter "head" [V, C], not wte */
    int qkv_bias;    /* LLaMA: 1 = the qkv projection has a bias "h<l>.attn.b" (Qwen2's) */
    int head_dim;    /* LLaMA: each head's width; 0 = width / heads (Qwen3's are wider: q, k, v of heads x head_dim, proj back to width) */
    int qk_norm;     /* LLaMA: 1 = an RMSNorm over each head of q and of k before RoPE, gains "h<l>.attn.qn.g" and "h<l>.attn.kn.g"
                        [head dim] (Qwen3's) */
    /* LoRA (gpt_lora): lora_rank > 0 holds every pretrained weight frozen (a state input, loaded by the
     * caller) and trains, beside each linear of the blocks, adapters <w>.lora_a [in, r] (normal, std
     * 1 / sqrt(in)) and <w>.lora_b [r, out] (zeros): x W + (x A) B lora_alpha / r */
    int lora_rank;
    float lora_alpha; /* 0 = lora_rank (a scale of 1) */
    /* Packed documents kept apart (gpt_starts_inputs): doc_mask 1: a document of a window starts at token doc_token, and
     * attention stays inside each; GPT's positions restart at each document (an input "positions" [B, T]; RoPE's
     * scores depend on distances only) */
    int doc_mask;
    int32_t doc_token;
    /* Sliding-window attention (Mistral's): window > 0: a token attends to itself and the window - 1 before it */
    int window;
} gpt_config;

static inline const char *gpt_arch_name(gpt_arch a) { return a == GPT_ARCH_LLAMA ? "llama" : "gpt"; }
static inline int gpt_kv_heads(const gpt_config *c) { return c->kv_heads > 0 ? c->kv_heads : c->heads; }
static inline int gpt_head_dim(const gpt_config *c) { return c->head_dim > 0 ? c->head_dim : c->heads > 0 ? c->width / c->heads : 0; }
static inline float gpt_rope_base(const gpt_config *c) { return c->rope_base > 0 ? c->rope_base : 10000.0f; }
static inline float gpt_norm_eps(const gpt_config *c) { return c && c->norm_eps > 0 ? c->norm_eps : 1e-5f; }
static inline float gpt_lora_alpha(const gpt_config *c) { return c->lora_alpha > 0 ? c->lora_alpha : (float)c->lora_rank; }

/* A weight of model c (NULL: a plain model): a parameter, or under LoRA the pretrained value held
 * frozen: a state input (checkpointed, never trained) that the caller loads */
static inline pdde_tensor *gpt_weight(pdde_graph *g, const gpt_config *c, const char *name, int ndim, const int64_t *shape, float std) {
    if (!c || c->lora_rank <= 0) return pdde_param(g, name, ndim, shape, std);
    pdde_tensor *t = pdde_input(g, name, PDDE_F32, ndim, shape);
    if (t) pdde_mark_state(t);
    return t;
}

/* y = x @ <prefix>.w plus, under LoRA, the adapters' (x A) B alpha / r */
static inline pdde_tensor *gpt_lora(pdde_graph *g, const gpt_config *c, const char *prefix, pdde_tensor *x, pdde_tensor *y, int64_t in, int64_t out) {
    if (!c || c->lora_rank <= 0) return y;
    char name[64];
    int64_t r = c->lora_rank;
    snprintf(name, sizeof name, "%s.lora_a", prefix);
    pdde_tensor *a = pdde_param(g, name, 2, (int64_t[]){in, r}, 1.0f / sqrtf((float)in));
    snprintf(name, sizeof name, "%s.lora_b", prefix);
    pdde_tensor *b = pdde_param(g, name, 2, (int64_t[]){r, out}, 0.0f);
    float scale = gpt_lora_alpha(c) / (float)r;
    return pdde_add(g, y, pdde_scale(g, pdde_matmul(g, pdde_matmul(g, x, a, 0, 0), b, 0, 0), scale));
}

/* LLaMA's SwiGLU holds three matrices where GPT's MLP holds two, so its hidden units are 2/3 of 4 C,
 * rounded up to a multiple of 256 (LLaMA's multiple_of) from width 1024 on and of 32 below (tiny models
 * stay tiny: width 32 -> 96, 128 -> 352, 4096 -> 11008). */
static inline int64_t gpt_ffn(const gpt_config *c) {
    if (c->ffn > 0) return c->ffn;
    if (c->arch != GPT_ARCH_LLAMA) return 4 * (int64_t)c->width;
    int64_t f = 8 * (int64_t)c->width / 3, multiple = c->width >= 1024 ? 256 : 32;
    return (f + multiple - 1) / multiple * multiple;
}

/* Reads weight t of model c (built by gpt_build) from session s into dst: under LoRA the pretrained
 * value plus its adapters' product, A B alpha / r, which a plain model of c's shape computes with */
static inline pdde_status gpt_read_weight(pdde_session *s, pdde_graph *g, const gpt_config *c, const pdde_tensor *t, float *dst) {
    pdde_status st = pdde_session_read(s, t, dst, pdde_tensor_nbytes(t));
    char name[80];
    size_t n = strlen(t->name);
    if (st || c->lora_rank <= 0 || n < 2 || strcmp(t->name + n - 2, ".w")) return st;
    snprintf(name, sizeof name, "%.*s.lora_a", (int)(n - 2), t->name);
    pdde_tensor *a = pdde_graph_find(g, name);
    snprintf(name, sizeof name, "%.*s.lora_b", (int)(n - 2), t->name);
    pdde_tensor *b = pdde_graph_find(g, name);
    if (!a || !b) return PDDE_OK;
    int64_t in = a->shape[0], r = a->shape[1], out = b->shape[1];
    float *av = malloc((size_t)(in * r) * sizeof *av), *bv = malloc((size_t)(r * out) * sizeof *bv);
    float scale = gpt_lora_alpha(c) / (float)r;
    st = !av || !bv ? PDDE_ERR_OOM : pdde_session_read(s, a, av, (size_t)(in * r) * sizeof *av);
    if (!st) st = pdde_session_read(s, b, bv, (size_t)(r * out) * sizeof *bv);
    for (int64_t i = 0; !st && i < in; i++)
        for (int64_t k = 0; k < r; k++) {
            float aik = av[i * r + k] * scale;
            for (int64_t j = 0; j < out; j++) dst[i * out + j] += aik * bv[k * out + j];
        }
    free(av), free(bv);
    return st;
}

/* 1 with the name of the first weight of graph g (a parameter or a state input: LoRA's frozen weights)
 * that this rank of session s does not hold whole (another pipeline stage's, a tensor-parallel or ZeRO-3
 * block), 0 when it holds them all: what a model file written from this rank needs */
static inline int gpt_partial(pdde_session *s, pdde_graph *g, char *name, size_t name_size) {
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (!(t->flags & PDDE_TENSOR_PARAM) && (t->flags & (PDDE_TENSOR_INPUT | PDDE_TENSOR_STATE)) != (PDDE_TENSOR_INPUT | PDDE_TENSOR_STATE)) continue;
        const pdde_tensor *here = pdde_session_tensor(s, t);
        if (!here || pdde_tensor_numel(here) != pdde_tensor_numel(t)) return snprintf(name, name_size, "%s", t->name), 1;
    }
    return 0;
}

/* Tensor-parallel degrees must divide this: the heads (GPT), the kv groups (LLaMA: each rank whole
 * groups) */
static inline int gpt_tp_divisor(const gpt_config *c) { return c->arch == GPT_ARCH_LLAMA ? gpt_kv_heads(c) : c->heads; }

/* The attention's layout: the packed form (pdde_attention_qkv) unless PDDE_SEPARATE_QKV=1 asks for q, k and v
 * sliced and permuted apart (to compare; the same losses). */
static inline int gpt_separate_qkv(const char *device) {
    (void)device;
    const char *v = getenv("PDDE_SEPARATE_QKV");
    return v && !strcmp(v, "1");
}

typedef struct {
    gpt_config cfg;
    pdde_tensor *ids, *targets;   /* i32 [B, T] inputs */
    pdde_tensor *starts;          /* cfg.doc_mask or cfg.window: i32 [B, T], each token's first key (gpt_starts_inputs) */
    pdde_tensor *positions;       /* cfg.doc_mask (GPT): i32 [B, T], each token's position in its document */
    pdde_tensor *logits;          /* [B*T, V] */
    pdde_tensor *loss;
    pdde_tensor *moe_balance;     /* MoE: the balance loss, averaged over the MoE blocks (NULL without) */
} gpt_model;

static inline int gpt_moe_topk(const gpt_config *c) { return c->moe_topk > 0 ? c->moe_topk : 2; }
/* whether block l has the MoE feed-forward */
static inline bool gpt_block_is_moe(const gpt_config *c, int l) {
    return c->moe_experts > 1 && (l + 1) % (c->moe_every > 1 ? c->moe_every : 1) == 0;
}

/* The MoE feed-forward of block l on h [B, T, C] (Mixtral-style routing, GELU experts in both architectures, no
 * biases): router logits, top-k, the weights softmax-normalised over the k chosen, the tokens
 * dispatched into expert order, two grouped GEMMs, combined back. Its tensors: h<l>.moe.router [C, E],
 * .w1 [E, C, F], .w2 [E, F, C]; "h<l>.moe.counts" (i32 [E], tokens per expert, kept readable). *balance
 * gets the block's balance loss. */
static inline pdde_tensor *gpt_moe_ffn(pdde_graph *g, const gpt_config *c, int l, pdde_tensor *h, float proj_std, pdde_tensor **balance) {
    int64_t N = (int64_t)c->batch * c->ctx, C = c->width, F = gpt_ffn(c), E = c->moe_experts;
    int k = gpt_moe_topk(c);
    int64_t cap = pdde_moe_capacity(N, k, (int)E, c->moe_capacity);
    char name[64];
    pdde_tensor *x = pdde_reshape(g, h, 2, (int64_t[]){N, C}), *bias = NULL;
    snprintf(name, sizeof name, "h%d.moe.router", l);
    pdde_tensor *logits = pdde_matmul(g, x, pdde_param(g, name, 2, (int64_t[]){C, E}, 0.02f), 0, 0);
    if (c->moe_bias) {
        snprintf(name, sizeof name, "h%d.moe.bias", l);
        bias = pdde_input(g, name, PDDE_F32, 1, (int64_t[]){E});
        pdde_mark_state(bias); /* (checkpoints keep it: a resume goes on with it) */
    }
    pdde_tensor *idx = pdde_moe_topk(g, logits, bias, k, 0);
    pdde_tensor *counts = pdde_moe_counts(g, idx, (int)E);
    snprintf(name, sizeof name, "h%d.moe.counts", l);
    if (counts) pdde_tensor_set_name(counts, name), pdde_mark_output(counts);
    snprintf(name, sizeof name, "h%d.moe.w1", l);
    pdde_tensor *w1 = pdde_param(g, name, 3, (int64_t[]){E, C, F}, 0.02f);
    snprintf(name, sizeof name, "h%d.moe.w2", l);
    pdde_tensor *w2 = pdde_param(g, name, 3, (int64_t[]){E, F, C}, proj_std);
    if (c->moe_ep && cap == 0) cap = N; /* by expert: N rows an expert hold every token, dropless */
    pdde_tensor *xe = c->moe_ep ? pdde_moe_dispatch_experts(g, x, idx, (int)E, cap) : pdde_moe_dispatch(g, x, idx, (int)E, cap);
    pdde_tensor *he = pdde_gelu(g, pdde_moe_grouped_matmul(g, xe, w1, idx, cap, 0));
    pdde_tensor *y = pdde_moe_combine(g, pdde_moe_grouped_matmul(g, he, w2, idx, cap, 0), idx, pdde_moe_gate(g, logits, idx, 0), (int)E, cap);
    *balance = pdde_moe_aux_loss(g, logits, idx, (int)E);
    return pdde_reshape(g, y, 3, (int64_t[]){c->batch, c->ctx, C});
}

/* x @ W + b with the weight <prefix>.w [in, out] and bias <prefix>.b [out] of model c (NULL: plain);
 * gelu: gelu(x @ W + b), the bias and the activation in one op (pdde_bias_gelu) */
static inline pdde_tensor *gpt_linear_act(pdde_graph *g, const gpt_config *c, const char *prefix, pdde_tensor *x, int64_t in, int64_t out, float std,
                                          bool gelu) {
    char name[64];
    snprintf(name, sizeof name, "%s.w", prefix);
    pdde_tensor *w = gpt_weight(g, c, name, 2, (int64_t[]){in, out}, std);
    snprintf(name, sizeof name, "%s.b", prefix);
    pdde_tensor *b = gpt_weight(g, c, name, 1, (int64_t[]){out}, 0.0f);
    pdde_tensor *xw = gpt_lora(g, c, prefix, x, pdde_matmul(g, x, w, 0, 0), in, out);
    return gelu ? pdde_bias_gelu(g, xw, b) : pdde_bias_add(g, xw, b);
}

static inline pdde_tensor *gpt_linear(pdde_graph *g, const gpt_config *c, const char *prefix, pdde_tensor *x, int64_t in, int64_t out, float std) {
    return gpt_linear_act(g, c, prefix, x, in, out, std, false);
}

static inline pdde_tensor *gpt_layernorm(pdde_graph *g, const gpt_config *c, const char *prefix, pdde_tensor *x, int64_t C) {
    char name[64];
    snprintf(name, sizeof name, "%s.g", prefix);
    pdde_tensor *gamma = gpt_weight(g, c, name, 1, (int64_t[]){C}, PDDE_INIT_ONES);
    snprintf(name, sizeof name, "%s.b", prefix);
    pdde_tensor *beta = gpt_weight(g, c, name, 1, (int64_t[]){C}, 0.0f);
    return pdde_layernorm(g, x, gamma, beta, gpt_norm_eps(c));
}

/* The architecture's norm of x [.., C] with parameters <prefix>.g (and GPT's <prefix>.b) */
static inline pdde_tensor *gpt_norm(pdde_graph *g, const gpt_config *c, const char *prefix, pdde_tensor *x, int64_t C) {
    if (c->arch != GPT_ARCH_LLAMA) return gpt_layernorm(g, c, prefix, x, C);
    char name[64];
    snprintf(name, sizeof name, "%s.g", prefix);
    return pdde_rmsnorm(g, x, gpt_weight(g, c, name, 1, (int64_t[]){C}, PDDE_INIT_ONES), gpt_norm_eps(c));
}

/* x @ <prefix>.w [in, out], no bias (LLaMA's linears) */
static inline pdde_tensor *gpt_linear_nobias(pdde_graph *g, const gpt_config *c, const char *prefix, pdde_tensor *x, int64_t in, int64_t out,
                                             float std) {
    char name[64];
    snprintf(name, sizeof name, "%s.w", prefix);
    return gpt_lora(g, c, prefix, x, pdde_matmul(g, x, gpt_weight(g, c, name, 2, (int64_t[]){in, out}, std), 0, 0), in, out);
}

/* The attention window in effect: cfg.window where it is shorter than the context, else 0 (none) */
static inline int gpt_window(const gpt_config *c) { return c->window > 0 && c->window < c->ctx ? c->window : 0; }
/* Whether the attention takes each token's first key (the input "starts"): documents kept apart, or a window */
static inline int gpt_attends_from_starts(const gpt_config *c) { return c->doc_mask || gpt_window(c); }

/* Causal attention of q, k, v [B, H, T, D]: fused, or the reference's unfused form; from each token's first key (the
 * input "starts") under cfg.doc_mask or cfg.window */
static inline pdde_tensor *gpt_attend(pdde_graph *g, const gpt_config *c, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v) {
    if (gpt_attends_from_starts(c)) return pdde_attention_docs(g, q, k, v, pdde_graph_find(g, "starts"));
    return (c->unfused_attention ? pdde_attention_unfused : pdde_attention)(g, q, k, v);
}

/* The inputs the ids x [rows, T] of `rows` windows give: starts [rows, T] each token's first key (where its document
 * starts: the last doc_token at or before it, else 0; in a window, at most window - 1 before it) and positions [rows, T]
 * each token's distance from its document's start */
static inline void gpt_starts_inputs(const gpt_config *c, const int32_t *x, size_t rows, int32_t *starts, int32_t *positions) {
    size_t T = (size_t)c->ctx, W = c->window > 0 ? (size_t)c->window : T;
    for (size_t r = 0; r < rows; r++)
        for (size_t t = 0, start = 0; t < T; t++) {
            if (c->doc_mask && x[r * T + t] == c->doc_token) start = t;
            starts[r * T + t] = (int32_t)(t - start >= W ? t - W + 1 : start), positions[r * T + t] = (int32_t)(t - start);
        }
}

/* GPT's attention sublayer of block l on a = ln1(x) [B, T, C], projected (proj): the fused qkv columns
 * are head-major, [H, 3, D]: q, k, v of head h are adjacent */
static inline pdde_tensor *gpt_attention_gpt(pdde_graph *g, const gpt_config *c, int l, pdde_tensor *a, float proj_std) {
    int64_t B = c->batch, T = c->ctx, C = c->width, H = c->heads, D = c->width / c->heads;
    char p[32];
    snprintf(p, sizeof p, "h%d.attn", l);
    pdde_tensor *qkv = gpt_linear(g, c, p, a, C, 3 * C, 0.02f), *part[3], *y;
    if (c->unfused_attention || c->separate_qkv) {
        pdde_split(g, pdde_reshape(g, qkv, 5, (int64_t[]){B, T, H, 3, D}), 3, 3, part);
        for (int i = 0; i < 3; i++)
            part[i] = pdde_permute(g, pdde_reshape(g, part[i], 4, (int64_t[]){B, T, H, D}), (int[]){0, 2, 1, 3});
        y = gpt_attend(g, c, part[0], part[1], part[2]); /* [B, H, T, D] */
        y = pdde_reshape(g, pdde_permute(g, y, (int[]){0, 2, 1, 3}), 3, (int64_t[]){B, T, C});
    } else { /* [B, T, C]: q, k, v read in place, no slices or permutes */
        y = gpt_attends_from_starts(c) ? pdde_attention_qkv_docs(g, qkv, (int)H, pdde_graph_find(g, "starts")) : pdde_attention_qkv(g, qkv, (int)H);
    }
    snprintf(p, sizeof p, "h%d.proj", l);
    return gpt_linear(g, c, p, y, C, C, proj_std);
}

/* RoPE of x [B, T, H, D] with model c's base (and LLaMA 3's scaling) */
static inline pdde_tensor *gpt_rope(pdde_graph *g, const gpt_config *c, pdde_tensor *x) {
    const float *s = c->rope_scaling;
    return s[0] > 0 ? pdde_rope_llama3(g, x, gpt_rope_base(c), s[0], s[1], s[2], s[3]) : pdde_rope(g, x, gpt_rope_base(c));
}

/* LLaMA's attention sublayer of block l on a = rmsnorm(x) [B, T, C]: grouped-query attention with RoPE
 * on q and k. The qkv columns are group-major, [Hkv, R + 2, D] (R = H / Hkv): a group's R query heads,
 * then its k, then its v, so a column split over kv groups (tensor parallelism) gives each rank whole
 * groups. Query head h = g R + r reads group g's k and v (Hugging Face's repeat_kv): k and v [B, T,
 * Hkv, 1, D] repeated R times on the group's dim by concat. */
static inline pdde_tensor *gpt_attention_llama(pdde_graph *g, const gpt_config *c, int l, pdde_tensor *a, float proj_std) {
    int64_t B = c->batch, T = c->ctx, C = c->width, H = c->heads, D = gpt_head_dim(c), Hkv = gpt_kv_heads(c), R = H / Hkv;
    char p[32], name[40];
    snprintf(p, sizeof p, "h%d.attn", l);
    int64_t QKV = (H + 2 * Hkv) * D;
    pdde_tensor *qkv = pdde_reshape(g, c->qkv_bias ? gpt_linear(g, c, p, a, C, QKV, 0.02f) : gpt_linear_nobias(g, c, p, a, C, QKV, 0.02f), 5,
                                    (int64_t[]){B, T, Hkv, R + 2, D});
    pdde_tensor *q = pdde_reshape(g, pdde_slice(g, qkv, 3, 0, R), 4, (int64_t[]){B, T, H, D});
    pdde_tensor *kv[2] = {pdde_slice(g, qkv, 3, R, 1), pdde_slice(g, qkv, 3, R + 1, 1)}; /* [B, T, Hkv, 1, D] */
    pdde_tensor *k = pdde_reshape(g, kv[0], 4, (int64_t[]){B, T, Hkv, D});
    if (c->qk_norm) { /* (Qwen3's: each head of q and k scaled to unit RMS, then RoPE) */
        snprintf(name, sizeof name, "%s.qn", p), q = gpt_norm(g, c, name, q, D);
        snprintf(name, sizeof name, "%s.kn", p), k = gpt_norm(g, c, name, k, D);
    }
    q = gpt_rope(g, c, q);
    kv[0] = pdde_reshape(g, gpt_rope(g, c, k), 5, (int64_t[]){B, T, Hkv, 1, D});
    for (int i = 0; i < 2; i++) {
        if (R > 1) {
            pdde_tensor *copies[64];
            for (int64_t r = 0; r < R; r++) copies[r] = kv[i];
            kv[i] = pdde_concat(g, (int)R, copies, 3); /* [B, T, Hkv, R, D] */
        }
        kv[i] = pdde_permute(g, pdde_reshape(g, kv[i], 4, (int64_t[]){B, T, H, D}), (int[]){0, 2, 1, 3});
    }
    q = pdde_permute(g, q, (int[]){0, 2, 1, 3});
    pdde_tensor *y = gpt_attend(g, c, q, kv[0], kv[1]); /* [B, H, T, D] */
    y = pdde_reshape(g, pdde_permute(g, y, (int[]){0, 2, 1, 3}), 3, (int64_t[]){B, T, H * D});
    snprintf(p, sizeof p, "h%d.proj", l);
    return gpt_linear_nobias(g, c, p, y, H * D, C, proj_std);
}

/* The dense feed-forward of block l on h = the second norm's output: GPT's fcproj(gelu(fc(h))), LLaMA's
 * SwiGLU fcproj(silu(fc(h)) * fc3(h)) */
static inline pdde_tensor *gpt_mlp(pdde_graph *g, const gpt_config *c, int l, pdde_tensor *h, float proj_std) {
    int64_t C = c->width, F = gpt_ffn(c);
    char p[32], p3[32];
    snprintf(p, sizeof p, "h%d.fc", l);
    if (c->arch == GPT_ARCH_LLAMA) {
        snprintf(p3, sizeof p3, "h%d.fc3", l);
        h = pdde_mul(g, pdde_silu(g, gpt_linear_nobias(g, c, p, h, C, F, 0.02f)), gpt_linear_nobias(g, c, p3, h, C, F, 0.02f));
        snprintf(p, sizeof p, "h%d.fcproj", l);
        return gpt_linear_nobias(g, c, p, h, F, C, proj_std);
    }
    h = c->unfused_gelu ? pdde_gelu(g, gpt_linear(g, c, p, h, C, F, 0.02f)) : gpt_linear_act(g, c, p, h, C, F, 0.02f, true);
    snprintf(p, sizeof p, "h%d.fcproj", l);
    return gpt_linear(g, c, p, h, F, C, proj_std);
}

/* Builds the forward graph and the loss; returns pdde_graph_status(g). Layers get layer ids 1..L (0 is
 * the embedding, L+1 the final norm and head), for placement per layer. */
static inline pdde_status gpt_build(pdde_graph *g, const gpt_config *c, gpt_model *m) {
    *m = (gpt_model){.cfg = *c};
    pdde_context *ctx = pdde_graph_context(g);
    if (c->heads < 1 || (c->head_dim <= 0 && c->width % c->heads) || c->head_dim < 0 || c->head_dim > 4096 || c->layers < 0)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: width %d must be a multiple of heads %d >= 1 unless a head dim (%d, 0 .. 4096) is "
                          "given (layers %d >= 0)", c->width, c->heads, c->head_dim, c->layers);
    bool llama = c->arch == GPT_ARCH_LLAMA;
    if (c->arch != GPT_ARCH_GPT && !llama) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: architecture %d is neither GPT nor LLaMA", (int)c->arch);
    if (!llama && (c->kv_heads || c->rope_base || c->rope_scaling[0] || c->qkv_bias || c->head_dim || c->qk_norm))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: kv heads %d, rope base %g, rope scaling, a qkv bias, a head dim %d and q/k norms are "
                          "LLaMA's (the GPT architecture has none; its linears have biases, its heads split the width)", c->kv_heads, c->rope_base,
                          c->head_dim);
    if (llama && (c->kv_heads < 0 || c->heads % gpt_kv_heads(c) || c->heads / gpt_kv_heads(c) > 64 || gpt_head_dim(c) % 2 ||
                  !(c->rope_base >= 0) || isinf(c->rope_base)))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: LLaMA needs kv heads %d dividing heads %d (at most 64 query heads a group), an even "
                          "head dim (%d, for RoPE) and a finite rope base (%g)", c->kv_heads, c->heads, gpt_head_dim(c), c->rope_base);
    if (c->lora_rank < 0 || c->lora_rank > 4096 || !(c->lora_alpha >= 0) || isinf(c->lora_alpha) || (c->lora_rank > 0 && c->moe_experts > 1))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: LoRA rank %d (0 .. 4096) and alpha %g (>= 0, finite), and no experts (%d) with it",
                          c->lora_rank, c->lora_alpha, c->moe_experts);
    if (!(c->norm_eps >= 0) || c->norm_eps > 1)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: norm epsilon %g: 0 (1e-5) or a number in (0, 1] expected", c->norm_eps);
    if (c->doc_mask && (c->doc_token < 0 || c->doc_token >= c->vocab))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: the documents' start token %d is no token of the vocabulary of %d", c->doc_token, c->vocab);
    if (c->window < 0) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: attention window %d: 0 (the whole context) or more expected", c->window);
    if (gpt_attends_from_starts(c) && c->unfused_attention)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: documents kept apart and attention windows take the fused attention, not the unfused one");
    int64_t B = c->batch, T = c->ctx, C = c->width, V = c->vocab;
    float proj_std = 0.02f / sqrtf(2.0f * (float)c->layers);
    int n_moe = 0;
    if (c->moe_experts > 1 && (gpt_moe_topk(c) > c->moe_experts || c->moe_capacity < 0 || c->moe_aux < 0))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "gpt: MoE top-%d of %d experts (k at most the experts), capacity factor %g and "
                          "balance weight %g (each >= 0)", gpt_moe_topk(c), c->moe_experts, c->moe_capacity, c->moe_aux);
    pdde_graph_set_layer(g, 0);
    m->ids = pdde_input(g, "ids", PDDE_I32, 2, (int64_t[]){B, T});
    m->targets = pdde_input(g, "targets", PDDE_I32, 1, (int64_t[]){B * T});
    if (gpt_attends_from_starts(c)) m->starts = pdde_input(g, "starts", PDDE_I32, 2, (int64_t[]){B, T});
    if (gpt_window(c)) pdde_attention_window(g, m->starts, gpt_window(c)); /* (the planner prices T x window pairs) */
    if (c->doc_mask && !llama) m->positions = pdde_input(g, "positions", PDDE_I32, 2, (int64_t[]){B, T});
    pdde_tensor *wte = gpt_weight(g, c, "wte", 2, (int64_t[]){V, C}, 0.02f);
    pdde_tensor *wpe = llama ? NULL : gpt_weight(g, c, "wpe", 2, (int64_t[]){T, C}, 0.02f);
    pdde_tensor *x = pdde_embedding(g, wte, m->ids);
    if (wpe) x = pdde_add(g, x, m->positions ? pdde_embedding(g, wpe, m->positions) : wpe); /* [B, T, C] + [T, C] (or [B, T, C]) */
    for (int l = 0; l < c->layers; l++) {
        char p[32];
        pdde_graph_set_layer(g, l + 1);
        snprintf(p, sizeof p, "h%d.ln1", l);
        pdde_tensor *a = gpt_norm(g, c, p, x, C);
        x = pdde_add(g, x, (llama ? gpt_attention_llama : gpt_attention_gpt)(g, c, l, a, proj_std));
        snprintf(p, sizeof p, "h%d.ln2", l);
        pdde_tensor *h = gpt_norm(g, c, p, x, C);
        if (gpt_block_is_moe(c, l)) {
            pdde_tensor *bal = NULL;
            x = pdde_add(g, x, gpt_moe_ffn(g, c, l, h, proj_std, &bal));
            m->moe_balance = m->moe_balance ? pdde_add(g, m->moe_balance, bal) : bal;
            n_moe++;
            continue;
        }
        x = pdde_add(g, x, gpt_mlp(g, c, l, h, proj_std));
    }
    pdde_graph_set_layer(g, c->layers + 1);
    x = gpt_norm(g, c, "lnf", x, C);
    pdde_tensor *head = c->untied_head ? gpt_weight(g, c, "head", 2, (int64_t[]){V, C}, 0.02f) : wte;
    m->logits = pdde_matmul(g, pdde_reshape(g, x, 2, (int64_t[]){B * T, C}), head, 0, 1);
    m->loss = pdde_cross_entropy(g, m->logits, m->targets);
    if (m->moe_balance) {
        m->moe_balance = pdde_scale(g, m->moe_balance, 1.0f / (float)n_moe);
        pdde_mark_output(m->moe_balance);
        if (c->moe_aux > 0) m->loss = pdde_add(g, m->loss, pdde_scale(g, m->moe_balance, c->moe_aux));
    }
    pdde_graph_set_layer(g, -1);
    return pdde_graph_status(g);
}

/* Megatron tensor parallelism of every block over mesh axis `axis` (call after gpt_build; combine
 * with pdde_strategy_data_parallel on another axis). Each sublayer is a column-parallel linear, local
 * work, then a row-parallel linear whose partial sum is reduced once, where the next layernorm needs
 * the whole residual:
 *   MLP:        fc column parallel (each rank its ffn/tp hidden units), gelu local, fcproj row parallel
 *               (LLaMA's SwiGLU: fc and fc3 column parallel, silu and the product local).
 *   attention:  head parallel. The fused qkv weight's columns are head-major, [H, 3, D], so its
 *               column split gives each rank q, k and v of its own H/tp heads: [B,T,3C] split on the
 *               last dim reshapes to [B,T,H,3,D] split on H (the split lands on the outermost factor),
 *               slicing the "3" dim and permuting to [B,H,T,D] keep H split, and the fused
 *               attention (or the scores, causal softmax and att @ v) is per head. The output
 *               [B,T,C] comes out split on C, which is what the row-parallel proj needs: no
 *               communication from ln1 to proj's partial sum. LLaMA's qkv columns are [Hkv, H/Hkv + 2, D]:
 *               the split lands on the kv groups, each rank whole groups (the axis must divide kv_heads:
 *               gpt_build_plan refuses other degrees), its q heads with their k and v.
 * Forward: one allreduce per sublayer (after proj, after fcproj). Backward: the input gradient of a
 * column-parallel linear sums over its split columns, so it is partial over the axis and reduced where
 * the layernorm's backward needs it. Biases of column layers are split with them; those of row
 * layers, and the layernorms, stay whole (added once).
 * The token embedding wte (tied: also the head) is vocab parallel when the vocab divides by the axis
 * size (pdde_strategy_vocab_parallel): each rank holds V/tp rows, the lookup is a partial sum reduced
 * at ln1 of block 0, the logits come out split on the vocab and the cross-entropy reduces row max and
 * sum over the axis instead of gathering [B*T, V] logits. Otherwise wte stays whole on every rank. An
 * untied head is split on the vocab the same way. */
static inline pdde_status gpt_shard_tensor_parallel(pdde_graph *g, const pdde_mesh *mesh, const char *axis) {
    char w[64], b[64];
    int ax = mesh ? pdde_mesh_axis(mesh, axis) : -1;
    for (int i = 0; i < 2; i++) { /* (an untied head: split like the embedding) */
        pdde_tensor *table = pdde_graph_find(g, i ? "head" : "wte");
        pdde_status st = table && ax >= 0 && table->shape[0] % mesh->shape[ax] == 0 ? pdde_strategy_vocab_parallel(g, table, mesh, axis) : PDDE_OK;
        if (st) return st;
    }
    for (int l = 0;; l++) {
        static const char *const names[5] = {"attn", "proj", "fc", "fc3", "fcproj"};
        static const pdde_tp_kind kinds[5] = {PDDE_TP_COLUMN, PDDE_TP_ROW, PDDE_TP_COLUMN, PDDE_TP_COLUMN, PDDE_TP_ROW};
        snprintf(w, sizeof w, "h%d.attn.w", l);
        if (!pdde_graph_find(g, w)) return l > 0 ? PDDE_OK : PDDE_ERR_NOT_FOUND;
        for (int i = 0; i < 5; i++) {
            snprintf(w, sizeof w, "h%d.%s.w", l, names[i]);
            snprintf(b, sizeof b, "h%d.%s.b", l, names[i]); /* (LLaMA's have none: NULL) */
            if (i >= 2 && !pdde_graph_find(g, w)) continue; /* GPT's MLP has no fc3; an MoE block: its experts instead (gpt_shard_experts) */
            pdde_status st = pdde_strategy_tensor_parallel_linear(g, pdde_graph_find(g, w), pdde_graph_find(g, b), mesh, axis, kinds[i]);
            /* LoRA's adapters split with their weight: a column layer's B by columns, a row layer's A by
             * rows (x A is then partial, as x W is, and summed with it) */
            snprintf(w, sizeof w, "h%d.%s.lora_%c", l, names[i], kinds[i] == PDDE_TP_COLUMN ? 'b' : 'a');
            if (!st && pdde_graph_find(g, w)) st = pdde_strategy_tensor_parallel_linear(g, pdde_graph_find(g, w), NULL, mesh, axis, kinds[i]);
            if (st) return st;
        }
    }
}

/* Expert parallelism: every MoE block's experts (w1, w2 [E, ...]) split over mesh axis `axis`, which
 * also splits the tokens (data parallel): completion exchanges the tokens' rows by all-to-all (the
 * model built with cfg.moe_ep). tp_axis (NULL: none): each expert's hidden units split over it too,
 * Megatron's pair inside an expert (w1 [E, C, F] by columns, w2 [E, F, C] by rows, its output
 * pending a sum over tp). */
static inline pdde_status gpt_shard_experts_tp(pdde_graph *g, const gpt_config *c, const pdde_mesh *mesh, const char *axis, const char *tp_axis) {
    int ax = pdde_mesh_axis(mesh, axis), tax = tp_axis ? pdde_mesh_axis(mesh, tp_axis) : -1;
    for (int l = 0; l < c->layers; l++) {
        for (int i = 1; i <= 2 && gpt_block_is_moe(c, l); i++) {
            char name[64];
            int dims[3] = {ax, i == 2 ? tax : -1, i == 1 ? tax : -1};
            snprintf(name, sizeof name, "h%d.moe.w%d", l, i);
            pdde_status st = pdde_shard(g, pdde_graph_find(g, name), mesh, dims);
            if (st) return st;
        }
    }
    return PDDE_OK;
}

static inline pdde_status gpt_shard_experts(pdde_graph *g, const gpt_config *c, const pdde_mesh *mesh, const char *axis) {
    return gpt_shard_experts_tp(g, c, mesh, axis, NULL);
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
    /* MoE expert parallelism inside data parallelism: with 1 < ep < dp (dividing it) the experts
     * split over groups of ep consecutive dp ranks (mesh [dp / ep "dp", ep "ep"(, tp "tp")],
     * pdde_strategy_data_parallel_groups), each group writing its own rows, each expert's hidden
     * units over tp (gpt_shard_experts_tp); else the model's moe_ep */
    int ep;
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
    if (p->ep > 1 && p->ep < p->dp && (p->ep != p->tp || p->ep_dp)) g.ep = p->ep; /* (ep = tp: the experts over tp, unless ep_dp) */
    return g;
}

/* 0 when plan p's place= range (place=B:A-Z) names layers of c's GPT (0 the embedding, 1..layers the
 * blocks, layers + 1 the head); else 1, saying so on stderr after `who` (a range past the model would
 * place nothing: pdde_plan_layer_on_device clamps it). */
static inline int gpt_plan_place_outside(const pdde_plan *p, const gpt_config *c, const char *who) {
    int n_layers = c->layers + 2;
    if (!p->place[0] || p->place_last <= 0 || (p->place_first >= 0 && p->place_last <= n_layers)) return 0;
    fprintf(stderr, "%s: place=%s:%d-%d is outside the model's layers 0-%d (0 the embedding, 1-%d the blocks, %d the head)\n", who,
            p->place, p->place_first, p->place_last - 1, n_layers - 1, c->layers, n_layers - 1);
    return 1;
}

/* Says on stderr, after `who`, why the cluster file at path gave no devices for the job (ctx's last
 * error), and how to measure this machine: into path where there is no file yet, else into another
 * file (path may be an operator's hand-written cluster, which -o would overwrite). */
static inline void gpt_say_cluster_unusable(pdde_context *ctx, const char *who, const char *path) {
    if (access(path, F_OK)) fprintf(stderr, "%s: %s (build/pdde-bench -o %s measures this machine)\n", who, pdde_last_error(ctx), path);
    else
        fprintf(stderr, "%s: %s (build/pdde-bench -o build/this-machine.json measures this machine; then --cluster "
                "build/this-machine.json)\n", who, pdde_last_error(ctx));
}

/* The data-parallel groups of plan p (dp / ep with ep groups, else 1). */
static inline int gpt_plan_groups(const gpt_plan *p) { return p->ep > 1 && p->ep < p->dp && p->dp % p->ep == 0 ? p->dp / p->ep : 1; }

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

/* Writes micro-batch i of model m from x (and y, may be NULL) [rows, ctx], the graph's rows: the ids, the targets and
 * the inputs the ids give (gpt_starts_inputs) */
static inline pdde_status gpt_write_micro(pdde_session *s, const gpt_model *m, int i, const int32_t *x, const int32_t *y, size_t rows) {
    size_t n = rows * (size_t)m->cfg.ctx;
    pdde_status st = pdde_session_write_micro(s, m->ids, i, x, n * sizeof *x);
    if (!st && y) st = pdde_session_write_micro(s, m->targets, i, y, n * sizeof *y);
    if (st || !m->starts) return st;
    int32_t *starts = (int32_t *)malloc(2 * n * sizeof *starts), *positions = starts ? starts + n : NULL;
    st = starts ? PDDE_OK : PDDE_ERR_OOM;
    if (!st) gpt_starts_inputs(&m->cfg, x, rows, starts, positions);
    if (!st) st = pdde_session_write_micro(s, m->starts, i, starts, n * sizeof *starts);
    if (!st && m->positions) st = pdde_session_write_micro(s, m->positions, i, positions, n * sizeof *positions);
    free(starts);
    return st;
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
        /* ep groups: the graph holds a group's rows; group j writes block i x groups + j */
        size_t block = graph_rows * T, groups = gpt_plan_groups(p), first = groups > 1 ? (size_t)dp_index / (size_t)p->ep : 0;
        for (int i = 0; i < pdde_session_micro_batches(s) && st == PDDE_OK; i++) {
            size_t at = ((size_t)i * groups + first) * block;
            st = gpt_write_micro(s, m, i, x + at, y ? y + at : NULL, graph_rows);
        }
        return st;
    }
    size_t block = graph_rows / (size_t)p->dp * T, first = 0;
    for (int d = 0; d < dp_index; d++) first += (size_t)p->shares[d] * (size_t)(p->micro > 1 ? p->micro : 1);
    int32_t *scratch = (int32_t *)calloc(2 * graph_rows * T, sizeof *scratch), *scratch_y = scratch + graph_rows * T;
    if (!scratch) return PDDE_ERR_OOM;
    for (int i = 0; i < pdde_session_micro_batches(s) && st == PDDE_OK; i++) {
        memcpy(scratch + (size_t)dp_index * block, x + (first + i) * block, block * sizeof *x);
        if (y) memcpy(scratch_y + (size_t)dp_index * block, y + (first + i) * block, block * sizeof *y);
        st = gpt_write_micro(s, m, i, scratch, y ? scratch_y : NULL, graph_rows);
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
    int groups = gpt_plan_groups(p);
    if (p->ep > 1 && p->ep < p->dp && (groups == 1 || p->shares || c->moe_experts % p->ep))
        return pdde_error(pdde_graph_context(g), PDDE_ERR_INVALID_ARG, "gpt: experts over groups of ep %d of the dp %d ranks: ep must divide dp and "
                          "the %d experts, with equal shares", p->ep, p->dp, c->moe_experts);
    if (c->arch == GPT_ARCH_LLAMA && p->tp > 1 && gpt_kv_heads(c) % p->tp)
        return pdde_error(pdde_graph_context(g), PDDE_ERR_INVALID_ARG, "gpt: tp %d must divide the %d kv heads (each rank holds whole kv groups: "
                          "their query heads, k and v)", p->tp, gpt_kv_heads(c));
    local.batch = c->batch / (micro * units) * p->dp / groups; /* one micro-batch of every dp index (of a group) */
    if (groups > 1) local.moe_ep = 1;
    pdde_status st = gpt_build(g, &local, m);
    const pdde_mesh *mesh = NULL;
    if (!st && parallel) {
        int shape[4], n = 0;
        const char *names[4];
        if (groups > 1) shape[n] = groups, names[n++] = "dp", shape[n] = p->ep, names[n++] = "ep";
        else if (p->dp > 1) shape[n] = p->dp, names[n++] = "dp";
        if (p->tp > 1) shape[n] = p->tp, names[n++] = "tp";
        if (p->pp > 1) shape[n] = p->pp, names[n++] = "pp";
        int *proc = (int *)malloc((size_t)p->dp * p->tp * p->pp * sizeof *proc); /* mesh rank -> process */
        if (!proc) return pdde_error(pdde_graph_context(g), PDDE_ERR_OOM, "gpt: out of memory");
        for (int r = 0; r < p->dp * p->tp * p->pp; r++) proc[r] = p->plan ? pdde_plan_process_of_rank(p->plan, r) : r;
        mesh = pdde_mesh_create(g, n, shape, names, proc);
        free(proc);
        if (!mesh) return pdde_graph_status(g);
        if (groups > 1) st = pdde_strategy_data_parallel_groups(g, mesh, "dp", "ep");
        else if (p->dp > 1) st = pdde_strategy_data_parallel(g, mesh, "dp");
        if (!st && groups > 1) st = gpt_shard_experts_tp(g, c, mesh, "ep", p->tp > 1 ? "tp" : NULL);
        else if (!st && p->dp > 1 && p->shares) st = pdde_strategy_data_parallel_shares(g, mesh, "dp", p->shares);
        /* expert parallelism over the tensor-parallel axis when there is one (the tokens are whole
         * there: each rank takes its experts' rows, gathered back), else over dp */
        if (!st && groups == 1 && c->moe_ep && c->moe_experts > 1 && (p->tp > 1 || p->dp > 1)) st = gpt_shard_experts(g, c, mesh, p->tp > 1 ? "tp" : "dp");
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
    /* ep groups: what every rank holds (not the experts, split over ep) also on another dim over ep */
    if (!st && parallel && p->zero && groups > 1) st = pdde_strategy_zero(g, mesh, "ep", p->zero);
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
    gpt_config cfg = b->cfg;
    if (p->ep > 1) cfg.moe_ep = 1; /* (the experts over tp, else dp: gpt_build_plan) */
    return gpt_build_plan(g, &cfg, &gp, &b->opt, &m);
}

/* The planner's devices for training the GPT of c: the devices of a cluster file (pdde-bench writes
 * one), timed on the nodes of the model's training step as one of the ranks runs them
 * (pdde_plan_devices_init_graph). With ranks > 0 the
 * job has that many ranks: a one-machine cluster (this machine, as pdde-bench measured it with the
 * threads a rank gets, PDDE_NUM_THREADS) gives each rank its own accelerator where the cost model
 * predicts them faster than the CPU, else every rank the CPU and a share of its memory
 * (pdde_plan_devices_init_machine); a cluster of several machines must list one device per rank. */
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
    /* one machine: each rank its own accelerator where they are faster, the CPU beside them */
    bool one = !st && ranks > 0 && cl->n_machines == 1;
    if (!st) st = one ? pdde_plan_devices_init_machine(ctx, cl, g, ranks, d) : pdde_plan_devices_init_graph(ctx, cl, g, ranks, d);
    pdde_graph_free(g);
    if (!st && !one && ranks > 0 && d->n_devices != ranks) {
        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s lists %d devices on %d machines, the job has %d ranks", cluster_path, d->n_devices, cl->n_machines, ranks);
        pdde_plan_devices_free(d);
    }
    pdde_cluster_free(cl);
    return st;
}

/* The planner's plans for training the GPT of c on d (fastest first, then rejected ones with why):
 * pdde_plan_search over the model's training graph at its global batch, tensor parallelism by heads;
 * with a cluster (d's devices), MoE models' ep tried by its cost model and, with simulate, the best
 * ones ranked by simulating their real programs on it. */
static inline pdde_status gpt_plan_search_cluster(pdde_context *ctx, const gpt_config *c, const pdde_plan_devices *d, int use_all_devices,
                                                  const pdde_cluster *cluster, int simulate, pdde_plan *plans, int max_plans, int *n_fit,
                                                  int *n_rejected) {
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
    pp.batch = c->batch, pp.tp_divisor = gpt_tp_divisor(c), pp.use_all_devices = use_all_devices;
    if (c->moe_experts > 1) pp.no_tp = pp.no_pp = 1; /* (MoE blocks run data and expert parallel) */
    if (cluster) pp.cluster = cluster;
    if (cluster && simulate) pp.build = gpt_plan_build, pp.build_user = &b;
    if (!st) st = pdde_plan_search(g, d, &pp, plans, max_plans, n_fit, n_rejected);
    pdde_graph_free(g);
    return st;
}

/* The same, the best ones simulated on the cluster. */
static inline pdde_status gpt_plan_search_simulated(pdde_context *ctx, const gpt_config *c, const pdde_plan_devices *d, int use_all_devices,
                                                    const pdde_cluster *cluster, pdde_plan *plans, int max_plans, int *n_fit, int *n_rejected) {
    return gpt_plan_search_cluster(ctx, c, d, use_all_devices, cluster, 1, plans, max_plans, n_fit, n_rejected);
}

/* The expert-parallel degree for the MoE GPT of c on `ranks` data-parallel ranks (ZeRO stage zero):
 * pdde_moe_choose_ep over every ep dividing the ranks and the experts (1: experts on every rank;
 * ranks: the layout by expert over dp; between: groups of ep consecutive ranks) on the devices of the cluster file in order (one machine:
 * copies of its first device, as gpt_plan_devices); *ep the fastest of those whose experts'
 * parameters and AdamW state fit a device's memory (none fits: the smallest), pred[0] ep 1's MoE
 * part and pred[1] *ep's, in s a step. */
static inline pdde_status gpt_moe_choose_ep(pdde_context *ctx, const char *cluster_path, const gpt_config *c, int ranks, int zero, int *ep,
                                            double pred[2]) {
    pdde_cluster *cl = NULL;
    *ep = 1, pred[0] = pred[1] = 0;
    pdde_status st = pdde_cluster_load(ctx, cluster_path, &cl);
    int *dev = (int *)calloc((size_t)(ranks > 0 ? ranks : 1), sizeof *dev), n = 0, blocks = 0, n_all = 0;
    pdde_moe_cost *all = (pdde_moe_cost *)calloc(256, sizeof *all), best;
    if (!st && (!dev || !all)) st = PDDE_ERR_OOM;
    for (int mi = 0; !st && cl->n_machines > 1 && mi < cl->n_machines; mi++) /* (one machine: its first device a rank, as gpt_plan_devices) */
        for (int d = 0; d < cl->machines[mi].n_devices && n < ranks; d++) dev[n++] = cl->machines[mi].devices[d].id;
    if (!st && n == 0 && cl->n_machines > 0 && cl->machines[0].n_devices > 0) dev[n++] = cl->machines[0].devices[0].id;
    for (int k = 1; !st && n < ranks && cl->n_machines > 0 && cl->machines[0].n_devices > 0; k++) { /* copies of the first */
        pdde_cluster_device copy = cl->machines[0].devices[0];
        copy.id = dev[0] + 100000 * k;
        if (pdde_cluster_add_device(cl, 0, &copy) < 0) st = PDDE_ERR_OOM;
        else dev[n++] = copy.id;
    }
    for (int l = 0; l < c->layers; l++) blocks += gpt_block_is_moe(c, l);
    if (!st && n == ranks && blocks) {
        pdde_moe_cost_params p = PDDE_MOE_COST_PARAMS_INIT;
        p.tokens = (int64_t)c->batch * c->ctx, p.width = c->width, p.ffn = (int)gpt_ffn(c), p.experts = c->moe_experts;
        p.topk = gpt_moe_topk(c), p.layers = blocks, p.zero = zero, p.grads_over_ep = 1;
        p.capacity_factor = c->moe_capacity; /* (the exchange sends the routed rows only) */
        st = pdde_moe_choose_ep(ctx, cl, dev, ranks, &p, &best, all, 256, &n_all);
        if (st == PDDE_ERR_NO_PLAN) st = PDDE_OK; /* (nothing fits: the smallest; the plan's memory check says more) */
        if (!st && n_all > 0) *ep = best.ep, pred[0] = all[0].step_s, pred[1] = best.step_s;
    }
    free(dev), free(all);
    pdde_cluster_free(cl);
    return st;
}

/* The same by the estimate alone. */
static inline pdde_status gpt_plan_search(pdde_context *ctx, const gpt_config *c, const pdde_plan_devices *d, int use_all_devices,
                                          pdde_plan *plans, int max_plans, int *n_fit, int *n_rejected) {
    return gpt_plan_search_simulated(ctx, c, d, use_all_devices, NULL, plans, max_plans, n_fit, n_rejected);
}

/* The parameters LoRA trains (its adapters), 0 without it */
static inline int64_t gpt_n_lora_params(const gpt_config *c) {
    if (c->lora_rank <= 0) return 0;
    int64_t C = c->width, F = gpt_ffn(c), r = c->lora_rank, D = gpt_head_dim(c), HD = c->heads * D;
    int64_t qkv = c->arch == GPT_ARCH_LLAMA ? (c->heads + 2 * (int64_t)gpt_kv_heads(c)) * D : 3 * C;
    int64_t per = r * (C + qkv) + r * (HD + C) + r * (C + F) * (c->arch == GPT_ARCH_LLAMA ? 2 : 1) + r * (F + C);
    return c->layers * per;
}

/* Every weight of model c: its parameters, and under LoRA the frozen pretrained ones and the adapters */
static inline int64_t gpt_n_params(const gpt_config *c) {
    int64_t C = c->width, F = gpt_ffn(c), E = c->moe_experts, VC = (int64_t)c->vocab * C * (c->untied_head ? 2 : 1), n = VC + 2 * C;
    if (c->arch == GPT_ARCH_LLAMA) { /* no position embedding, no biases, norms with gains only */
        int64_t D = gpt_head_dim(c), qkv = (c->heads + 2 * (int64_t)gpt_kv_heads(c)) * D;
        n = VC + C;
        for (int l = 0; l < c->layers; l++)
            n += 2 * C + (c->qk_norm ? 2 * D : 0) + (C + (c->qkv_bias ? 1 : 0)) * qkv + c->heads * D * C +
                 (gpt_block_is_moe(c, l) ? C * E + 2 * E * C * F : 3 * C * F);
        return n + gpt_n_lora_params(c);
    }
    n += (int64_t)c->ctx * C;
    for (int l = 0; l < c->layers; l++)
        n += 4 * C + 3 * C * C + 3 * C + C * C + C + (gpt_block_is_moe(c, l) ? C * E + 2 * E * C * F : C * F + F + F * C + C);
    return n + gpt_n_lora_params(c);
}

/* DeepSeek-V3's balance without a loss: after a step, each MoE block's bias (an input, cfg.moe_bias)
 * moves by rate towards the experts that got fewer tokens than the mean: b_e += rate * sign(mean -
 * count_e). bias: [blocks][E] the caller's values, written to the session; under pipeline stages each
 * rank moves its own stage's blocks (the others' stay as they are). */
/* The MoE blocks' biases (the input "h<l>.moe.bias" [E] of each, into bias [MoE blocks][E]) as a resumed
 * session holds them (pdde_mark_state: checkpoints and snapshots keep them); another pipeline stage's
 * blocks are left as they are. */
static inline pdde_status gpt_moe_read_bias(pdde_session *s, pdde_graph *g, const gpt_config *c, float *bias) {
    pdde_status st = PDDE_OK;
    for (int l = 0, b = 0; l < c->layers && !st; l++) {
        if (!gpt_block_is_moe(c, l)) continue;
        char name[64];
        snprintf(name, sizeof name, "h%d.moe.bias", l);
        pdde_tensor *t = pdde_graph_find(g, name);
        if (pdde_session_tensor(s, t)) st = pdde_session_read(s, t, bias + (size_t)b * c->moe_experts, (size_t)c->moe_experts * sizeof *bias);
        b++;
    }
    return st;
}

static inline pdde_status gpt_moe_update_bias(pdde_session *s, pdde_graph *g, const gpt_config *c, float rate, float *bias) {
    int E = c->moe_experts, b = 0;
    int32_t *counts = (int32_t *)malloc((size_t)E * sizeof *counts);
    pdde_status st = counts ? PDDE_OK : PDDE_ERR_OOM;
    for (int l = 0; l < c->layers && !st; l++) {
        if (!gpt_block_is_moe(c, l)) continue;
        char name[64];
        snprintf(name, sizeof name, "h%d.moe.counts", l);
        float *bl = bias + (size_t)b++ * E;
        if (!pdde_session_tensor(s, pdde_graph_find(g, name))) continue; /* (another pipeline stage's block) */
        st = pdde_session_read(s, pdde_graph_find(g, name), counts, (size_t)E * sizeof *counts);
        double mean = 0;
        for (int e = 0; e < E; e++) mean += counts[e] / (double)E;
        for (int e = 0; e < E && !st; e++) bl[e] += counts[e] < mean ? rate : counts[e] > mean ? -rate : 0.0f;
        snprintf(name, sizeof name, "h%d.moe.bias", l);
        if (!st) st = pdde_session_write_global(s, pdde_graph_find(g, name), bl, (size_t)E * sizeof *bl);
    }
    free(counts);
    return st;
}
#endif
