/* backends/op_params.h — the named op parameters: each slot of an op's iparams/fparams has one
 * meaning, named here, and is read and written through pdde_op_i32/pdde_op_f32 (ggml's op params),
 * never by position. pdde.h's op list says which names each op has; names of different ops may share
 * a slot. This is what a backend (also one built out of tree) needs beyond pdde.h to read a node.
 * What the executor alone needs of a node (its collective's mesh axis, a peer, an early start) is not
 * an op parameter: it lives in the local program (planner/planner_impl.h). */
#ifndef PDDE_OP_PARAMS_H
#define PDDE_OP_PARAMS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../pdde.h"

typedef enum {
    PDDE_P_MATMUL_TRANS_A = 0, PDDE_P_MATMUL_TRANS_B = 1,
    PDDE_P_MATMUL_RESIDUAL = 2,         /* matmul: 1: its last src, of its shape, is added to the result (lowering's fusion) */
    PDDE_P_GRAD_ACCUM_OVERWRITE = 5,    /* grad_accum of a matmul (lowering's PDDE_FUSE_GRAD, with the transposes above): 1: acc =
                                           op(A) op(B), not +=: a step's first gradient (lower_direct_grads; set by the executor;
                                           past the matmul's own parameters, which a backend's matmul of its sources reads) */
    PDDE_P_MATMUL_ACT = 3,              /* matmul (lowering's PDDE_FUSE_GELU): 0; PDDE_MATMUL_GELU: src 2 a bias [N], it writes
                                           X = A B + bias (its own values, its dtype) and gelu(X) beside them (at
                                           pdde_lowp_copy_offset, its dtype); PDDE_MATMUL_DGELU: src 2 X (of its
                                           shape), it writes (A B) * gelu'(X) */
    PDDE_P_MATMUL_BGRAD = 4,            /* matmul (lowering's PDDE_FUSE_BGRAD): 1: 2-D, B not transposed, f32 out; it also writes
                                           the column sums of B (sum over K of B [K, N]: a bias gradient, f32 [N]) beside
                                           its values (at pdde_lowp_copy_offset) */
    PDDE_P_SOFTMAX_CAUSAL = 0,
    PDDE_P_ROPE_INVERSE = 0,            /* rope: 1 rotates by minus the angle (its backward) */
    PDDE_P_PERMUTE_DIM0 = 0,            /* output dim i takes input dim [PDDE_P_PERMUTE_DIM0 + i] */
    PDDE_P_CONCAT_AXIS = 0,
    PDDE_P_SLICE_AXIS = 0, PDDE_P_SLICE_START = 1,
    PDDE_P_REDUCE_AXIS = 0, PDDE_P_REDUCE_KEEPDIM = 1,          /* sum, mean */
    PDDE_P_EXPAND_MEAN_OF = 0,          /* expand: a mean's gradient, of graph node id - 1 (0: none; lowering's) */
    PDDE_P_DROPOUT_SEED_LO = 0, PDDE_P_DROPOUT_SEED_HI = 1, PDDE_P_DROPOUT_COUNTER = 2,
    /* embedding, its backward, cross-entropy, its backward: the vocab rows/columns this rank holds
     * (0, 0 = all of it) */
    PDDE_P_VOCAB_FIRST = 0, PDDE_P_VOCAB_SIZE = 1,
    PDDE_P_CE_DLOGITS = 2,              /* lowering's PDDE_FUSE_CE: cross_entropy: 0, or 1 + the dtype (f32, bf16, f16) of its src 3,
                                           into which it also writes dlogits = (softmax - onehot) * dloss / count (src 2 dloss,
                                           as the backward's); cross_entropy_back: 1: that src 3, whose values its forward
                                           writes (it computes nothing; computing them anyway gives the same values) */
    PDDE_P_UPDATE_STEP = 0,             /* sgd/adamw: step t, 1-based (set by the executor) */
    PDDE_P_ATTENTION_QKV_D = 0,         /* attention, attention_back: 0, or the head dim D of the packed
                                           layout (pdde_attention_qkv) */
    PDDE_P_UPDATE_SHADOW = 1,           /* sgd/adamw: 1: the last src is the parameter's bf16/f16 copy
                                           (PDDE_TENSOR_SHADOW), which the update rewrites from the new values */
    PDDE_P_NORM_LOWP_COPY = 0,          /* layernorm_back: 0, or the dtype (bf16/f16) of a rounded copy of dx that
                                           it also writes, at pdde_lowp_copy_offset of its memory (lowering's
                                           PDDE_BF16_GRADS) */
    PDDE_P_NORM_ADD_IN = 0,             /* layernorm: 1: its input is src 0 + src 3 (f32, of its shape), the sum
                                           also written (f32) at pdde_lowp_copy_offset of its memory (lowering's
                                           PDDE_FUSE_ADD_LN) */
    PDDE_P_VIEW_BESIDE = 0,             /* reshape (a view): 1: of what its source writes at pdde_lowp_copy_offset
                                           (the two above, and the next), not of its values */
    PDDE_P_ATTENTION_LOWP_COPY = 1,     /* attention, attention_back of the packed layout: 0, or the dtype (bf16/f16)
                                           of a rounded copy of the output (y; dqkv) that it also writes, at
                                           pdde_lowp_copy_offset of its memory (lowering's PDDE_ATT_LOWP) */
    PDDE_P_STARTS_WINDOW = 0,           /* an attention's starts (an i32 leaf): 0, or the most keys they let a query see
                                           (pdde_attention_window: the cost model prices those pairs) */
    /* the Mixture-of-Experts ops */
    PDDE_P_MOE_EXPERTS = 0, PDDE_P_MOE_CAPACITY = 1, PDDE_P_MOE_FLAGS = 2, PDDE_P_MOE_TRANS_B = 3,
} pdde_iparam;

typedef enum {
    PDDE_P_PARAM_INIT_STD = 0,          /* parameter leaf: normal std (0: zeros; < 0: ones) */
    PDDE_P_CONST_VALUE = 0,             /* constant leaf: its fill value */
    PDDE_P_SCALE = 0,                   /* scale, expand */
    PDDE_P_NORM_EPS = 0,                /* layernorm, rmsnorm and their backward ops */
    PDDE_P_ROPE_BASE = 0,               /* rope: the angle of pair i at position t is t * inv_i, inv_i = base^(-2i/D) */
    PDDE_P_ROPE_FACTOR = 1,             /* rope: > 0: LLaMA 3's long-context frequencies (pdde_rope_inv_freq) */
    PDDE_P_ROPE_LOW = 2, PDDE_P_ROPE_HIGH = 3, PDDE_P_ROPE_ORIGINAL = 4,
    PDDE_P_DROPOUT_P = 0,
    PDDE_P_ATTENTION_SCALE = 0,         /* attention, attention_back: the factor of q k^T */
    PDDE_P_UPDATE_LR = 0, PDDE_P_UPDATE_BETA1 = 1, PDDE_P_UPDATE_BETA2 = 2, PDDE_P_UPDATE_EPS = 3,
    PDDE_P_UPDATE_WEIGHT_DECAY = 4, PDDE_P_UPDATE_CLIP = 5, PDDE_P_UPDATE_GRAD_SCALE = 6,
    PDDE_P_SGD_MOMENTUM = 1,            /* sgd (beta1, beta2 and eps are adamw's) */
    PDDE_P_CE_DIVISOR = 0,              /* cross_entropy, its backward: 0: the mean over the node's valid targets; > 0: the sum over
                                           them divided by this (the step's targets over its parts, pdde_session_set_loss_tokens;
                                           set by the executor) */
} pdde_fparam;

static inline int32_t pdde_op_i32(const pdde_tensor *t, pdde_iparam p) { return t->iparams[p]; }
static inline void pdde_op_set_i32(pdde_tensor *t, pdde_iparam p, int32_t v) { t->iparams[p] = v; }
static inline float pdde_op_f32(const pdde_tensor *t, pdde_fparam p) { return t->fparams[p]; }
static inline void pdde_op_set_f32(pdde_tensor *t, pdde_fparam p, float v) { t->fparams[p] = v; }
enum { PDDE_MATMUL_GELU = 1, PDDE_MATMUL_DGELU = 2 }; /* PDDE_P_MATMUL_ACT */

/* rope: the angle per position of pair i of D (every backend's; in f32 as Hugging Face computes it).
 * With PDDE_P_ROPE_FACTOR > 0 (pdde_rope_llama3), a wavelength 2 pi / inv_i past ORIGINAL / LOW is
 * slowed by FACTOR, one below ORIGINAL / HIGH kept, those between blended. */
static inline float pdde_rope_inv_freq(const pdde_tensor *t, int64_t i, int64_t D) {
    float inv = 1.0f / powf(pdde_op_f32(t, PDDE_P_ROPE_BASE), (float)(2 * i) / (float)D), factor = pdde_op_f32(t, PDDE_P_ROPE_FACTOR);
    if (!(factor > 0)) return inv;
    float low = pdde_op_f32(t, PDDE_P_ROPE_LOW), high = pdde_op_f32(t, PDDE_P_ROPE_HIGH), original = pdde_op_f32(t, PDDE_P_ROPE_ORIGINAL);
    float wavelen = 2.0f * 3.14159265358979f / inv;
    if (wavelen < original / high) return inv;
    if (wavelen > original / low) return inv / factor;
    float smooth = (original / wavelen - low) / (high - low);
    return (1.0f - smooth) * inv / factor + smooth * inv;
}
/* The geometry of an attention node (forward or backward) in either layout: q, k, v [B,H,T,D] apart,
 * or packed in one [B,T,H*3*D] tensor, head-major (PDDE_P_ATTENTION_QKV_D = D). *packed: which. */
static inline void pdde_attention_dims(const pdde_tensor *t, int64_t *B, int64_t *H, int64_t *T, int64_t *D, int *packed) {
    const pdde_tensor *q = t->src[0];
    int64_t d = pdde_op_i32(t, PDDE_P_ATTENTION_QKV_D);
    *packed = d > 0;
    if (d > 0) *B = q->shape[0], *T = q->shape[1], *D = d, *H = q->shape[2] / (3 * d);
    else *B = q->shape[0], *H = q->shape[1], *T = q->shape[2], *D = q->shape[3];
}

/* What cross-entropy t divides its summed loss by: count (its valid targets), or the step's divisor
 * (PDDE_P_CE_DIVISOR, pdde_session_set_loss_tokens) */
static inline double pdde_ce_divisor(const pdde_tensor *t, int64_t count) {
    float d = pdde_op_f32(t, PDDE_P_CE_DIVISOR);
    return d > 0 ? (double)d : (double)count;
}

/* A document-masked attention node's starts (pdde_attention_docs; forward or backward): its last source, i32 [B, T];
 * NULL for plain causal attention */
static inline const pdde_tensor *pdde_attention_starts(const pdde_tensor *t) {
    const pdde_tensor *s = t->nsrc > 1 ? t->src[t->nsrc - 1] : NULL;
    return s && s->dtype == PDDE_I32 ? s : NULL;
}

/* Where a node's second result (a layernorm backward's PDDE_P_NORM_LOWP_COPY, a layernorm's
 * PDDE_P_NORM_ADD_IN sum, an attention's PDDE_P_ATTENTION_LOWP_COPY, a PDDE_MATMUL_GELU's activation) starts: bytes past the node's own values, rounded up to 256 (its view, memory
 * planning and the kernels agree) */
size_t pdde_lowp_copy_offset(const pdde_tensor *t);
/* Whether a node writes such a second result, and its dtype */
static inline int pdde_has_beside(const pdde_tensor *t) {
    return (t->op == PDDE_OP_LAYERNORM_BACK && pdde_op_i32(t, PDDE_P_NORM_LOWP_COPY) != 0) ||
           (t->op == PDDE_OP_LAYERNORM && pdde_op_i32(t, PDDE_P_NORM_ADD_IN) != 0) ||
           ((t->op == PDDE_OP_ATTENTION || t->op == PDDE_OP_ATTENTION_BACK) && pdde_op_i32(t, PDDE_P_ATTENTION_LOWP_COPY) != 0) ||
           (t->op == PDDE_OP_MATMUL && (pdde_op_i32(t, PDDE_P_MATMUL_ACT) == PDDE_MATMUL_GELU || pdde_op_i32(t, PDDE_P_MATMUL_BGRAD)));
}
static inline pdde_dtype pdde_beside_dtype(const pdde_tensor *t) {
    return t->op == PDDE_OP_LAYERNORM_BACK                                   ? (pdde_dtype)pdde_op_i32(t, PDDE_P_NORM_LOWP_COPY)
           : t->op == PDDE_OP_ATTENTION || t->op == PDDE_OP_ATTENTION_BACK ? (pdde_dtype)pdde_op_i32(t, PDDE_P_ATTENTION_LOWP_COPY)
           : t->op == PDDE_OP_MATMUL && !pdde_op_i32(t, PDDE_P_MATMUL_BGRAD) ? t->dtype /* (PDDE_MATMUL_GELU's gelu(X)) */
                                                                               : PDDE_F32;
}
/* Its element count (PDDE_P_MATMUL_BGRAD's column sums: N; the others: the node's own) */
static inline int64_t pdde_beside_numel(const pdde_tensor *t) {
    if (t->op == PDDE_OP_MATMUL && pdde_op_i32(t, PDDE_P_MATMUL_BGRAD)) return t->shape[t->ndim - 1];
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
/* Whether t is the view of such a result */
static inline int pdde_is_lowp_copy_view(const pdde_tensor *t) {
    return (t->flags & PDDE_TENSOR_VIEW) && t->op == PDDE_OP_RESHAPE && t->nsrc == 1 && pdde_op_i32(t, PDDE_P_VIEW_BESIDE) &&
           pdde_has_beside(t->src[0]) && t->dtype == pdde_beside_dtype(t->src[0]);
}

/* dst takes all of src's op parameters (a clone, or a backward op that shares its forward's). */
static inline void pdde_op_params_copy(pdde_tensor *dst, const pdde_tensor *src) {
    memcpy(dst->iparams, src->iparams, sizeof dst->iparams), memcpy(dst->fparams, src->fparams, sizeof dst->fparams);
}

#endif
