/* test_backend_ops.c — the backend conformance suite (ggml's test-backend-ops is the model).
 *
 * Every op, forward, and its backward ops (through pdde_backward: the gradient of every parameter),
 * runs on every available device and is compared with the CPU backend (device 0) under a per-op
 * bound on the normalised mean squared error, over awkward shapes (1, primes, non-multiples of
 * 16/32, empty where legal). Everything goes through the public API: a tiny graph per case, one
 * session on the CPU and one on the device under test, the same inputs written to both.
 *
 *   test_backend_ops [--backend NAME | --plugin /path/lib.so] [--op NAME] [--perf] [-v]
 *
 * --op selects the cases of that op, or for an op no case is of (e.g. softmax_back) the cases whose graph
 * runs it. The gradient checks' loss, sum(y * weights), runs on the CPU: the device under test runs
 * only the case's own ops, and a wrong op fails its own cases, not the others' backward. --perf prints
 * GFLOP/s (matmul) or GB/s per op and shape on each device instead of checking. The last line is
 * "N passed, N failed". A case's inputs are seeded by its op and parameters; PDDE_TEST_SEED=N (default 0)
 * salts every seed, to check that a bound holds for the op and not for one draw. Also checked: an
 * unsupported op fails session init with PDDE_ERR_UNSUPPORTED, a kernel that does not build gives
 * PDDE_ERR_BUILD with the log, a huge buffer PDDE_ERR_DEVICE_OOM. */
#define _GNU_SOURCE
#include "pdde.h"
#include "backends/op_params.h" /* the named op parameters the test sets */
#include "tests/test_util.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* LeakSanitizer (make test-asan): PoCL's kernel compiler leaks a few KB per program it compiles on a
 * cold cache (inside libpocl/LLVM, nothing pdde allocates); this hook is read by LSan only. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) { return "leak:libpocl\nleak:libLLVM\nleak:libclang\n"; }

/* ------------------------------------------------------------------------------------------------
 * Cases */

typedef struct op_case op_case;
typedef pdde_tensor *(*build_fn)(pdde_graph *g, const op_case *c);

struct op_case {
    const char *op;    /* the op under test (its pdde_op_name) */
    build_fn build;
    int64_t p[8];      /* shape parameters, meaning per builder */
    int grad;          /* also compare the gradients of every parameter */
    double tol;        /* bound on the NMSE of the forward output; the gradients get 10x (at least 1e-9) */
};

static int64_t g_vocab; /* range of the "ids" / "tgt" leaves of the case being built */
/* The document-masked attention case being run (pdde_attention_docs): its starts [B, T], the "att_starts" leaf, and
 * the f32 mask [B, 1, T, T] of its reference ("att_mask": 0 where query t sees key j, -1e9 before its first key) */
static const int32_t *g_att_starts;
static int64_t g_att_T;
static int64_t g_loss_tokens; /* the case's pdde_session_set_loss_tokens (0: none) */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* f32 leaves are parameters, so that the backward pass reaches them */
static pdde_tensor *P(pdde_graph *g, const char *name, int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
    int64_t s[4] = {d0, d1, d2, d3};
    return pdde_param(g, name, nd, s, 0.0f);
}
static pdde_tensor *I(pdde_graph *g, const char *name, pdde_dtype t, int nd, int64_t d0, int64_t d1) {
    int64_t s[2] = {d0, d1};
    return pdde_input(g, name, t, nd, s);
}

/* shapes: p[0] = ndim, p[1..] = dims */
#define SHAPE_ARGS(c) (int)(c)->p[0], (c)->p[1], (c)->p[2], (c)->p[3], (c)->p[4]

/* matmul: p = {M, N, K, ta, tb, batch (0 = 2-D), shared (0 both batched, 1 b 2-D, 2 a 2-D), compute
 * dtype (0 = f32; bf16/f16: mixed precision, the operands converted and the gradient GEMMs too)} */
static pdde_tensor *b_matmul(pdde_graph *g, const op_case *c) {
    int64_t M = c->p[0], N = c->p[1], K = c->p[2], ta = c->p[3], tb = c->p[4], B = c->p[5], sh = c->p[6];
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    pdde_graph_set_compute_dtype(g, (pdde_dtype)c->p[7]);
    pdde_tensor *a = (B && sh != 2) ? P(g, "a", 3, B, ar, ac, 0) : P(g, "a", 2, ar, ac, 0, 0);
    pdde_tensor *b = (B && sh != 1) ? P(g, "b", 3, B, br, bc, 0) : P(g, "b", 2, br, bc, 0, 0);
    return pdde_matmul(g, a, b, (int)ta, (int)tb);
}

/* matmul_bias: a linear layer whose bias add lowering folds into the matmul (PDDE_FUSE_EPILOGUE=1, set for
 * the case: run_case clears it before the next), then gelu (f32), or under a compute dtype a second
 * matmul whose cast of the first's output is folded in too (the first writes bf16 / f16), or with p[6] a
 * residual add after the bias, then gelu; p = {batch (0: x 2-D), M, K, N, w transposed, compute dtype (0:
 * f32), residual} */
static pdde_tensor *b_matmul_bias(pdde_graph *g, const op_case *c) {
    int64_t B = c->p[0], M = c->p[1], K = c->p[2], N = c->p[3], tb = c->p[4];
    setenv("PDDE_FUSE_EPILOGUE", "1", 1);
    pdde_graph_set_compute_dtype(g, (pdde_dtype)c->p[5]);
    pdde_tensor *x = B ? P(g, "x", 3, B, M, K, 0) : P(g, "x", 2, M, K, 0, 0);
    pdde_tensor *w = tb ? P(g, "w", 2, N, K, 0, 0) : P(g, "w", 2, K, N, 0, 0);
    pdde_tensor *h = pdde_bias_add(g, pdde_matmul(g, x, w, 0, (int)tb), P(g, "bias", 1, N, 0, 0, 0));
    if (c->p[6]) /* a residual add after it (x2 + h), folded in too, then gelu */
        return pdde_gelu(g, pdde_add(g, B ? P(g, "x2", 3, B, M, N, 0) : P(g, "x2", 2, M, N, 0, 0), h));
    if (!c->p[5]) return pdde_gelu(g, h);
    return pdde_matmul(g, h, P(g, "w2", 2, N, 5, 0, 0), 0, 0);
}

/* matmul_bias under PDDE_CUDA_LT_LOWP_BIAS=1 (set for the case, as above; the other backends ignore it): on CUDA the
 * first matmul's bf16 / f16 output and its bias are one cublasLtMatmul, the bias rounded to that dtype first
 * (T_LOWP_BIAS); p as b_matmul_bias's, a compute dtype set */
static pdde_tensor *b_matmul_bias_lowp(pdde_graph *g, const op_case *c) {
    setenv("PDDE_CUDA_LT_LOWP_BIAS", "1", 1);
    return b_matmul_bias(g, c);
}

/* matmul_grad: x [M, K] @ w (or w^T) with PDDE_FUSE_GRAD=1 (set for the case, as above): both gradients are
 * matmuls that lowering folds into their accumulations (acc += op(A) op(B)); p = {M, K, N, w transposed,
 * compute dtype (0: f32)} */
static pdde_tensor *b_matmul_grad(pdde_graph *g, const op_case *c) {
    int64_t M = c->p[0], K = c->p[1], N = c->p[2], tb = c->p[3];
    setenv("PDDE_FUSE_GRAD", "1", 1);
    pdde_graph_set_compute_dtype(g, (pdde_dtype)c->p[4]);
    pdde_tensor *w = tb ? P(g, "w", 2, N, K, 0, 0) : P(g, "w", 2, K, N, 0, 0);
    return pdde_matmul(g, P(g, "x", 2, M, K, 0, 0), w, 0, (int)tb);
}

/* cross_entropy_lowp: logits = x [N, C] @ w [C, V] under a compute dtype, with PDDE_BF16_LOGITS=1 (set for
 * the case, as above): the matmul writes bf16 / f16 logits that the loss and its backward read;
 * p = {N, C, V, compute dtype} */
static pdde_tensor *b_cross_entropy_lowp(pdde_graph *g, const op_case *c) {
    g_vocab = c->p[2];
    setenv("PDDE_BF16_LOGITS", "1", 1);
    pdde_graph_set_compute_dtype(g, (pdde_dtype)c->p[3]);
    pdde_tensor *logits = pdde_matmul(g, P(g, "x", 2, c->p[0], c->p[1], 0, 0), P(g, "w", 2, c->p[1], c->p[2], 0, 0), 0, 0);
    return pdde_cross_entropy(g, logits, I(g, "tgt", PDDE_I32, 1, c->p[0], 0));
}

/* layernorm_res: y = layernorm(x) + x / 2, with PDDE_FUSE_ADD_LN=1 (set for the case, as above): x's two
 * gradients are summed in the layernorm's backward; shape as b_norm's; p[5] 1: x / 2 built first, so
 * that its gradient comes after the layernorm's in backward (not foldable: the add stays) */
static pdde_tensor *b_layernorm_res(pdde_graph *g, const op_case *c) {
    setenv("PDDE_FUSE_ADD_LN", "1", 1);
    pdde_tensor *x = P(g, "x", SHAPE_ARGS(c));
    int64_t C = c->p[c->p[0]];
    pdde_tensor *half = c->p[5] ? pdde_scale(g, x, 0.5f) : NULL;
    pdde_tensor *y = pdde_layernorm(g, x, P(g, "gamma", 1, C, 0, 0, 0), P(g, "beta", 1, C, 0, 0, 0), 1e-5f);
    return pdde_add(g, y, half ? half : pdde_scale(g, x, 0.5f));
}

/* binary: p = {ndim_a, a0, a1, a2, ndim_b, b0, b1, b2} */
static pdde_tensor *b_binary(pdde_graph *g, const op_case *c) {
    pdde_tensor *a = P(g, "a", (int)c->p[0], c->p[1], c->p[2], c->p[3], 0);
    pdde_tensor *b = P(g, "b", (int)c->p[4], c->p[5], c->p[6], c->p[7], 0);
    if (!strcmp(c->op, "add")) return pdde_add(g, a, b);
    if (!strcmp(c->op, "sub")) return pdde_sub(g, a, b);
    return pdde_mul(g, a, b);
}

static pdde_tensor *b_unary(pdde_graph *g, const op_case *c) {
    pdde_tensor *x = P(g, "x", SHAPE_ARGS(c));
    if (!strcmp(c->op, "scale")) return pdde_scale(g, x, -1.7f);
    if (!strcmp(c->op, "gelu")) return pdde_gelu(g, pdde_scale(g, x, 3.0f));
    if (!strcmp(c->op, "relu")) return pdde_relu(g, x);
    return pdde_silu(g, pdde_scale(g, x, 3.0f));
}

/* bias_gelu: x of the shape, bias of its last dim (x scaled as gelu's case: both tails of the tanh) */
static pdde_tensor *b_bias_gelu(pdde_graph *g, const op_case *c) {
    pdde_tensor *x = pdde_scale(g, P(g, "x", SHAPE_ARGS(c)), 3.0f);
    return pdde_bias_gelu(g, x, P(g, "bias", 1, c->p[c->p[0]], 0, 0, 0));
}

static pdde_tensor *b_norm(pdde_graph *g, const op_case *c) {
    pdde_tensor *x = P(g, "x", SHAPE_ARGS(c));
    int64_t C = c->p[c->p[0]];
    pdde_tensor *gamma = P(g, "gamma", 1, C, 0, 0, 0);
    if (!strcmp(c->op, "layernorm")) return pdde_layernorm(g, x, gamma, P(g, "beta", 1, C, 0, 0, 0), 1e-5f);
    return pdde_rmsnorm(g, x, gamma, 1e-5f);
}

/* rope: x [p0, p1, p2, p3] ([B, T, H, D]) rotated with base p4; p5 > 0: LLaMA 3's scaling by factor p5, low
 * and high frequency factors 1 and 4, original context p6 */
static pdde_tensor *b_rope(pdde_graph *g, const op_case *c) {
    pdde_tensor *x = P(g, "x", 4, c->p[0], c->p[1], c->p[2], c->p[3]);
    return c->p[5] > 0 ? pdde_rope_llama3(g, x, (float)c->p[4], (float)c->p[5], 1.0f, 4.0f, (float)c->p[6]) : pdde_rope(g, x, (float)c->p[4]);
}

/* softmax: shape, p[5] = causal */
static pdde_tensor *b_softmax(pdde_graph *g, const op_case *c) {
    return pdde_softmax(g, pdde_scale(g, P(g, "x", SHAPE_ARGS(c)), 3.0f), (int)c->p[5]);
}

/* cross-entropy: p = {N, V} */
static pdde_tensor *b_cross_entropy(pdde_graph *g, const op_case *c) {
    g_vocab = c->p[1];
    pdde_tensor *x = pdde_scale(g, P(g, "x", 2, c->p[0], c->p[1], 0, 0), 4.0f);
    return pdde_cross_entropy(g, x, I(g, c->p[2] ? "tgt_none" : "tgt", PDDE_I32, 1, c->p[0], 0));
}

/* embedding: p = {V, C, ids ndim, i0, i1, tied} (tied: the table also used as an output projection
 * and looked up twice, so the embedding gradient lands on a base) */
static pdde_tensor *b_embedding(pdde_graph *g, const op_case *c) {
    g_vocab = c->p[0];
    pdde_tensor *w = P(g, "table", 2, c->p[0], c->p[1], 0, 0);
    pdde_tensor *ids = I(g, "ids", PDDE_I32, (int)c->p[2], c->p[3], c->p[4]);
    pdde_tensor *y = pdde_embedding(g, w, ids);
    if (c->p[5]) {
        pdde_tensor *y2 = pdde_embedding(g, w, I(g, "ids2", PDDE_I32, (int)c->p[2], c->p[3], c->p[4]));
        int64_t rows = pdde_tensor_numel(ids), shp[2] = {rows, c->p[1]};
        pdde_tensor *h = pdde_reshape(g, pdde_add(g, y, y2), 2, shp);
        y = pdde_matmul(g, h, w, 0, 1); /* logits over the vocabulary, tied weights */
    }
    return y;
}

/* reshape: x [p1, p2, p3] -> [p1 * p2, p3], then relu (a view is not a kernel of its own) */
static pdde_tensor *b_reshape(pdde_graph *g, const op_case *c) {
    int64_t shp[2] = {c->p[1] * c->p[2], c->p[3]};
    return pdde_relu(g, pdde_reshape(g, P(g, "x", 3, c->p[1], c->p[2], c->p[3], 0), 2, shp));
}

/* permute: shape, p[5] = perm packed as decimal digits */
static pdde_tensor *b_permute(pdde_graph *g, const op_case *c) {
    int nd = (int)c->p[0], perm[PDDE_MAX_DIMS];
    int64_t code = c->p[5];
    for (int i = nd - 1; i >= 0; i--) perm[i] = (int)(code % 10), code /= 10;
    return pdde_permute(g, P(g, "x", SHAPE_ARGS(c)), perm);
}

static pdde_tensor *b_permute6(pdde_graph *g, const op_case *c) {
    (void)c;
    int64_t s[6] = {2, 1, 3, 2, 5, 3};
    int perm[6] = {4, 2, 0, 5, 1, 3};
    return pdde_permute(g, pdde_param(g, "x", 6, s, 0.0f), perm);
}

/* concat: p = {n inputs, axis, rows, cols, a3} with input i of length (i + 2) along the axis */
static pdde_tensor *b_concat(pdde_graph *g, const op_case *c) {
    pdde_tensor *xs[6];
    int n = (int)c->p[0], axis = (int)c->p[1];
    for (int i = 0; i < n; i++) {
        char name[16];
        snprintf(name, sizeof name, "x%d", i % 10);
        int64_t s[3] = {c->p[2], c->p[3], c->p[4]};
        s[axis] = i + 2;
        xs[i] = pdde_param(g, name, 3, s, 0.0f);
    }
    return pdde_concat(g, n, xs, axis);
}

/* slice: x [p0, p1, p2], p3 = axis, p4 = start, p5 = length */
static pdde_tensor *b_slice(pdde_graph *g, const op_case *c) {
    return pdde_slice(g, P(g, "x", 3, c->p[0], c->p[1], c->p[2], 0), (int)c->p[3], c->p[4], c->p[5]);
}

/* sum / mean: shape, p[5] = axis, p[6] = keepdim */
static pdde_tensor *b_reduce(pdde_graph *g, const op_case *c) {
    pdde_tensor *x = P(g, "x", SHAPE_ARGS(c));
    if (!strcmp(c->op, "sum")) return pdde_sum(g, x, (int)c->p[5], (int)c->p[6]);
    return pdde_mean(g, x, (int)c->p[5], (int)c->p[6]);
}

/* dropout: shape, p[5] = p in percent */
static pdde_tensor *b_dropout(pdde_graph *g, const op_case *c) {
    return pdde_dropout(g, P(g, "x", SHAPE_ARGS(c)), (float)c->p[5] / 100.0f, 0x123456789abcdefull);
}

/* cast: x of dtype p[5] [p1, p2] (times 1e-4 if p[3]) to dtype p[6] */
static pdde_tensor *b_cast(pdde_graph *g, const op_case *c) {
    pdde_tensor *x = I(g, "x", (pdde_dtype)c->p[5], 2, c->p[1], c->p[2]);
    if (c->p[3]) x = pdde_scale(g, x, 1e-4f); /* into the f16 subnormals */
    return pdde_cast(g, x, (pdde_dtype)c->p[6]);
}

/* attention over q, k, v [p0, p1, p2, p3]; p4 = 1: the unfused reference */
static pdde_tensor *b_attention(pdde_graph *g, const op_case *c) {
    int64_t s[4] = {c->p[0], c->p[1], c->p[2], c->p[3]};
    pdde_tensor *q = pdde_param(g, "q", 4, s, 0.0f), *k = pdde_param(g, "k", 4, s, 0.0f);
    return (c->p[4] ? pdde_attention_unfused : pdde_attention)(g, q, k, pdde_param(g, "v", 4, s, 0.0f));
}

/* a small MLP with a loss: checks the optimizer ops over several steps (p0 = 1: AdamW with clipping,
 * 0: SGD with momentum and weight decay) */
static pdde_tensor *b_mlp(pdde_graph *g, const op_case *c) {
    (void)c;
    g_vocab = 7;
    pdde_tensor *x = P(g, "x", 2, 9, 13, 0, 0);
    pdde_tensor *w1 = P(g, "w1", 2, 13, 17, 0, 0), *b1 = P(g, "b1", 1, 17, 0, 0, 0);
    pdde_tensor *w2 = P(g, "w2", 2, 17, 7, 0, 0);
    pdde_tensor *h = pdde_gelu(g, pdde_bias_add(g, pdde_matmul(g, x, w1, 0, 0), b1));
    pdde_tensor *ln = pdde_layernorm(g, h, P(g, "gamma", 1, 17, 0, 0, 0), P(g, "beta", 1, 17, 0, 0, 0), 1e-5f);
    return pdde_cross_entropy(g, pdde_matmul(g, ln, w2, 0, 0), I(g, "tgt", PDDE_I32, 1, 9, 0));
}

/* the same under a bf16 compute dtype, layernorm first: the updates rewrite the weights' bf16 copies,
 * and the layernorm and the bias_gelu write bf16 for the matmuls after them (their casts folded in) */
/* x [9, C], layernorm, @ w1 [C, F], bias_gelu, @ w2 [F, V], cross-entropy over V classes */
static pdde_tensor *ln_gelu_mlp(pdde_graph *g, int64_t C, int64_t F, int64_t V) {
    g_vocab = V;
    pdde_tensor *x = P(g, "x", 2, 9, C, 0, 0);
    pdde_tensor *ln = pdde_layernorm(g, x, P(g, "gamma", 1, C, 0, 0, 0), P(g, "beta", 1, C, 0, 0, 0), 1e-5f);
    pdde_tensor *w1 = P(g, "w1", 2, C, F, 0, 0), *b1 = P(g, "b1", 1, F, 0, 0, 0), *w2 = P(g, "w2", 2, F, V, 0, 0);
    pdde_tensor *h = pdde_bias_gelu(g, pdde_matmul(g, ln, w1, 0, 0), b1);
    return pdde_cross_entropy(g, pdde_matmul(g, h, w2, 0, 0), I(g, "tgt", PDDE_I32, 1, 9, 0));
}

static pdde_tensor *b_mlp_bf16(pdde_graph *g, const op_case *c) {
    (void)c;
    pdde_graph_set_compute_dtype(g, PDDE_BF16);
    return ln_gelu_mlp(g, 13, 17, 7);
}

/* the same with PDDE_BF16_GRADS=1 (set for the case, as above): the bias_gelu's backward writes bf16 for
 * the matmul before it and b1's gradient is summed from those bf16 rows (a sum_to of bf16 input) */
static pdde_tensor *b_mlp_bf16_grads(pdde_graph *g, const op_case *c) {
    setenv("PDDE_BF16_GRADS", "1", 1);
    return b_mlp_bf16(g, c);
}

/* bias_gelu_rows: x [p0, 13] @ w1, bias_gelu, @ w2 under bf16 with PDDE_BF16_GRADS=1 (as b_mlp_bf16_grads): enough
 * rows (512 and more) that a GPU sums the bf16 bias gradient in row chunks */
static pdde_tensor *b_bias_gelu_rows(pdde_graph *g, const op_case *c) {
    setenv("PDDE_BF16_GRADS", "1", 1);
    pdde_graph_set_compute_dtype(g, PDDE_BF16);
    pdde_tensor *w1 = P(g, "w1", 2, 13, 17, 0, 0), *b1 = P(g, "b1", 1, 17, 0, 0, 0), *w2 = P(g, "w2", 2, 17, 7, 0, 0);
    pdde_tensor *h = pdde_bias_gelu(g, pdde_matmul(g, P(g, "x", 2, c->p[0], 13, 0, 0), w1, 0, 0), b1);
    return pdde_matmul(g, h, w2, 0, 0);
}

/* gelu_fused: x [9, 16] @ w1 [16, 24], bias_gelu, @ w2 [24, 8], cross-entropy, with PDDE_FUSE_GELU=1 (set for the
 * case, as above): the first matmul adds the bias and applies gelu (X beside), the matmul before the
 * bias_gelu backward multiplies by gelu'(X); p1: a bf16 compute dtype with PDDE_BF16_GRADS=1 (X and the
 * gradient bf16: cublasLt's DGELU takes both; widths multiples of 8 for its aux); p2: PDDE_CUDA_LT_LOWP_BIAS=1 too.
 * p0 is 0 in all: the steps run SGD, whose update is linear in the gradient. (AdamW's first update is lr g / |g|, +-lr whatever
 * |g|: in bf16 a gradient element that rounds to the other side of 0 on another device, or with another
 * GEMM's summation order, moves by 2 lr, and no NMSE bound on the parameters follows from the gradients'.
 * cublasLt's DGELU (gelu' of the same tanh form, its own summation order) gave x [9, 16] an NMSE of
 * 1.9e-4 after 3 AdamW steps on an H200, what one such element of x makes: (2 lr)^2 / |x|^2 = 0.01 / 48.) */
static pdde_tensor *b_mlp_gelu(pdde_graph *g, const op_case *c) {
    setenv("PDDE_FUSE_GELU", "1", 1);
    if (c->p[1]) setenv("PDDE_BF16_GRADS", "1", 1), pdde_graph_set_compute_dtype(g, PDDE_BF16);
    if (c->p[2]) setenv("PDDE_CUDA_LT_LOWP_BIAS", "1", 1); /* (p2: GELU_AUX_BIAS with the bias rounded to bf16, as b_matmul_bias_lowp) */
    return ln_gelu_mlp(g, 16, 24, 8);
}

/* layernorm_add: s = x + r, y = layernorm(s) + s / 2, with PDDE_FUSE_ADD_LN=1 (set for the case, as above):
 * the layernorm adds x and r itself and writes s beside y (the add a view of it); shape as b_norm's */
static pdde_tensor *b_layernorm_add(pdde_graph *g, const op_case *c) {
    setenv("PDDE_FUSE_ADD_LN", "1", 1);
    pdde_tensor *s = pdde_add(g, P(g, "x", SHAPE_ARGS(c)), P(g, "r", SHAPE_ARGS(c)));
    int64_t C = c->p[c->p[0]];
    pdde_tensor *y = pdde_layernorm(g, s, P(g, "gamma", 1, C, 0, 0, 0), P(g, "beta", 1, C, 0, 0, 0), 1e-5f);
    return pdde_add(g, y, pdde_scale(g, s, 0.5f));
}

/* layernorm_copy: h = x @ w1, y = layernorm(h) + h / 2, out = y @ w2 under a bf16 compute dtype, with
 * PDDE_BF16_GRADS=1 and PDDE_FUSE_ADD_LN=1 (set for the case, as above): the layernorm backward adds h's
 * other gradient and writes the bf16 copy of dh that the first matmul's backward reads (its cast a view) */
static pdde_tensor *b_layernorm_copy(pdde_graph *g, const op_case *c) {
    (void)c;
    setenv("PDDE_BF16_GRADS", "1", 1), setenv("PDDE_FUSE_ADD_LN", "1", 1);
    pdde_graph_set_compute_dtype(g, PDDE_BF16);
    pdde_tensor *h = pdde_matmul(g, P(g, "x", 2, 9, 13, 0, 0), P(g, "w1", 2, 13, 131, 0, 0), 0, 0);
    pdde_tensor *y = pdde_layernorm(g, h, P(g, "gamma", 1, 131, 0, 0, 0), P(g, "beta", 1, 131, 0, 0, 0), 1e-5f);
    return pdde_matmul(g, pdde_add(g, y, pdde_scale(g, h, 0.5f)), P(g, "w2", 2, 131, 7, 0, 0), 0, 0);
}

/* cross_entropy_fused: the cross-entropy's backward in its forward (PDDE_FUSE_CE=1, set for the case, as above: one
 * kernel writes the loss and dlogits); p = {N, C, V, compute dtype, all targets ignored, f32 logits}: C = 0: logits =
 * 4 x [N, V] in f32; else x [N, C] @ w [C, V] under the compute dtype, with PDDE_BF16_LOGITS=1 unless p5 (bf16 / f16
 * logits), the dlogits in that dtype (their cast folded into the backward, so into the fused forward) */
static pdde_tensor *b_cross_entropy_fused(pdde_graph *g, const op_case *c) {
    setenv("PDDE_FUSE_CE", "1", 1);
    g_vocab = c->p[2];
    pdde_tensor *logits;
    if (!c->p[1]) logits = pdde_scale(g, P(g, "x", 2, c->p[0], c->p[2], 0, 0), 4.0f);
    else {
        if (!c->p[5]) setenv("PDDE_BF16_LOGITS", "1", 1);
        pdde_graph_set_compute_dtype(g, (pdde_dtype)c->p[3]);
        logits = pdde_matmul(g, P(g, "x", 2, c->p[0], c->p[1], 0, 0), P(g, "w", 2, c->p[1], c->p[2], 0, 0), 0, 0);
    }
    return pdde_cross_entropy(g, logits, I(g, c->p[4] ? "tgt_none" : "tgt", PDDE_I32, 1, c->p[0], 0));
}

/* the memory-bound kernels' switches of the GPU backends (backends/gpu_dispatch.h, pgd_mem_kernels_env) */
static void mem_kernels(const char *name, const char *value) {
    char v[64];
    snprintf(v, sizeof v, "PDDE_CUDA_%s", name), setenv(v, value, 1);
    snprintf(v, sizeof v, "PDDE_OPENCL_%s", name), setenv(v, value, 1);
}

/* colsum2: a bias gradient (sum_to of dy [R, C] to [C]) by k_colsum2 (PDDE_*_COLSUM2=1, set for the case): p = {R, C,
 * bf16}: y = x [R, 5] @ w [5, C] + b; p2: under bf16 with PDDE_BF16_GRADS=1, bias_gelu (b's gradient summed from bf16 rows) */
static pdde_tensor *b_colsum2(pdde_graph *g, const op_case *c) {
    mem_kernels("COLSUM2", "1");
    pdde_tensor *x = P(g, "x", 2, c->p[0], 5, 0, 0), *w = P(g, "w", 2, 5, c->p[1], 0, 0), *b = P(g, "b", 1, c->p[1], 0, 0, 0);
    if (!c->p[2]) return pdde_bias_add(g, pdde_matmul(g, x, w, 0, 0), b);
    setenv("PDDE_BF16_GRADS", "1", 1);
    pdde_graph_set_compute_dtype(g, PDDE_BF16);
    return pdde_matmul(g, pdde_bias_gelu(g, pdde_matmul(g, x, w, 0, 0), b), P(g, "w2", 2, c->p[1], 7, 0, 0), 0, 0);
}

/* cross_entropy_divisor: the step's count of targets given (pdde_session_set_loss_tokens): the summed loss and its
 * gradient divided by p3, not by the node's own count; p = {N, V, 0 / 1 fused (PDDE_FUSE_CE) / 2 staged (CE1), p3} */
static pdde_tensor *b_cross_entropy_divisor(pdde_graph *g, const op_case *c) {
    g_loss_tokens = c->p[3], g_vocab = c->p[1];
    if (c->p[2]) setenv("PDDE_FUSE_CE", "1", 1);
    if (c->p[2] == 2) mem_kernels("CE1", "1");
    return pdde_cross_entropy(g, pdde_scale(g, P(g, "x", 2, c->p[0], c->p[1], 0, 0), 4.0f), I(g, "tgt", PDDE_I32, 1, c->p[0], 0));
}

/* cross_entropy_staged: cross_entropy_fused's cases by k_ce_staged (PDDE_*_CE1=1, set for the case: each row staged in
 * local memory, read from device memory once) */
static pdde_tensor *b_cross_entropy_staged(pdde_graph *g, const op_case *c) {
    mem_kernels("CE1", "1");
    return b_cross_entropy_fused(g, c);
}

/* adamw_chunks: AdamW steps by k_adamw_chunks (PDDE_*_ADAMW_CHUNKS=1, set for the case): ln_gelu_mlp with p = {1
 * (AdamW), compute dtype (0: f32; bf16: the weights' copies rewritten too), C, F, V}: C x F past one chunk of 4096 */
static pdde_tensor *b_adamw_chunks(pdde_graph *g, const op_case *c) {
    mem_kernels("ADAMW_CHUNKS", "1");
    if (c->p[1]) pdde_graph_set_compute_dtype(g, (pdde_dtype)c->p[1]);
    return ln_gelu_mlp(g, c->p[2], c->p[3], c->p[4]);
}

/* adamw_vec: adamw_chunks's steps by CUDA's k_adamw_vec (PDDE_CUDA_ADAMW_VEC=1, set for the case; the other backends
 * take their k_adamw_chunks or k_adamw_multi) */
static pdde_tensor *b_adamw_vec(pdde_graph *g, const op_case *c) {
    mem_kernels("ADAMW_VEC", "1");
    return b_adamw_chunks(g, c);
}

/* bias_gelu2: bias_gelu by CUDA's k_bias_gelu2 (PDDE_CUDA_GELU2=1, set for the case; bias widths that are multiples
 * of 4, else k_bias_gelu; the other backends take theirs): b_bias_gelu's cases, or with p0 = 0, {0, R, F}: under bf16
 * with PDDE_BF16_GRADS=1, x [R, 13] @ w1 [13, F], bias_gelu, @ w2 [F, 7] (the forward and backward write bf16) */
static pdde_tensor *b_bias_gelu2(pdde_graph *g, const op_case *c) {
    mem_kernels("GELU2", "1");
    if (c->p[0]) return b_bias_gelu(g, c);
    setenv("PDDE_BF16_GRADS", "1", 1);
    pdde_graph_set_compute_dtype(g, PDDE_BF16);
    pdde_tensor *w1 = P(g, "w1", 2, 13, c->p[2], 0, 0), *b1 = P(g, "b1", 1, c->p[2], 0, 0, 0), *w2 = P(g, "w2", 2, c->p[2], 7, 0, 0);
    return pdde_matmul(g, pdde_bias_gelu(g, pdde_matmul(g, P(g, "x", 2, c->p[1], 13, 0, 0), w1, 0, 0), b1), w2, 0, 0);
}

/* layernorm2: layernorm by the warp-per-row kernels (PDDE_*_LN2=1, set for the case: k_layernorm2, k_layernorm_back2,
 * k_layernorm_gamma2); p = {form, R, C}, x [R, C]: form 0 the plain layernorm; 1 layernorm_res's (the backward adds x's
 * other gradient); 2 layernorm_add's (the forward adds r and writes the sum); 3 layernorm_copy's (x [R, 13] @ w1 under
 * bf16 with PDDE_BF16_GRADS=1: the backward also writes dx's bf16 copy); 4 under bf16, the layernorm's output the
 * matmul's operand (written in bf16). The kernels' instances hold rows of up to 768, 1024, 1664 and 2048 columns (the
 * narrowest that holds the row runs); C above 2048 is declined (the group-per-row kernels run). */
static pdde_tensor *b_layernorm2(pdde_graph *g, const op_case *c) {
    mem_kernels("LN2", "1");
    int64_t R = c->p[1], C = c->p[2];
    pdde_tensor *gamma = P(g, "gamma", 1, C, 0, 0, 0), *beta = P(g, "beta", 1, C, 0, 0, 0);
    if (c->p[0] == 0) return pdde_layernorm(g, P(g, "x", 2, R, C, 0, 0), gamma, beta, 1e-5f);
    setenv("PDDE_FUSE_ADD_LN", "1", 1);
    if (c->p[0] == 1) {
        pdde_tensor *x = P(g, "x", 2, R, C, 0, 0);
        return pdde_add(g, pdde_layernorm(g, x, gamma, beta, 1e-5f), pdde_scale(g, x, 0.5f));
    }
    if (c->p[0] == 2) {
        pdde_tensor *s = pdde_add(g, P(g, "x", 2, R, C, 0, 0), P(g, "r", 2, R, C, 0, 0));
        return pdde_add(g, pdde_layernorm(g, s, gamma, beta, 1e-5f), pdde_scale(g, s, 0.5f));
    }
    pdde_graph_set_compute_dtype(g, PDDE_BF16);
    if (c->p[0] == 3) {
        setenv("PDDE_BF16_GRADS", "1", 1);
        pdde_tensor *h = pdde_matmul(g, P(g, "x", 2, R, 13, 0, 0), P(g, "w1", 2, 13, C, 0, 0), 0, 0);
        pdde_tensor *y = pdde_layernorm(g, h, gamma, beta, 1e-5f);
        return pdde_matmul(g, pdde_add(g, y, pdde_scale(g, h, 0.5f)), P(g, "w2", 2, C, 7, 0, 0), 0, 0);
    }
    pdde_tensor *y = pdde_layernorm(g, P(g, "x", 2, R, C, 0, 0), gamma, beta, 1e-5f);
    return pdde_matmul(g, y, P(g, "w", 2, C, 7, 0, 0), 0, 0);
}

/* a Mixture-of-Experts feed-forward: x [N, C], router [C, E], top-k, gate, dispatch, grouped GEMMs
 * (w1 [E, C, F], gelu, w2 [E, F, C] or [E, C, F] transposed), combine, plus the balance loss;
 * p = {N, C, F, E, k, capacity factor x 100 (0: dropless; -1: by expert, [E, N, C]), flags (| MOE_SKEW), trans_b}. The MoE
 * ops have i32 expert ids: a device without them leaves them to the CPU and runs the rest (the fallback's copies).
 * MOE_SKEW: a routing bias (moe_skew, fill_leaf) sends every token to expert 0 (k = 1) or to experts 0 and 1 (k = 2): the
 * other experts get none. MOE_BF16: under a bf16 compute dtype (the permutation's rows and the GEMMs' operands bf16; every
 * backend rounds them alike, then sums in f32: T_LOWP, as the dense bf16 cases). */
#define MOE_SKEW 0x100
#define MOE_BF16 0x200
static pdde_tensor *b_moe(pdde_graph *g, const op_case *c) {
    int64_t N = c->p[0], C = c->p[1], F = c->p[2], E = c->p[3], k = c->p[4];
    unsigned flags = (unsigned)c->p[6] & ~(unsigned)(MOE_SKEW | MOE_BF16);
    if (c->p[6] & MOE_BF16) pdde_graph_set_compute_dtype(g, PDDE_BF16);
    int64_t cap = c->p[5] < 0 ? N : pdde_moe_capacity(N, (int)k, (int)E, (float)c->p[5] / 100.0f);
    pdde_tensor *x = P(g, "x", 2, N, C, 0, 0), *router = P(g, "router", 2, C, E, 0, 0);
    pdde_tensor *w1 = P(g, "w1", 3, E, C, F, 0), *w2 = c->p[7] ? P(g, "w2", 3, E, C, F, 0) : P(g, "w2", 3, E, F, C, 0);
    pdde_tensor *logits = pdde_matmul(g, x, router, 0, 0);
    pdde_tensor *skew = c->p[6] & MOE_SKEW ? pdde_input(g, "moe_skew", PDDE_F32, 1, (int64_t[]){E}) : NULL;
    pdde_tensor *idx = pdde_moe_topk(g, logits, skew, (int)k, flags);
    pdde_tensor *xe = c->p[5] < 0 ? pdde_moe_dispatch_experts(g, x, idx, (int)E, cap) : pdde_moe_dispatch(g, x, idx, (int)E, cap);
    pdde_tensor *h = pdde_gelu(g, pdde_moe_grouped_matmul(g, xe, w1, idx, cap, 0));
    pdde_tensor *y = pdde_moe_combine(g, pdde_moe_grouped_matmul(g, h, w2, idx, cap, (int)c->p[7]), idx,
                                      pdde_moe_gate(g, logits, idx, flags), (int)E, cap);
    pdde_tensor *aux = pdde_moe_aux_loss(g, logits, idx, (int)E);
    return pdde_add(g, y, aux); /* (aux [1] broadcast over y: its gradient flows through the sum) */
}

#define T_DEF 1e-10 /* f32 round-off of one op, a few ulp of reordered sums */
#define T_MM 1e-9   /* long dot products in another order */
#define T_EXACT 0.0 /* data movement, casts, masks: bit for bit */
/* bf16 values made from f32 results that differ by an ulp of reordering round to bf16 neighbours where
 * they straddle a rounding boundary: such an element moves by 2^-8 relative; a few of them in a
 * 13-17 term product bound the NMSE by about 1e-6 */
#define T_LOWP 1e-6
/* PDDE_CUDA_LT_LOWP_BIAS=1 (cuda): a bf16 / f16 output with a bias is rnd(s + rnd(b)) where the reference computes
 * rnd(s + b) (s the f32 sum, rnd to the output's dtype, unit roundoff u = 2^-8 in bf16, 2^-11 in f16). rnd(b) moves
 * the sum by at most u |b| and the two roundings each by at most u |y| (y = s + b), so an element differs by at most
 * u |b| + 2u |y|, and over the output NMSE <= u^2 (sqrt(sum b^2 / sum y^2) + 2)^2 <= 9 u^2 = 1.4e-4 in bf16 where
 * sum b^2 <= sum y^2 (the cases: a bias of [-1, 1], |b|^2 ~ 1/3, beside dot products of 16 to 40 terms, |s|^2 ~ K/9).
 * Typically the two agree, and differ by one ulp (~1.4 u |y|) where rnd(b) - b moves the sum across a rounding
 * boundary, with a chance of about |rnd(b) - b| / ulp: E d^2 ~ 0.7 u^2 |b| |y|, an NMSE of ~0.3 u^2 = 4e-6 in bf16
 * (b_matmul_bias_lowp's cases check the bound on the CPU: lowp_bias_model_check). The matmul after it and the
 * gradients carry that error on, about the same NMSE for these random operands (the gradients get 10x, as every case). */
#define T_LOWP_BIAS 1.5e-4

static const op_case cases[] = {
    /* matmul {M, N, K, ta, tb, batch, shared} */
    {"matmul", b_matmul, {1, 1, 1, 0, 0, 0, 0}, 1, T_MM},
    {"matmul", b_matmul, {7, 13, 5, 0, 0, 0, 0}, 1, T_MM},
    {"matmul", b_matmul, {33, 17, 65, 0, 0, 0, 0}, 1, T_MM},
    {"matmul", b_matmul, {127, 129, 61, 0, 0, 0, 0}, 1, T_MM},
    {"matmul", b_matmul, {19, 23, 29, 1, 0, 0, 0}, 1, T_MM},
    {"matmul", b_matmul, {19, 23, 29, 0, 1, 0, 0}, 1, T_MM},
    {"matmul", b_matmul, {19, 23, 29, 1, 1, 0, 0}, 1, T_MM},
    {"matmul", b_matmul, {17, 11, 13, 0, 0, 3, 0}, 1, T_MM},
    {"matmul", b_matmul, {17, 11, 13, 0, 1, 3, 0}, 1, T_MM},
    {"matmul", b_matmul, {17, 11, 13, 1, 0, 5, 1}, 1, T_MM},
    {"matmul", b_matmul, {17, 11, 13, 0, 0, 5, 1}, 1, T_MM},
    {"matmul", b_matmul, {17, 11, 13, 0, 1, 4, 2}, 1, T_MM},
    {"matmul", b_matmul, {0, 5, 3, 0, 0, 0, 0}, 0, T_MM},
    {"matmul", b_matmul, {4, 5, 0, 0, 0, 0, 0}, 0, T_MM},
    /* mixed precision: every backend rounds the operands the same way, then accumulates in f32 */
    {"matmul", b_matmul, {33, 17, 65, 0, 0, 0, 0, PDDE_BF16}, 1, T_MM},
    {"matmul", b_matmul, {19, 23, 29, 1, 1, 0, 0, PDDE_BF16}, 1, T_MM},
    {"matmul", b_matmul, {17, 11, 13, 0, 1, 3, 0, PDDE_BF16}, 1, T_MM},
    {"matmul", b_matmul, {17, 11, 13, 0, 0, 5, 1, PDDE_F16}, 1, T_MM},
    {"matmul", b_matmul, {19, 23, 29, 0, 1, 0, 0, PDDE_F16}, 1, T_MM},
    /* a matmul with its bias add (and the cast after it, or a residual add) folded in {batch, M, K, N, tb, compute dtype, residual} */
    {"matmul_bias", b_matmul_bias, {0, 33, 19, 37, 0, 0}, 1, T_MM},
    {"matmul_bias", b_matmul_bias, {3, 17, 13, 29, 1, 0}, 1, T_MM},
    {"matmul_bias", b_matmul_bias, {0, 1, 1, 1, 0, 0}, 1, T_MM},
    {"matmul_bias", b_matmul_bias, {0, 33, 19, 37, 0, PDDE_BF16}, 1, T_LOWP},
    {"matmul_bias", b_matmul_bias, {2, 17, 13, 29, 1, PDDE_BF16}, 1, T_LOWP},
    {"matmul_bias", b_matmul_bias, {0, 19, 23, 29, 0, PDDE_F16}, 1, T_LOWP},
    {"matmul_bias", b_matmul_bias, {0, 33, 19, 37, 0, 0, 1}, 1, T_MM},
    {"matmul_bias", b_matmul_bias, {3, 17, 13, 29, 1, PDDE_BF16, 1}, 1, T_MM},
    /* the gradients' matmuls folded into their accumulations {M, K, N, tb, compute dtype} */
    {"matmul_grad", b_matmul_grad, {33, 19, 37, 0, 0}, 1, T_MM},
    {"matmul_grad", b_matmul_grad, {17, 13, 29, 1, 0}, 1, T_MM},
    {"matmul_grad", b_matmul_grad, {1, 1, 1, 0, 0}, 1, T_MM},
    {"matmul_grad", b_matmul_grad, {33, 19, 37, 0, PDDE_BF16}, 1, T_MM},
    {"matmul_grad", b_matmul_grad, {17, 13, 29, 1, PDDE_F16}, 1, T_MM},
    /* bf16 / f16 logits into the cross-entropy {N, C, V, compute dtype} */
    {"cross_entropy_lowp", b_cross_entropy_lowp, {9, 13, 37, PDDE_BF16}, 1, T_LOWP},
    {"cross_entropy_lowp", b_cross_entropy_lowp, {33, 7, 1001, PDDE_BF16}, 1, T_LOWP},
    {"cross_entropy_lowp", b_cross_entropy_lowp, {5, 11, 300, PDDE_F16}, 1, T_LOWP},
    /* the cross-entropy's backward in its forward {N, C, V, compute dtype, all targets ignored, f32 logits} (V multiples
     * of 8 and 4: the CUDA kernel's 16-byte loads) */
    {"cross_entropy_fused", b_cross_entropy_fused, {9, 0, 37, 0}, 1, T_DEF},
    {"cross_entropy_fused", b_cross_entropy_fused, {33, 0, 1000, 0}, 1, T_DEF},
    {"cross_entropy_fused", b_cross_entropy_fused, {4, 0, 7, 0, 1}, 1, T_DEF},
    {"cross_entropy_fused", b_cross_entropy_fused, {1, 0, 1, 0}, 1, T_DEF},
    {"cross_entropy_fused", b_cross_entropy_fused, {33, 7, 1000, PDDE_BF16}, 1, T_LOWP},
    {"cross_entropy_fused", b_cross_entropy_fused, {9, 13, 37, PDDE_BF16}, 1, T_LOWP},
    {"cross_entropy_fused", b_cross_entropy_fused, {5, 11, 304, PDDE_F16}, 1, T_LOWP},
    {"cross_entropy_fused", b_cross_entropy_fused, {17, 9, 96, PDDE_BF16, 0, 1}, 1, T_LOWP},
    /* the step's divisor instead of the node's count of targets {N, V, unfused / fused / staged, divisor} */
    {"cross_entropy_divisor", b_cross_entropy_divisor, {33, 1000, 0, 77}, 1, T_DEF},
    {"cross_entropy_divisor", b_cross_entropy_divisor, {33, 1000, 1, 77}, 1, T_DEF},
    {"cross_entropy_divisor", b_cross_entropy_divisor, {9, 37, 2, 5}, 1, T_DEF},
    /* bias gradients by k_colsum2 {R, C, bf16 rows}: row chunks (R past 2 x 64), C not a multiple of 128, 4 (declined) */
    {"colsum2", b_colsum2, {1031, 36, 0}, 1, T_DEF},
    {"colsum2", b_colsum2, {700, 260, 0}, 1, T_DEF},
    {"colsum2", b_colsum2, {9, 8, 0}, 1, T_DEF},
    {"colsum2", b_colsum2, {300, 37, 0}, 1, T_DEF},
    {"colsum2", b_colsum2, {1031, 24, 1}, 1, T_LOWP},
    /* AdamW by k_adamw_chunks {1, compute dtype, C, F, V} */
    {"adamw_chunks", b_adamw_chunks, {1, 0, 13, 331, 7}, 3, T_DEF},
    {"adamw_chunks", b_adamw_chunks, {1, PDDE_BF16, 16, 520, 8}, 3, T_LOWP},
    /* binary {ndim_a, a.., ndim_b, b..} */
    {"add", b_binary, {2, 37, 19, 0, 2, 37, 19, 0}, 1, T_DEF},
    {"add", b_binary, {3, 4, 7, 33, 1, 33, 0, 0}, 1, T_DEF},
    {"add", b_binary, {3, 5, 7, 9, 2, 7, 1, 0}, 1, T_DEF},
    {"add", b_binary, {3, 5, 7, 9, 3, 5, 1, 9}, 1, T_DEF},
    {"add", b_binary, {2, 0, 5, 0, 1, 5, 0, 0}, 0, T_DEF},
    {"sub", b_binary, {2, 31, 3, 0, 2, 31, 3, 0}, 1, T_DEF},
    {"sub", b_binary, {3, 2, 3, 17, 1, 1, 0, 0}, 1, T_DEF},
    {"mul", b_binary, {2, 29, 23, 0, 2, 29, 23, 0}, 1, T_DEF},
    {"mul", b_binary, {3, 6, 5, 11, 2, 5, 11, 0}, 1, T_DEF},
    {"mul", b_binary, {3, 6, 5, 11, 3, 6, 5, 1}, 1, T_DEF},
    /* unary */
    {"scale", b_unary, {1, 101}, 1, T_DEF},
    {"gelu", b_unary, {2, 3, 257}, 1, T_DEF},
    {"gelu", b_unary, {1, 1}, 1, T_DEF},
    {"relu", b_unary, {2, 3, 257}, 1, T_DEF},
    {"relu", b_unary, {1, 0}, 0, T_DEF},
    {"silu", b_unary, {3, 2, 5, 67}, 1, T_DEF},
    /* norms: shape, the last dim is C */
    {"layernorm", b_norm, {2, 1, 1}, 1, T_DEF},
    {"layernorm", b_norm, {2, 7, 33}, 1, T_DEF},
    {"layernorm", b_norm, {3, 4, 5, 769}, 1, T_DEF},
    {"layernorm", b_norm, {2, 3, 1000}, 1, T_DEF},
    {"layernorm", b_norm, {2, 1031, 33}, 1, T_DEF}, /* (rows enough for the GPU's gamma gradient in row chunks) */
    {"layernorm_res", b_layernorm_res, {2, 7, 33}, 1, T_DEF},
    {"layernorm_res", b_layernorm_res, {3, 4, 5, 769}, 1, T_DEF},
    {"layernorm_res", b_layernorm_res, {2, 7, 33, 0, 0, 1}, 1, T_DEF},
    {"layernorm_add", b_layernorm_add, {2, 7, 33}, 1, T_DEF},
    {"layernorm_add", b_layernorm_add, {3, 4, 5, 769}, 1, T_DEF},
    {"rmsnorm", b_norm, {2, 7, 33}, 1, T_DEF},
    {"rmsnorm", b_norm, {3, 2, 3, 1001}, 1, T_DEF},
    {"rmsnorm", b_norm, {2, 1, 1}, 1, T_DEF}, /* (its gradients' bound: grad_tolerance) */
    /* rope {B, T, H, D, base} (its gradient: rope by minus the angle): T not a multiple of anything, the bases of LLaMA 2
     * and 3, D = 2 and 256 (the devices' angle table at its widest), T = 300 (angles past 2 pi x 47) */
    {"rope", b_rope, {2, 7, 3, 8, 10000}, 1, T_DEF},
    {"rope", b_rope, {1, 33, 2, 64, 10000}, 1, T_DEF},
    {"rope", b_rope, {2, 5, 4, 128, 10000}, 1, T_DEF},
    {"rope", b_rope, {2, 7, 3, 8, 500000}, 1, T_DEF},
    {"rope", b_rope, {1, 33, 2, 64, 500000}, 1, T_DEF},
    {"rope", b_rope, {2, 5, 4, 128, 500000}, 1, T_DEF},
    {"rope", b_rope, {3, 1, 2, 2, 10000}, 1, T_DEF},
    {"rope", b_rope, {1, 300, 1, 256, 10000}, 1, T_DEF},
    /* LLaMA 3.1's scaled frequencies: its own (factor 8, original 8192), and a short original context
     * that puts D = 128's pairs in all three bands (kept, blended, slowed) */
    {"rope", b_rope, {1, 33, 2, 64, 500000, 8, 8192}, 1, T_DEF},
    {"rope", b_rope, {2, 300, 1, 128, 10000, 32, 64}, 1, T_DEF},
    /* softmax: shape, p[5] causal */
    {"softmax", b_softmax, {2, 5, 37, 0, 0, 0}, 1, T_DEF},
    {"softmax", b_softmax, {2, 1, 1, 0, 0, 0}, 1, T_DEF},
    {"softmax", b_softmax, {2, 3, 1000, 0, 0, 0}, 1, T_DEF},
    {"softmax", b_softmax, {4, 2, 3, 17, 17, 1}, 1, T_DEF},
    {"softmax", b_softmax, {2, 1, 1, 0, 0, 1}, 1, T_DEF},
    /* cross-entropy {N, V, all targets ignored} */
    {"cross_entropy", b_cross_entropy, {9, 37, 0}, 1, T_DEF},
    {"cross_entropy", b_cross_entropy, {33, 1001, 0}, 1, T_DEF},
    {"cross_entropy", b_cross_entropy, {1, 1, 0}, 1, T_DEF},
    {"cross_entropy", b_cross_entropy, {4, 7, 1}, 1, T_DEF},
    /* embedding {V, C, ids ndim, i0, i1, tied} */
    {"embedding", b_embedding, {50, 17, 2, 3, 7, 0}, 1, T_EXACT},
    {"embedding", b_embedding, {1, 1, 1, 1, 0, 0}, 1, T_EXACT},
    {"embedding", b_embedding, {37, 19, 2, 2, 5, 1}, 1, T_MM},
    /* shape ops */
    {"reshape", b_reshape, {3, 3, 5, 7}, 1, T_EXACT},
    {"permute", b_permute, {4, 2, 3, 4, 5, 3102}, 1, T_EXACT},
    {"permute", b_permute, {2, 37, 19, 0, 0, 10}, 1, T_EXACT},
    {"permute", b_permute, {3, 1, 7, 1, 0, 210}, 1, T_EXACT},
    {"permute", b_permute6, {0}, 1, T_EXACT},
    {"concat", b_concat, {3, 1, 4, 0, 6}, 1, T_EXACT},
    {"concat", b_concat, {2, 0, 0, 5, 3}, 1, T_EXACT},
    {"concat", b_concat, {6, 2, 3, 2, 0}, 1, T_EXACT},
    {"slice", b_slice, {4, 11, 6, 1, 3, 5}, 1, T_EXACT},
    {"slice", b_slice, {7, 3, 2, 0, 6, 1}, 1, T_EXACT},
    {"slice", b_slice, {2, 3, 31, 2, 0, 17}, 1, T_EXACT},
    {"slice", b_slice, {2, 3, 31, 2, 4, 0}, 0, T_EXACT},
    /* reductions: shape, axis, keepdim */
    {"sum", b_reduce, {2, 37, 19, 0, 0, -1, 0}, 1, T_DEF},
    {"sum", b_reduce, {3, 4, 7, 9, 0, 0, 0}, 1, T_DEF},
    {"sum", b_reduce, {3, 4, 7, 9, 0, 1, 1}, 1, T_DEF},
    {"sum", b_reduce, {3, 4, 7, 9, 0, 2, 0}, 1, T_DEF},
    {"sum", b_reduce, {1, 1 << 20, 0, 0, 0, -1, 1}, 0, T_DEF},
    {"sum", b_reduce, {2, 3, 0, 0, 0, 1, 0}, 0, T_DEF},
    {"mean", b_reduce, {2, 37, 19, 0, 0, -1, 0}, 1, T_DEF},
    {"mean", b_reduce, {3, 4, 7, 9, 0, 1, 0}, 1, T_DEF},
    {"mean", b_reduce, {2, 1, 1, 0, 0, 0, 1}, 1, T_DEF},
    /* dropout: shape, p in percent */
    {"dropout", b_dropout, {2, 33, 31, 0, 0, 30}, 1, T_EXACT},
    {"dropout", b_dropout, {1, 1000, 0, 0, 0, 0}, 1, T_EXACT},
    {"dropout", b_dropout, {1, 1, 0, 0, 0, 90}, 1, T_EXACT},
    /* cast: [p1, p2] from dtype p5 to p6 */
    {"cast", b_cast, {2, 13, 7, 0, 0, PDDE_F32, PDDE_F16}, 0, T_EXACT},
    {"cast", b_cast, {2, 13, 7, 0, 0, PDDE_F32, PDDE_BF16}, 0, T_EXACT},
    {"cast", b_cast, {2, 61, 67, 1, 0, PDDE_F32, PDDE_F16}, 0, T_EXACT},
    {"cast", b_cast, {2, 13, 7, 0, 0, PDDE_F32, PDDE_I32}, 0, T_EXACT},
    {"cast", b_cast, {2, 13, 7, 0, 0, PDDE_F32, PDDE_I64}, 0, T_EXACT},
    {"cast", b_cast, {2, 13, 7, 0, 0, PDDE_F16, PDDE_F32}, 0, T_EXACT},
    {"cast", b_cast, {2, 13, 7, 0, 0, PDDE_BF16, PDDE_F32}, 0, T_EXACT},
    {"cast", b_cast, {2, 13, 7, 0, 0, PDDE_I32, PDDE_F32}, 0, T_EXACT},
    {"cast", b_cast, {2, 3, 5, 0, 0, PDDE_I64, PDDE_F16}, 0, T_EXACT},
    {"cast", b_cast, {2, 0, 5, 0, 0, PDDE_F32, PDDE_F16}, 0, T_EXACT},
    /* large enough for the CPU's threads and vector loops (and a tail of 3 past the last vector) */
    {"cast", b_cast, {2, 129, 131, 0, 0, PDDE_F32, PDDE_BF16}, 0, T_EXACT},
    {"cast", b_cast, {2, 129, 131, 0, 0, PDDE_BF16, PDDE_F32}, 0, T_EXACT},
    {"cast", b_cast, {2, 129, 131, 1, 0, PDDE_F32, PDDE_F16}, 0, T_EXACT},
    {"cast", b_cast, {2, 129, 131, 0, 0, PDDE_F16, PDDE_F32}, 0, T_EXACT},
    /* composites */
    {"attention", b_attention, {2, 3, 16, 8}, 1, T_DEF},
    {"attention", b_attention, {1, 1, 5, 3}, 1, T_DEF},
    {"attention", b_attention, {1, 2, 70, 4}, 1, T_DEF},
    {"attention_unfused", b_attention, {2, 3, 16, 8, 1}, 1, T_DEF}, /* (not an op name: any node on the device counts) */
    {"adamw_update", b_mlp, {1}, 3, T_DEF},
    {"sgd_update", b_mlp, {0}, 3, T_DEF},
    {"adamw_update", b_mlp_bf16, {1}, 3, T_LOWP},
    {"sgd_update", b_mlp_bf16, {0}, 3, T_LOWP},
    {"bias_gelu_grads", b_mlp_bf16_grads, {1}, 3, T_LOWP}, /* (not an op name) */
    {"layernorm_copy", b_layernorm_copy, {0}, 1, T_LOWP},  /* (not an op name) */
    {"bias_gelu_grads", b_bias_gelu_rows, {1031}, 1, T_LOWP},
    {"gelu_fused", b_mlp_gelu, {0}, 3, T_DEF},   /* (not an op name) */
    {"gelu_fused", b_mlp_gelu, {0, 1}, 3, T_LOWP},
    /* fused kernels: shape, the last dim is the bias's (131 x 257: several CPU threads' rows) */
    {"bias_gelu", b_bias_gelu, {3, 2, 3, 257}, 1, T_DEF},
    {"bias_gelu", b_bias_gelu, {2, 131, 257}, 1, T_DEF},
    {"bias_gelu", b_bias_gelu, {1, 1}, 1, T_DEF},
    {"bias_gelu", b_bias_gelu, {2, 0, 5}, 0, T_DEF},
    /* Mixture-of-Experts (not an op name: the layer's nodes the device runs count) {N, C, F, E, k, cap%, flags, trans_b} */
    {"moe_layer", b_moe, {37, 19, 23, 8, 2, 0, 0, 0}, 1, T_MM},
    {"moe_layer", b_moe, {64, 16, 33, 4, 2, 100, 0, 1}, 1, T_MM},
    {"moe_layer", b_moe, {17, 8, 5, 5, 1, 0, PDDE_MOE_SIGMOID | PDDE_MOE_NO_NORMALIZE, 0}, 1, T_MM},
    {"moe_layer", b_moe, {29, 12, 7, 4, 2, -1, 0, 1}, 1, T_MM},
    /* skewed: every token to expert 0 (the others none); to experts 0 and 1; over a capacity (15 tokens of each dropped) */
    {"moe_layer", b_moe, {40, 8, 9, 6, 1, 0, MOE_SKEW, 0}, 1, T_MM},
    {"moe_layer", b_moe, {33, 8, 9, 5, 2, 0, MOE_SKEW | PDDE_MOE_SIGMOID, 1}, 1, T_MM},
    {"moe_layer", b_moe, {40, 8, 9, 4, 2, 125, MOE_SKEW, 0}, 1, T_MM},
    {"moe_layer", b_moe, {24, 8, 9, 4, 1, -1, MOE_SKEW, 0}, 1, T_MM},
    /* the grouped GEMMs over several 64-row and 64-column tiles an expert */
    {"moe_layer", b_moe, {300, 70, 80, 8, 2, 0, 0, 0}, 1, T_MM},
    /* bf16: dropless; a capacity with w2 transposed; by expert; skewed; several tiles an expert */
    {"moe_layer", b_moe, {37, 19, 23, 8, 2, 0, MOE_BF16, 0}, 1, T_LOWP},
    {"moe_layer", b_moe, {64, 16, 33, 4, 2, 100, MOE_BF16, 1}, 1, T_LOWP},
    {"moe_layer", b_moe, {29, 12, 7, 4, 2, -1, MOE_BF16, 1}, 1, T_LOWP},
    {"moe_layer", b_moe, {40, 8, 9, 4, 2, 125, MOE_SKEW | MOE_BF16, 0}, 1, T_LOWP},
    {"moe_layer", b_moe, {300, 70, 80, 8, 2, 0, MOE_BF16, 0}, 1, T_LOWP},
    /* PDDE_CUDA_LT_LOWP_BIAS=1: widths multiples of 8 (cublasLt's bf16 alignment) and odd ones as above */
    {"matmul_bias", b_matmul_bias_lowp, {0, 33, 24, 40, 0, PDDE_BF16}, 1, T_LOWP_BIAS},
    {"matmul_bias", b_matmul_bias_lowp, {2, 17, 16, 24, 1, PDDE_BF16}, 1, T_LOWP_BIAS},
    {"matmul_bias", b_matmul_bias_lowp, {0, 19, 32, 48, 0, PDDE_F16}, 1, T_LOWP_BIAS},
    {"matmul_bias", b_matmul_bias_lowp, {0, 33, 19, 37, 0, PDDE_BF16}, 1, T_LOWP_BIAS},
    {"gelu_fused", b_mlp_gelu, {0, 1, 1}, 3, T_LOWP_BIAS},
    /* cross_entropy_fused's cases by k_ce_staged {N, C, V, compute dtype, all targets ignored, f32 logits}: the element
     * path, 16-byte loads, every target ignored, an f32 row past CUDA's 48 KiB of shared memory without the attribute,
     * the GPT-2 vocabulary in bf16 */
    {"cross_entropy_staged", b_cross_entropy_staged, {9, 0, 37, 0}, 1, T_DEF},
    {"cross_entropy_staged", b_cross_entropy_staged, {33, 0, 1000, 0}, 1, T_DEF},
    {"cross_entropy_staged", b_cross_entropy_staged, {4, 0, 7, 0, 1}, 1, T_DEF},
    {"cross_entropy_staged", b_cross_entropy_staged, {3, 0, 20000, 0}, 1, T_DEF},
    {"cross_entropy_staged", b_cross_entropy_staged, {33, 7, 1000, PDDE_BF16}, 1, T_LOWP},
    {"cross_entropy_staged", b_cross_entropy_staged, {5, 11, 304, PDDE_F16}, 1, T_LOWP},
    {"cross_entropy_staged", b_cross_entropy_staged, {17, 9, 96, PDDE_BF16, 0, 1}, 1, T_LOWP},
    {"cross_entropy_staged", b_cross_entropy_staged, {4, 8, 50304, PDDE_BF16}, 1, T_LOWP},
    /* AdamW by k_adamw_vec {1, compute dtype, C, F, V}: w1 of 2 and 6 chunks (run_case's AdamW eps keeps the backward's
     * round-off from steering a step; tests/mem_emu.cpp checks the kernel and its bf16 copies bit for bit) */
    {"adamw_vec", b_adamw_vec, {1, 0, 13, 331, 7}, 3, T_DEF},
    {"adamw_vec", b_adamw_vec, {1, 0, 24, 1000, 9}, 3, T_DEF},
    /* bias_gelu by k_bias_gelu2 {ndim, shape..}: past 4 rows a thread and 1024 columns a block, a width not a multiple
     * of 4 (declined); {0, R, F}: bf16 outputs */
    {"bias_gelu2", b_bias_gelu2, {2, 1031, 1028}, 1, T_DEF},
    {"bias_gelu2", b_bias_gelu2, {3, 2, 3, 256}, 1, T_DEF},
    {"bias_gelu2", b_bias_gelu2, {2, 131, 257}, 1, T_DEF},
    {"bias_gelu2", b_bias_gelu2, {2, 9, 3072}, 1, T_DEF},
    {"bias_gelu2", b_bias_gelu2, {0, 1031, 20}, 1, T_LOWP},
    {"bias_gelu2", b_bias_gelu2, {0, 33, 3072}, 1, T_LOWP},
    /* layernorm by the warp-per-row kernels {form, R, C}: C a multiple of 4 (16-byte loads) or not, R not a multiple of
     * a group's rows, several groups (dgamma's partial sums), C = 1, C = 768 (the narrowest instance's most), 769 (the
     * next instance); the wider instances' cases follow */
    {"layernorm2", b_layernorm2, {0, 1031, 64}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {0, 7, 33}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {0, 2, 1}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {0, 300, 768}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {0, 5, 769}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {1, 1031, 36}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {1, 7, 33}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {2, 300, 100}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {2, 7, 33}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {3, 9, 132}, 1, T_LOWP},
    {"layernorm2", b_layernorm2, {3, 9, 131}, 1, T_LOWP},
    {"layernorm2", b_layernorm2, {4, 33, 64}, 1, T_LOWP},
    {"layernorm2", b_layernorm2, {0, 37, 1024}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {1, 13, 1025}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {2, 21, 1600}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {0, 11, 1665}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {1, 19, 2048}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {0, 5, 2049}, 1, T_DEF},
    {"layernorm2", b_layernorm2, {3, 9, 1600}, 1, T_LOWP},
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* ------------------------------------------------------------------------------------------------
 * Inputs: deterministic per (case, leaf name), identical for both sessions. */

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* lowp_bias_model_check: the f32 leaf "bias" filled with its values rounded to this dtype (bf16, f16; 0: not) */
static pdde_dtype g_bias_rounded;

/* PDDE_TEST_SEED=N salts every input seed (default 0, what CI runs): a sweep over salts shows which bounds hold for
 * the op and which only for one draw */
static uint64_t g_seed_salt;

static uint64_t fnv1a(uint64_t h, const void *bytes, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ ((const uint8_t *)bytes)[i]) * 1099511628211ull;
    return h;
}

/* A case's seed from its identity (the op under test and its parameters, little-endian), never from its place in the
 * table: a case inserted anywhere leaves every other case's inputs as they were. (Cases with the same op and
 * parameters but other builders, adamw_update's f32 and bf16 MLPs, draw the same values; their graphs differ.) */
static uint64_t case_seed(const op_case *c) {
    uint64_t h = fnv1a(1469598103934665603ull, c->op, strlen(c->op) + 1);
    for (int i = 0; i < 8; i++) {
        uint8_t le[8];
        for (int b = 0; b < 8; b++) le[b] = (uint8_t)((uint64_t)c->p[i] >> (8 * b));
        h = fnv1a(h, le, sizeof le);
    }
    return fnv1a(h, &g_seed_salt, sizeof g_seed_salt);
}

/* the seed of a check outside the table (its own fixed number) */
static uint64_t fixed_seed(int id) {
    uint64_t h = fnv1a(1469598103934665603ull, "fixed", 6);
    h = fnv1a(h, &id, sizeof id);
    return fnv1a(h, &g_seed_salt, sizeof g_seed_salt);
}

/* run_on's seed: case_seed for a case of the table, fixed_seed for the checks past it */
static uint64_t input_seed(int case_index) {
    return case_index >= 0 && case_index < N_CASES ? case_seed(&cases[case_index]) : fixed_seed(case_index);
}

/* Every case's seed again from a copy of the table reversed and with a case put first: each the same as in place (the
 * seed does not depend on the case's index or address), and two cases of another op or parameters not the same. */
static void test_seeds_by_identity(void) {
    op_case *moved = malloc((size_t)(N_CASES + 1) * sizeof *moved);
    if (!moved) { CHECK(0, "malloc"); return; }
    moved[0] = (op_case){"inserted", b_matmul, {3, 5, 7, 0, 0, 0, 0}, 1, T_MM};
    for (int ci = 0; ci < N_CASES; ci++) moved[1 + ci] = cases[N_CASES - 1 - ci];
    int moved_seeds = 0, shared = 0;
    for (int ci = 0; ci < N_CASES; ci++) {
        moved_seeds += case_seed(&moved[N_CASES - ci]) != case_seed(&cases[ci]);
        for (int cj = 0; cj < ci; cj++)
            shared += case_seed(&cases[cj]) == case_seed(&cases[ci]) &&
                      (strcmp(cases[cj].op, cases[ci].op) || memcmp(cases[cj].p, cases[ci].p, sizeof cases[ci].p));
    }
    CHECK(moved_seeds == 0, "%d of %d cases draw other inputs when the table is reordered (seeded by position, not identity)", moved_seeds,
          N_CASES);
    CHECK(shared == 0, "%d pairs of distinct cases share a seed", shared);
    free(moved);
}

/* a leaf's values from the seed and the leaf's name */
static void fill_leaf(const pdde_tensor *t, uint64_t seed, void *buf) {
    uint64_t s = seed;
    for (const char *c = t->name; *c; c++) s = (s ^ (uint8_t)*c) * 1099511628211ull;
    int64_t n = pdde_tensor_numel(t);
    int round_bias = g_bias_rounded && t->dtype == PDDE_F32 && !strcmp(t->name, "bias");
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = mix(&s);
        double u = (double)(r >> 11) / 9007199254740992.0; /* [0, 1) */
        float f = (float)(2.0 * u - 1.0);
        if (round_bias) f = g_bias_rounded == PDDE_BF16 ? pdde_bf16_to_f32(pdde_f32_to_bf16(f)) : pdde_f16_to_f32(pdde_f32_to_f16(f));
        switch (t->dtype) {
        case PDDE_F32:
            if (!strcmp(t->name, "att_mask")) { /* (element (b, 0, t, j)) */
                int64_t T = g_att_T, row = i / T, tq = row % T, j = i % T, lo = g_att_starts[row];
                lo = lo < 0 ? 0 : lo > tq ? tq : lo;
                ((float *)buf)[i] = j < lo ? -1e9f : 0.0f;
                break;
            }
            ((float *)buf)[i] = strcmp(t->name, "moe_skew") ? f : i == 0 ? 200.0f : i == 1 ? 100.0f : 0.0f;
            break;
        case PDDE_F16: ((uint16_t *)buf)[i] = pdde_f32_to_f16(f * 100.0f); break;
        case PDDE_BF16: ((uint16_t *)buf)[i] = pdde_f32_to_bf16(f * 100.0f); break;
        case PDDE_I64: ((int64_t *)buf)[i] = (int64_t)(r % 200001) - 100000; break;
        case PDDE_I32:
            if (!strncmp(t->name, "tgt_none", 8)) ((int32_t *)buf)[i] = -1;
            else if (!strncmp(t->name, "tgt", 3)) ((int32_t *)buf)[i] = (r % 7 == 0) ? -1 : (int32_t)((r >> 8) % (uint64_t)g_vocab);
            else if (!strncmp(t->name, "ids", 3)) ((int32_t *)buf)[i] = (int32_t)((r >> 8) % (uint64_t)g_vocab);
            else if (!strcmp(t->name, "att_starts")) ((int32_t *)buf)[i] = g_att_starts[i];
            else ((int32_t *)buf)[i] = (int32_t)(r % 2001) - 1000;
            break;
        default: break;
        }
    }
}

/* ------------------------------------------------------------------------------------------------
 * One case on one device: the values of the checked tensors, converted to double. */

typedef struct {
    int n;
    const pdde_tensor *t[16];
    double *v[16];
    int64_t len[16];
} results;

static void results_free(results *r) {
    for (int i = 0; i < r->n; i++) free(r->v[i]);
    memset(r, 0, sizeof *r);
}

static double to_double(const pdde_tensor *t, const void *buf, int64_t i) {
    switch (t->dtype) {
    case PDDE_F32: return ((const float *)buf)[i];
    case PDDE_F16: return pdde_f16_to_f32(((const uint16_t *)buf)[i]);
    case PDDE_BF16: return pdde_bf16_to_f32(((const uint16_t *)buf)[i]);
    case PDDE_I32: return ((const int32_t *)buf)[i];
    default: return (double)((const int64_t *)buf)[i];
    }
}

/* The layer of the suite's checking loss (checking_loss): run_on puts it on the CPU, so that the
 * device under test runs only the case's own ops and a wrong mul or sum there fails its own cases, not
 * every gradient check. */
enum { CHECKING_LOSS_LAYER = 1000 };
static int checking_loss_devices[CHECKING_LOSS_LAYER + 1];

/* Session params sp put the checking loss's layer on the CPU (the other layers on sp's device). */
static void checking_loss_on_cpu(pdde_session_params *sp) {
    checking_loss_devices[CHECKING_LOSS_LAYER] = 0;
    for (int l = 0; l < CHECKING_LOSS_LAYER; l++) checking_loss_devices[l] = -1;
    sp->layer_devices = checking_loss_devices;
    sp->n_layer_devices = CHECKING_LOSS_LAYER + 1;
}

/* sum(y * dy_weights) on the CPU (with its backward: autodiff keeps a node's layer), so that every
 * element of y gets a gradient of its own. */
static pdde_tensor *checking_loss(pdde_graph *g, pdde_tensor *y) {
    pdde_graph_set_layer(g, CHECKING_LOSS_LAYER);
    pdde_tensor *w = pdde_input(g, "dy_weights", PDDE_F32, y->ndim, y->shape);
    pdde_tensor *loss = pdde_sum(g, pdde_mul(g, y, w), -1, 0);
    pdde_graph_set_layer(g, -1);
    return loss;
}

/* Runs g on device with the case's inputs; reads the tensors of checks. steps > 0: training steps. A device other
 * than the CPU must run a node of op there (NULL: the table case's op; past the table, any node), else UNSUPPORTED. */
/* How many nodes of the session run `op` on `device` (op NULL or not an op's name, as "attention": any
 * node that computes there). A device that does not run the op under test gets it moved to the CPU
 * (the fallback), so a case counts for the device only where this is not 0. */
static int nodes_on(const pdde_session *s, int device, const char *op) {
    int n = 0, named = 0;
    for (int o = 0; o < PDDE_OP_COUNT && op; o++) named |= !strcmp(pdde_op_name((pdde_op)o), op);
    for (int i = 0; i < pdde_session_node_count(s); i++) {
        const pdde_tensor *t = pdde_session_node(s, i);
        if (t->device != device || t->op == PDDE_OP_NONE || t->op == PDDE_OP_COPY) continue;
        n += named ? !strcmp(pdde_op_name(t->op), op) : 1;
    }
    return n;
}

/* MoE nodes of the last run_on's session not on its device (the backends with MoE kernels run them all) */
static int g_moe_elsewhere;
/* cross_entropy_back nodes of the last run_on's session that compute (lowering's PDDE_FUSE_CE leaves none), and
 * cross-entropies on its device that write dlogits (PDDE_P_CE_DLOGITS: where the device takes the fused form) */
static int g_ce_back, g_ce_fused;
/* the ops of the last run_on's session on its device (not the CPU), each once between spaces: a case fails for a
 * wrong op of the device that runs in its graph, not only for the op it is named after */
static char g_device_ops[256];
/* the backends that run the MoE ops on the device: OpenCL, and CUDA with PDDE_CUDA_MOE=1 */
static bool moe_kernels_on(const char *backend) {
    const char *env = getenv("PDDE_CUDA_MOE");
    return !strcmp(backend, "opencl") || (!strcmp(backend, "cuda") && env && env[0] && strcmp(env, "0") != 0);
}

/* the backends that run rope on the device: OpenCL, and CUDA with PDDE_CUDA_ROPE=1 (Level Zero leaves it to the CPU) */
static bool rope_kernels_on(const char *backend) {
    const char *env = getenv("PDDE_CUDA_ROPE");
    return !strcmp(backend, "opencl") || (!strcmp(backend, "cuda") && env && env[0] && strcmp(env, "0") != 0);
}

static pdde_status run_on(pdde_context *ctx, pdde_graph *g, int device, int case_index, const char *op, int mode, int steps,
                          const pdde_tensor *const *checks, int n_checks, results *out, double *perf_s, int perf_iters) {
    memset(out, 0, sizeof *out); /* (freed by the caller whatever happens) */
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    checking_loss_on_cpu(&sp);
    pdde_session *s;
    pdde_status st = pdde_session_init(g, &sp, &s);
    if (st) return st;
    if (g_loss_tokens && (st = pdde_session_set_loss_tokens(s, g_loss_tokens))) return pdde_session_free(s), st;
    /* (op NULL: a table case's op; the comparisons outside the table name theirs, or NULL: any node counts) */
    if (!op && case_index >= 0 && case_index < N_CASES) op = cases[case_index].op;
    if (device != 0 && !nodes_on(s, device, op)) {
        pdde_session_free(s);
        /* the op under test would run on the CPU: nothing to compare */
        return pdde_error(ctx, PDDE_ERR_UNSUPPORTED, "no %s node runs on device %d: the session left %s to the CPU", op ? op : "", device,
                          op ? "it" : "the graph");
    }
    g_moe_elsewhere = 0, g_ce_back = 0, g_ce_fused = 0, g_device_ops[0] = '\0';
    for (int i = 0; i < pdde_session_node_count(s) && device != 0; i++) { /* the ops placed on the device, each once */
        const pdde_tensor *t = pdde_session_node(s, i);
        char name[40];
        snprintf(name, sizeof name, " %s ", pdde_op_name(t->op));
        if (t->device != device || t->op == PDDE_OP_NONE || t->op == PDDE_OP_COPY || strstr(g_device_ops, name)) continue;
        size_t len = strlen(g_device_ops);
        snprintf(g_device_ops + len - (len > 0), sizeof g_device_ops - len + (len > 0), "%s", name); /* (" a b c ": each name between spaces) */
    }
    for (int i = 0; i < pdde_session_node_count(s); i++) {
        const pdde_tensor *t = pdde_session_node(s, i);
        g_moe_elsewhere += t->op >= PDDE_OP_MOE_TOPK && t->op <= PDDE_OP_MOE_AUX_LOSS_BACK && t->device != device;
        g_ce_back += t->op == PDDE_OP_CROSS_ENTROPY_BACK && !pdde_op_i32(t, PDDE_P_CE_DLOGITS);
        g_ce_fused += t->op == PDDE_OP_CROSS_ENTROPY && pdde_op_i32(t, PDDE_P_CE_DLOGITS) && t->device == device;
    }
    size_t max = 1;
    int n = pdde_graph_tensor_count(g);
    for (int i = 0; i < n; i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_NONE && pdde_tensor_nbytes(t) > max) max = pdde_tensor_nbytes(t);
    }
    void *buf = malloc(max);
    for (int i = 0; i < n && st == PDDE_OK && buf; i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op != PDDE_OP_NONE || !(t->flags & (PDDE_TENSOR_INPUT | PDDE_TENSOR_PARAM))) continue;
        if (!pdde_session_tensor(s, t)) continue; /* not scheduled */
        fill_leaf(t, input_seed(case_index), buf);
        st = pdde_session_write(s, t, buf, pdde_tensor_nbytes(t));
    }
    for (int k = 0; k < (steps > 0 ? steps : 1) && st == PDDE_OK; k++) st = pdde_session_run(s, (pdde_run_mode)mode);
    /* the session put the nodes there because the device's supports_op took them: a device that then says it
     * does not run one fails every step of a training run, so it is a failure, not an op it does not run */
    if (st == PDDE_ERR_UNSUPPORTED && device != 0) {
        char why[512];
        snprintf(why, sizeof why, "%s", pdde_last_error(ctx));
        st = pdde_error(ctx, PDDE_ERR_BACKEND, "device %d's supports_op took the nodes of ops [%s], but running them returned UNSUPPORTED (%s)",
                        device, g_device_ops, why);
    }
    if (st == PDDE_OK && perf_s) {
        for (int k = 0; k < 2 && st == PDDE_OK; k++) st = pdde_session_run(s, (pdde_run_mode)mode); /* warm */
        double t0 = now_s();
        int it = 0;
        while (st == PDDE_OK && (it < perf_iters || now_s() - t0 < 0.2)) {
            st = pdde_session_run(s, (pdde_run_mode)mode);
            it++;
        }
        *perf_s = (now_s() - t0) / it;
    }
    for (int c = 0; c < n_checks && st == PDDE_OK; c++) {
        const pdde_tensor *t = checks[c];
        size_t nb = pdde_tensor_nbytes(t);
        void *tmp = malloc(nb ? nb : 1);
        st = pdde_session_read(s, t, tmp, nb);
        int64_t len = pdde_tensor_numel(t);
        double *v = malloc((size_t)(len ? len : 1) * sizeof *v);
        for (int64_t i = 0; i < len; i++) v[i] = to_double(t, tmp, i);
        free(tmp);
        out->t[out->n] = t, out->v[out->n] = v, out->len[out->n] = len, out->n++;
    }
    free(buf);
    pdde_session_free(s);
    return st;
}

/* normalised mean squared error (ggml's check); a NaN/inf where the reference is finite is infinite */
static double nmse(const double *a, const double *ref, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(ref[i])) {
            if (isfinite(a[i]) != isfinite(ref[i]) || (isnan(a[i]) != isnan(ref[i]))) return INFINITY;
            continue;
        }
        double d = a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    if (num == 0) return 0;
    return num / (den > 0 ? den : 1e-30);
}

typedef struct {
    pdde_context *ctx;
    const char *backend, *op;
    int perf, verbose;
    int strict; /* an op the device does not run is a failure (the built-in GPU backends run them all) */
    int op_has_cases; /* op is some case's op under test */
} options;

static int n_unsupported; /* cases whose op the device under test does not run */

static void case_label(const op_case *c, char *buf, size_t n) {
    int k = snprintf(buf, n, "%s(", c->op);
    for (int i = 0; i < 8 && k < (int)n; i++) k += snprintf(buf + k, n - (size_t)k, i ? ",%lld" : "%lld", (long long)c->p[i]);
    if (k < (int)n) snprintf(buf + k, n - (size_t)k, ")");
}

/* Whether a node of g runs op name (the checking loss's nodes left out). */
static bool graph_has_op(pdde_graph *g, const char *name) {
    for (int i = 0; i < pdde_graph_tensor_count(g); i++)
        if (pdde_graph_tensor(g, i)->layer != CHECKING_LOSS_LAYER && !strcmp(pdde_op_name(pdde_graph_tensor(g, i)->op), name)) return true;
    return false;
}

/* bytes read and written by the nodes of a forward graph (for GB/s) and matmul flops */
static void graph_traffic(pdde_graph *g, double *bytes, double *flops) {
    *bytes = 0, *flops = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_NONE || t->op == PDDE_OP_RESHAPE) continue;
        *bytes += (double)pdde_tensor_nbytes(t);
        for (int k = 0; k < t->nsrc; k++) *bytes += (double)pdde_tensor_nbytes(t->src[k]);
        if (t->op == PDDE_OP_MATMUL) {
            const pdde_tensor *a = t->src[0];
            double K = (double)a->shape[a->ndim - (pdde_op_i32(t, PDDE_P_MATMUL_TRANS_A) ? 2 : 1)];
            *flops += 2.0 * (double)pdde_tensor_numel(t) * K;
        }
    }
}

/* PDDE_CUDA_LT_LOWP_BIAS as the run's environment set it ("0" where it did not): each case starts from it, and
 * b_matmul_bias_lowp and gelu_fused's p2 set it for theirs (cuda reads it when a session's stream is made) */
static char g_lowp_bias_outside[8] = "0";
/* PDDE_CUDA_LN2 and PDDE_OPENCL_LN2 as the run's environment set them, likewise (the layernorm2 cases set theirs): so
 * `PDDE_CUDA_LN2=1 test_backend_ops --op layernorm` runs every layernorm case by the warp-per-row kernels */
static char g_ln2_outside[2][8] = {"0", "0"};

/* A case's bound on its forward NMSE: its own, or T_LOWP_BIAS where PDDE_CUDA_LT_LOWP_BIAS=1 adds its bias rounded to
 * a bf16 / f16 output (matmul_bias, gelu_fused under a compute dtype; the switch from outside or from the builder) */
static double case_tolerance(const op_case *c) {
    const char *lb = getenv("PDDE_CUDA_LT_LOWP_BIAS");
    int lowp = c->build == b_matmul_bias || c->build == b_matmul_bias_lowp ? c->p[5] != 0 : c->build == b_mlp_gelu ? c->p[1] != 0 : 0;
    return lowp && lb && !strcmp(lb, "1") && c->tol < T_LOWP_BIAS ? T_LOWP_BIAS : c->tol;
}

/* b_matmul_bias_lowp's cases on the CPU: the graph again with its bias rounded to the compute dtype (what cuda's cublasLt
 * adds under PDDE_CUDA_LT_LOWP_BIAS=1) against the reference ref: within T_LOWP_BIAS, and not 0 (the rounding reaches
 * the output: the bound is met by the rounding it is for, not by a copy of the reference) */
static void lowp_bias_model_check(const options *o, pdde_graph *g, int ci, const pdde_tensor *const *checks, const results *ref,
                                  const char *label) {
    results rounded;
    pdde_dtype dt = (pdde_dtype)cases[ci].p[5];
    g_bias_rounded = dt;
    pdde_status st = run_on(o->ctx, g, 0, ci, NULL, PDDE_RUN_FORWARD, 1, checks, 1, &rounded, NULL, 0);
    g_bias_rounded = PDDE_F32;
    double e = st || rounded.n < 1 ? INFINITY : nmse(rounded.v[0], ref->v[0], rounded.len[0]), tol = case_tolerance(&cases[ci]);
    CHECK(e > 0 && e <= tol, "%s: the bias rounded to %s moves the output by an NMSE of %.3g, not in (0, %.3g]", label, pdde_dtype_name(dt), e,
          tol);
    if (o->verbose) printf("  %-10s %-44s %-5s NMSE %-9.3g (the bias rounded to the compute dtype, on the CPU)\n", "model", label, "fwd", e);
    results_free(&rounded);
}

/* The gradients' bound: 10x the forward's (at least 1e-9), but for an rmsnorm of rows of one element. There (C = 1)
 * dx = rr (dg - xhat (dg xhat)) = dg eps / (x^2 + eps)^1.5 (dg = dy g) is all cancellation: xhat^2 = x^2 rr^2 carries
 * rsqrt's error twice, x rr's and the two products' once, |eta| <= 6u (rsqrt within 1 ulp) to 8u (2 ulp, OpenCL's and
 * CUDA's bound), and 1 - xhat^2 (1 + eta) is off by eta x^2 / eps relative. Two devices' dx (one element: the NMSE is
 * the relative difference squared) differ by up to (14u x^2 / eps)^2 = 7e-3 at |x| = 1, eps 1e-5; typically (errors
 * of ~3u, x uniform in [-1, 1]) by ~6e-5. 1e-4 was a typical value, not a bound: a device whose rsqrt rounds
 * otherwise (CUDA) crosses it on some draws with a correct kernel. The worst case is the bound; a wrong dx (0, its
 * sign, no eps) is off by an NMSE of 1 or more. */
static double grad_tolerance(const op_case *c, double forward) {
    if (c->build == b_norm && !strcmp(c->op, "rmsnorm") && c->p[c->p[0]] == 1) return 1e-2;
    return 10 * forward > 1e-9 ? 10 * forward : 1e-9;
}

/* mode 0: forward output; 1: gradients (forward + backward); 2: optimizer steps */
static void run_case(const options *o, int ci, int device, int mode) {
    const op_case *c = &cases[ci];
    char label[160];
    case_label(c, label, sizeof label);
    pdde_graph *g;
    if (pdde_graph_init(o->ctx, &g) != PDDE_OK) { CHECK(0, "graph_init"); return; }
    setenv("PDDE_FUSE_EPILOGUE", "0", 1), setenv("PDDE_FUSE_GRAD", "0", 1), setenv("PDDE_BF16_LOGITS", "0", 1), setenv("PDDE_FUSE_ADD_LN", "0", 1); /* (builders set them) */
    setenv("PDDE_BF16_GRADS", "0", 1), setenv("PDDE_FUSE_GELU", "0", 1), setenv("PDDE_FUSE_CE", "0", 1);
    mem_kernels("COLSUM2", "0"), mem_kernels("ADAMW_CHUNKS", "0"), mem_kernels("CE1", "0"), mem_kernels("ADAMW_VEC", "0"), mem_kernels("GELU2", "0");
    setenv("PDDE_CUDA_LN2", g_ln2_outside[0], 1), setenv("PDDE_OPENCL_LN2", g_ln2_outside[1], 1);
    setenv("PDDE_CUDA_LT_LOWP_BIAS", g_lowp_bias_outside, 1);
    g_loss_tokens = 0;
    pdde_tensor *y = c->build(g, c);
    const pdde_tensor *checks[16];
    int n_checks = 0, run_mode = PDDE_RUN_FORWARD, steps = 1;
    if (y && mode == 0) {
        pdde_mark_output(y);
        checks[n_checks++] = y;
    } else if (y) {
        pdde_tensor *loss = y;
        if (!(y->flags & PDDE_TENSOR_LOSS)) {
            loss = checking_loss(g, y);
        }
        pdde_backward(g, loss);
        run_mode = PDDE_RUN_FORWARD_BACKWARD;
        if (!strcmp(c->op, "matmul_grad")) steps = 2; /* (the second pass adds to the first's gradients) */
        if (mode == 2) {
            pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
            op.lr = 0.05f;
            op.weight_decay = 0.1f;
            /* AdamW's step m^/(sqrt(v^) + eps) has a slope up to 1/eps in g: with the usual eps 1e-8 an element whose
             * gradient is within its round-off of 0 (f32 sums in another order: ~u sum|terms|; bf16: a term rounded to
             * its other neighbour) steps anywhere in +-lr, and one such element puts the parameters' NMSE near 1e-5
             * (adamw_chunks and adamw_vec over 16 salts: medians 3e-9 to 2e-7, worst 8e-5). eps 1e-3 sits below most
             * of these gradients (RMS ~6e-3 after clipping ~7000 elements to a norm of 0.5), so the step stays
             * normalised there, while a gradient error dg moves a parameter by at most lr dg / eps a step: f32 NMSE
             * under 2e-11, bf16 under 4e-8, over the same salts. */
            if (c->p[0]) op.clip_norm = 0.5f, op.eps = 1e-3f, pdde_optimizer_adamw(g, &op);
            else op.momentum = 0.9f, pdde_optimizer_sgd(g, &op);
            run_mode = PDDE_RUN_STEP;
            steps = 3;
        }
        /* The loss is checked where it is the case's own output, in its gradients' run. Not sum(y * dy_weights), made
         * here: a sum of signed terms whose relative error grows without bound as it nears 0 (y itself is checked
         * forward); nor after optimizer steps: the model nearly fits its 9 rows by then, and -log p_t = logsumexp(z) -
         * z_t of a loss near 0.01 loses u max|z| to cancellation, a relative error near 1e-4 (bf16 logits: 2^-9 max|z|),
         * while the parameters the steps compute are checked directly. */
        if (loss == y && mode == 1) checks[n_checks++] = loss;
        for (int i = 0; i < pdde_graph_tensor_count(g) && n_checks < 16; i++) {
            pdde_tensor *t = pdde_graph_tensor(g, i);
            if ((t->flags & PDDE_TENSOR_PARAM) && t->grad) checks[n_checks++] = mode == 2 ? t : t->grad;
        }
    }
    if (pdde_graph_status(g) != PDDE_OK) {
        CHECK(0, "%s: graph: %s", label, pdde_last_error(o->ctx));
        pdde_graph_free(g);
        return;
    }
    /* --op NAME: the cases of op NAME; an op no case is of (a backward op): the cases whose graph runs it */
    if (o->op && strcmp(o->op, c->op) && (o->op_has_cases || !graph_has_op(g, o->op))) { pdde_graph_free(g); return; }
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    const char *what = mode == 0 ? "fwd" : mode == 1 ? "grad" : "steps";
    if (o->perf) {
        double sec = 0, bytes, flops;
        results r;
        graph_traffic(g, &bytes, &flops);
        pdde_status st = run_on(o->ctx, g, device, ci, NULL, run_mode, steps, checks, n_checks, &r, &sec, 5);
        results_free(&r);
        if (st) printf("%-10s %-44s %-5s error %s\n", props.backend, label, what, pdde_last_error(o->ctx));
        else if (flops > 0) printf("%-10s %-44s %-5s %9.3f ms %9.2f GFLOP/s\n", props.backend, label, what, sec * 1e3, flops / sec * 1e-9);
        else printf("%-10s %-44s %-5s %9.3f ms %9.2f GB/s\n", props.backend, label, what, sec * 1e3, bytes / sec * 1e-9);
        pdde_graph_free(g);
        return;
    }
    results ref, got;
    double t_case = now_s();
    pdde_status st = run_on(o->ctx, g, 0, ci, NULL, run_mode, steps, checks, n_checks, &ref, NULL, 0);
    if (st) {
        CHECK(0, "%s %s: cpu reference failed: %s (%s)", label, what, pdde_status_str(st), pdde_last_error(o->ctx));
        results_free(&ref);
        pdde_graph_free(g);
        return;
    }
    st = run_on(o->ctx, g, device, ci, NULL, run_mode, steps, checks, n_checks, &got, NULL, 0);
    if (st == PDDE_ERR_UNSUPPORTED && (!o->strict || (c->build == b_rope && !rope_kernels_on(props.backend)))) {
        n_unsupported++; /* the device does not run this op: a partial backend (its fallback is tested elsewhere) */
        if (o->verbose) printf("  %-10s %-44s %-5s not supported (runs on the CPU)\n", props.backend, label, what);
    } else if (st) {
        CHECK(0, "%s %s on %s: %s (%s)", label, what, props.name, pdde_status_str(st), pdde_last_error(o->ctx));
    } else {
        /* gradients pass through more ops (and the loss through a full reduction) */
        double base = case_tolerance(c), worst = 0, tol = mode == 0 ? base : grad_tolerance(c, base);
        const char *worst_name = "";
        for (int k = 0; k < got.n; k++) {
            double e = nmse(got.v[k], ref.v[k], got.len[k]);
            if (e > worst || k == 0) worst = e, worst_name = got.t[k]->name;
        }
        CHECK(worst <= tol, "%s %s on %s [%s]: NMSE %.3g > %.3g (%.4g times the bound); ops run on the device: [%s]", label, what, props.backend,
              worst_name, worst, tol, worst / tol, g_device_ops);
        /* (the built-in GPU backends take the fused form; a plugin may not, and then runs the two apart) */
        bool builtin_gpu = !strcmp(props.backend, "opencl") || !strcmp(props.backend, "cuda") || !strcmp(props.backend, "level_zero");
        if ((c->build == b_cross_entropy_fused || c->build == b_cross_entropy_staged) && mode == 1 && (builtin_gpu || g_ce_fused))
            CHECK(g_ce_back == 0 && g_ce_fused == 1, "%s %s on %s: %d cross_entropy_back nodes compute apart, %d fused on the device (PDDE_FUSE_CE=1)",
                  label, what, props.backend, g_ce_back, g_ce_fused);
        if (c->build == b_moe && moe_kernels_on(props.backend))
            CHECK(g_moe_elsewhere == 0, "%s %s on %s: %d MoE nodes left to the CPU", label, what, props.backend, g_moe_elsewhere);
        if (o->verbose) printf("  %-10s %-44s %-5s NMSE %-9.3g %6.2fs [%s]\n", props.backend, label, what, worst, now_s() - t_case, worst_name);
    }
    if (c->build == b_matmul_bias_lowp && mode == 0) lowp_bias_model_check(o, g, ci, checks, &ref, label);
    results_free(&ref);
    results_free(&got);
    pdde_graph_free(g);
}

/* ------------------------------------------------------------------------------------------------
 * Fused attention against the unfused reference (matmul, scale, causal softmax, matmul) on the CPU:
 * the output and the gradients of q, k and v, over shapes around the CPU's 128 x 128 tiles. */

static const int64_t attention_shapes[][4] = {
    {1, 1, 1, 4},    /* T = 1 */
    {2, 2, 1, 3},    /* T = 1, several heads */
    {1, 1, 67, 16},  /* one head, T not a multiple of the tile */
    {2, 12, 33, 8},  /* many heads */
    {1, 2, 130, 5},  /* two query and key tiles, the last of 2 rows */
    {3, 1, 128, 32}, /* exactly one tile */
    {1, 1, 300, 8},  /* three tiles */
    /* head sizes of the GPUs' tiled kernels (64-row groups, 16-row tiles in group memory) */
    {1, 1, 67, 64},  /* one head, T not a multiple of either tile */
    {2, 3, 130, 64}, /* many heads, three query tiles, the last of 2 rows */
    {1, 2, 75, 128}, /* D 128, two query tiles */
    {1, 1, 64, 128}, /* exactly one query tile */
    {1, 2, 200, 64}, /* four key tiles, the last of 8 rows */
    {2, 2, 260, 64}, /* three of CUDA flash2's 128-row groups (PDDE_FLASH2_VARIANT k128, q128), the last of 4 rows */
};

/* q, k, v [shape] -> sum(attention * w): fused or the unfused reference, under compute dtype dt (bf16
 * and f16: q, k, v converted, the gradients f32 into the f32 leaves); the checked tensors in checks */
static pdde_tensor *attention_graph(pdde_graph *g, const int64_t *s, bool fused, pdde_dtype dt, const pdde_tensor **checks) {
    pdde_tensor *q = pdde_param(g, "q", 4, s, 0.0f), *k = pdde_param(g, "k", 4, s, 0.0f), *v = pdde_param(g, "v", 4, s, 0.0f);
    pdde_graph_set_compute_dtype(g, dt);
    pdde_tensor *y = fused ? pdde_attention(g, q, k, v) : pdde_attention_unfused(g, q, k, v);
    pdde_graph_set_compute_dtype(g, PDDE_F32);
    pdde_tensor *loss = checking_loss(g, y);
    pdde_mark_output(y);
    pdde_backward(g, loss);
    checks[0] = y, checks[1] = q->grad, checks[2] = k->grad, checks[3] = v->grad;
    return loss;
}

/* The unfused reference graph gu on the CPU, then the fused graph gf on `device`, both from the inputs
 * of case ci (by leaf name): their n checked tensors into *ref and *got (got zeroed when ref fails). */
static pdde_status run_fused_and_reference(const options *o, pdde_graph *gf, pdde_graph *gu, int device, int ci, const char *op,
                                           const pdde_tensor **cf, const pdde_tensor **cu, int n, results *got, results *ref) {
    pdde_status st = run_on(o->ctx, gu, 0, ci, op, PDDE_RUN_FORWARD_BACKWARD, 1, cu, n, ref, NULL, 0);
    if (st == PDDE_OK) st = run_on(o->ctx, gf, device, ci, op, PDDE_RUN_FORWARD_BACKWARD, 1, cf, n, got, NULL, 0);
    else memset(got, 0, sizeof *got);
    return st;
}

/* A fused case the device under test declined (a plugin without the op: it ran on the CPU): counted as
 * such, its results and graphs freed: true. Otherwise false, nothing freed. */
static bool fused_case_declined(const options *o, pdde_status st, const char *label, results *got, results *ref, pdde_graph *gf, pdde_graph *gu) {
    if (st != PDDE_ERR_UNSUPPORTED || o->strict) return false;
    n_unsupported++;
    if (o->verbose) printf("  %-72s not supported (runs on the CPU)\n", label);
    results_free(got), results_free(ref);
    pdde_graph_free(gf), pdde_graph_free(gu);
    return true;
}

/* Whether every fused attention node of g (forward and backward) reads q, k, v of dtype dt */
static bool attention_reads(pdde_graph *g, pdde_dtype dt) {
    int n = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op != PDDE_OP_ATTENTION && t->op != PDDE_OP_ATTENTION_BACK) continue;
        for (int k = 0; k < 3; k++)
            if (t->src[k]->dtype != dt) return false;
        n++;
    }
    return n == 2;
}

/* Bound on the NMSE of the fused attention under compute dtype dt against the f32 unfused reference:
 * f32 differs by round-off only; bf16 / f16 by the rounding of q, k, v (and on the CPU's bf16 GEMMs of
 * P, dS and dO too), relative errors of about the unit roundoff u = 2^-8 / 2^-11 that two GEMMs in a
 * row add up: (2u)^2, 6.1e-5 and 9.5e-7; the gradients go through more (3u)^2, 1.4e-4 and 2.1e-6.
 * Measured at most 4.1e-6 / 1.2e-5 (bf16), 5.0e-8 / 9.4e-8 (f16): 10-20x below. */
static double attention_tolerance(pdde_dtype dt, bool gradient) {
    double u = dt == PDDE_BF16 ? 0x1p-8 : dt == PDDE_F16 ? 0x1p-11 : 0, c = gradient ? 3 : 2;
    return u ? (c * u) * (c * u) : 1e-10;
}

/* The GPU backends' attention paths (PDDE_ATTENTION; backends/gpu_dispatch.h): each is checked (flash2
 * on CUDA only: elsewhere it is flash). */
static const char *const attention_paths[] = {"rows", "unfused", "flash", "flash2"};

/* One case of a form of the fused attention: shape s (attention_shapes[si]), compute dtype dt. */
typedef void (*attention_case_fn)(const options *o, int device, const int64_t *s, int si, pdde_dtype dt, const char *label);

/* Runs a form's case (run_case) for every attention path of the device (PDDE_ATTENTION; the CPU has
 * one), dtype and shape; PDDE_CUDA_ATTENTION, which would override PDDE_ATTENTION on CUDA, unset
 * meanwhile. */
static void each_attention_case(const options *o, int device, const char *form, attention_case_fn run_case) {
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    static const pdde_dtype dtypes[3] = {PDDE_F32, PDDE_BF16, PDDE_F16};
    /* (PDDE_ATTENTION chooses among the built-in GPU backends' paths; a plugin's attention has one) */
    bool gpu = !strcmp(props.backend, "opencl") || !strcmp(props.backend, "cuda") || !strcmp(props.backend, "level_zero");
    const char *cuda_was = getenv("PDDE_CUDA_ATTENTION");
    char *cuda_saved = cuda_was ? strdup(cuda_was) : NULL;
    unsetenv("PDDE_CUDA_ATTENTION");
    int paths = !gpu ? 1 : strcmp(props.backend, "cuda") == 0 ? 4 : 3;
    for (int pi = 0; pi < paths; pi++)
    for (int di = 0; di < 3; di++)
    for (size_t si = 0; si < sizeof attention_shapes / sizeof *attention_shapes; si++) {
        const int64_t *s = attention_shapes[si];
        if (gpu) setenv("PDDE_ATTENTION", attention_paths[pi], 1);
        char label[128];
        snprintf(label, sizeof label, "%s attention %s [%lld,%lld,%lld,%lld] on %s%s%s", form, pdde_dtype_name(dtypes[di]), (long long)s[0],
                 (long long)s[1], (long long)s[2], (long long)s[3], props.backend, gpu ? " path " : "", gpu ? attention_paths[pi] : "");
        run_case(o, device, s, (int)si, dtypes[di], label);
    }
    unsetenv("PDDE_ATTENTION");
    if (cuda_saved) setenv("PDDE_CUDA_ATTENTION", cuda_saved, 1), free(cuda_saved);
}

/* A fused attention's n checked tensors (names[k]; 0: the output) against the reference's: NMSE within
 * attention_tolerance. Where T = 1 checks 1 .. roundoff_end - 1 (dq and dk) are exactly zero (one key:
 * the softmax is constant) and both paths give round-off there, so an absolute bound stands in. */
static void check_attention_results(const options *o, const char *label, const results *got, const results *ref, const char *const *names,
                                    int n, int roundoff_end, const int64_t *s, pdde_dtype dt) {
    for (int k = 0; k < n; k++) {
        double e = nmse(got->v[k], ref->v[k], got->len[k]), worst = 0, tol = attention_tolerance(dt, k > 0);
        for (int64_t i = 0; i < got->len[k]; i++) worst = fmax(worst, fabs(got->v[k][i] - ref->v[k][i]));
        bool ok = e <= tol || (s[2] == 1 && k && k < roundoff_end && worst <= 1e-6); /* (NaN fails both) */
        CHECK(got->len[k] == ref->len[k] && ok, "%s: %s NMSE %.3g > %.3g (largest difference %.3g)", label, names[k], e, tol, worst);
        if (o->verbose) printf("  %-72s %-8s NMSE %.3g (bound %.3g)\n", label, names[k], e, tol);
    }
}

/* q, k, v apart: the output and the gradients of q, k, v; the attention nodes read q, k, v in dt. */
static void fused_attention_case(const options *o, int device, const int64_t *s, int si, pdde_dtype dt, const char *label) {
    pdde_graph *gf, *gu;
    const pdde_tensor *cf[4], *cu[4];
    pdde_graph_init(o->ctx, &gf), pdde_graph_init(o->ctx, &gu);
    attention_graph(gf, s, true, dt, cf), attention_graph(gu, s, false, PDDE_F32, cu);
    bool has_fused = graph_has_op(gf, "attention") && graph_has_op(gf, "attention_back") && !graph_has_op(gf, "softmax");
    CHECK(pdde_graph_status(gf) == PDDE_OK && pdde_graph_status(gu) == PDDE_OK && has_fused, "%s: graphs: %s", label, pdde_last_error(o->ctx));
    CHECK(attention_reads(gf, dt), "%s: the attention nodes do not read %s q, k, v", label, pdde_dtype_name(dt));
    results got, ref;
    pdde_status st = run_fused_and_reference(o, gf, gu, device, 1000 + si, "attention", cf, cu, 4, &got, &ref);
    if (fused_case_declined(o, st, label, &got, &ref, gf, gu)) return; /* (a plugin without attention: it ran on the CPU) */
    CHECK(st == PDDE_OK, "%s: %s (%s)", label, pdde_status_str(st), pdde_last_error(o->ctx));
    const char *names[4] = {"output", cu[1]->name, cu[2]->name, cu[3]->name};
    if (st == PDDE_OK) check_attention_results(o, label, &got, &ref, names, 4, 3, s, dt); /* (dv exact at T = 1) */
    results_free(&got), results_free(&ref);
    pdde_graph_free(gf), pdde_graph_free(gu);
}

static void test_fused_attention(const options *o, int device) { each_attention_case(o, device, "fused", fused_attention_case); }

/* The packed form (pdde_attention_qkv): qkv [B, T, H*3*D] -> y [B, T, H*D] against the unfused reference
 * on slices and permutes of the same qkv (the layout the GPT block had before): y and qkv's gradient, on
 * every path of a GPU device, and no slice or permute left in the fused graph. */
static pdde_tensor *attention_qkv_graph(pdde_graph *g, const int64_t *s, bool fused, pdde_dtype dt, const pdde_tensor **checks) {
    int64_t B = s[0], H = s[1], T = s[2], D = s[3], C = H * D;
    pdde_tensor *qkv = pdde_param(g, "qkv", 3, (int64_t[]){B, T, 3 * C}, 0.0f), *y, *part[3];
    pdde_graph_set_compute_dtype(g, dt);
    if (fused) {
        y = pdde_attention_qkv(g, qkv, (int)H);
    } else {
        pdde_split(g, pdde_reshape(g, qkv, 5, (int64_t[]){B, T, H, 3, D}), 3, 3, part);
        for (int i = 0; i < 3; i++) part[i] = pdde_permute(g, pdde_reshape(g, part[i], 4, (int64_t[]){B, T, H, D}), (int[]){0, 2, 1, 3});
        y = pdde_reshape(g, pdde_permute(g, pdde_attention_unfused(g, part[0], part[1], part[2]), (int[]){0, 2, 1, 3}), 3,
                         (int64_t[]){B, T, C});
    }
    pdde_graph_set_compute_dtype(g, PDDE_F32);
    pdde_tensor *loss = checking_loss(g, y);
    pdde_mark_output(y);
    pdde_backward(g, loss);
    checks[0] = y, checks[1] = qkv->grad;
    return loss;
}

/* qkv packed: the output and qkv's gradient (dq and dk in it round-off at T = 1, dv exact); no slice or
 * permute left in the fused graph. */
static void packed_attention_case(const options *o, int device, const int64_t *s, int si, pdde_dtype dt, const char *label) {
    pdde_graph *gf, *gu;
    const pdde_tensor *cf[2], *cu[2];
    pdde_graph_init(o->ctx, &gf), pdde_graph_init(o->ctx, &gu);
    attention_qkv_graph(gf, s, true, dt, cf), attention_qkv_graph(gu, s, false, PDDE_F32, cu);
    bool clean = graph_has_op(gf, "attention") && graph_has_op(gf, "attention_back") && !graph_has_op(gf, "softmax") &&
                 !graph_has_op(gf, "slice") && !graph_has_op(gf, "slice_back") && !graph_has_op(gf, "permute");
    CHECK(pdde_graph_status(gf) == PDDE_OK && pdde_graph_status(gu) == PDDE_OK && clean, "%s: graphs (fused, no slice or permute): %s",
          label, pdde_last_error(o->ctx));
    results got, ref;
    pdde_status st = run_fused_and_reference(o, gf, gu, device, 2000 + si, "attention", cf, cu, 2, &got, &ref);
    if (fused_case_declined(o, st, label, &got, &ref, gf, gu)) return; /* (a plugin without attention: it ran on the CPU) */
    CHECK(st == PDDE_OK, "%s: %s (%s)", label, pdde_status_str(st), pdde_last_error(o->ctx));
    if (st == PDDE_OK) check_attention_results(o, label, &got, &ref, (const char *const[]){"output", "qkv.grad"}, 2, 2, s, dt);
    results_free(&got), results_free(&ref);
    pdde_graph_free(gf), pdde_graph_free(gu);
}

static void test_packed_attention(const options *o, int device) { each_attention_case(o, device, "packed", packed_attention_case); }

/* Document-masked attention (pdde_attention_docs, pdde_attention_qkv_docs) against the f32 unfused graph with the
 * mask added before its causal softmax (the "att_mask" input built from the same starts), both layouts, f32 and
 * bf16, every path: starts of documents packed in each batch row (random lengths, some of one token; the first
 * row, where there are several, one document from t = 0) or of a sliding window t - W + 1 (its first starts
 * negative: clamped to 0). */
enum { DOCS_PACKED, DOCS_WINDOW };
static int32_t *docs_starts(int64_t B, int64_t T, int pattern, uint64_t seed) {
    int32_t *st = malloc((size_t)(B * T) * sizeof *st);
    int64_t W = T / 3 + 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0, begin = 0, left = 0; t < T; t++) {
            if (pattern == DOCS_WINDOW) {
                st[b * T + t] = (int32_t)(t - W + 1);
                continue;
            }
            if (b == 0 && B > 1) { /* (a document from t = 0 only: plain causal) */
                st[b * T + t] = 0;
                continue;
            }
            if (!left) { /* (a new document: one token in four, else up to T / 2) */
                uint64_t r = mix(&seed);
                left = r % 4 == 0 ? 1 : 1 + (int64_t)((r >> 8) % (uint64_t)(T / 2 + 1));
                begin = t;
            }
            left--;
            st[b * T + t] = (int32_t)begin;
        }
    return st;
}

/* softmax(q k^T scale + mask, causal) v: pdde_attention_unfused's pieces with the mask added */
static pdde_tensor *masked_unfused(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v, pdde_tensor *mask) {
    pdde_tensor *att = pdde_scale(g, pdde_matmul(g, q, k, 0, 1), 1.0f / sqrtf((float)q->shape[3]));
    return pdde_matmul(g, pdde_softmax(g, pdde_add(g, att, mask), 1), v, 0, 0);
}

/* The docs case's graph: q, k, v apart (checks: y and the gradients of q, k, v) or packed in qkv (y and qkv's
 * gradient); fused under compute dtype dt, or the masked unfused reference */
static void docs_graph(pdde_graph *g, const int64_t *s, bool packed, bool fused, pdde_dtype dt, const pdde_tensor **checks) {
    int64_t B = s[0], H = s[1], T = s[2], D = s[3], C = H * D;
    pdde_tensor *starts = fused ? pdde_input(g, "att_starts", PDDE_I32, 2, (int64_t[]){B, T}) : NULL;
    pdde_tensor *mask = fused ? NULL : pdde_input(g, "att_mask", PDDE_F32, 4, (int64_t[]){B, 1, T, T});
    pdde_tensor *y, *qkv = NULL, *q = NULL, *k = NULL, *v = NULL;
    if (packed) {
        qkv = pdde_param(g, "qkv", 3, (int64_t[]){B, T, 3 * C}, 0.0f);
        pdde_graph_set_compute_dtype(g, dt);
        if (fused) {
            y = pdde_attention_qkv_docs(g, qkv, (int)H, starts);
        } else {
            pdde_tensor *part[3];
            pdde_split(g, pdde_reshape(g, qkv, 5, (int64_t[]){B, T, H, 3, D}), 3, 3, part);
            for (int i = 0; i < 3; i++) part[i] = pdde_permute(g, pdde_reshape(g, part[i], 4, (int64_t[]){B, T, H, D}), (int[]){0, 2, 1, 3});
            y = pdde_reshape(g, pdde_permute(g, masked_unfused(g, part[0], part[1], part[2], mask), (int[]){0, 2, 1, 3}), 3,
                             (int64_t[]){B, T, C});
        }
    } else {
        q = pdde_param(g, "q", 4, s, 0.0f), k = pdde_param(g, "k", 4, s, 0.0f), v = pdde_param(g, "v", 4, s, 0.0f);
        pdde_graph_set_compute_dtype(g, dt);
        y = fused ? pdde_attention_docs(g, q, k, v, starts) : masked_unfused(g, q, k, v, mask);
    }
    pdde_graph_set_compute_dtype(g, PDDE_F32);
    pdde_tensor *loss = checking_loss(g, y);
    pdde_mark_output(y);
    pdde_backward(g, loss);
    checks[0] = y;
    if (packed) checks[1] = qkv->grad;
    else checks[1] = q->grad, checks[2] = k->grad, checks[3] = v->grad;
}

static void docs_case(const options *o, int device, const int64_t *s, int si, pdde_dtype dt, const char *label, bool packed) {
    int pattern = (si + packed) % 2 ? DOCS_WINDOW : DOCS_PACKED; /* (each shape sees both, one in each layout) */
    int32_t *starts = docs_starts(s[0], s[2], pattern, 7000 + (uint64_t)si);
    g_att_starts = starts, g_att_T = s[2];
    char what[192];
    snprintf(what, sizeof what, "%s (%s)", label, pattern == DOCS_WINDOW ? "window" : "documents");
    pdde_graph *gf, *gu;
    const pdde_tensor *cf[4], *cu[4];
    int n = packed ? 2 : 4;
    pdde_graph_init(o->ctx, &gf), pdde_graph_init(o->ctx, &gu);
    docs_graph(gf, s, packed, true, dt, cf), docs_graph(gu, s, packed, false, PDDE_F32, cu);
    bool has_fused = graph_has_op(gf, "attention") && graph_has_op(gf, "attention_back") && !graph_has_op(gf, "softmax");
    CHECK(pdde_graph_status(gf) == PDDE_OK && pdde_graph_status(gu) == PDDE_OK && has_fused, "%s: graphs: %s", what, pdde_last_error(o->ctx));
    results got, ref;
    pdde_status st = run_fused_and_reference(o, gf, gu, device, (packed ? 4000 : 3000) + si, "attention", cf, cu, n, &got, &ref);
    if (!fused_case_declined(o, st, what, &got, &ref, gf, gu)) { /* (a plugin without attention: it ran on the CPU) */
        CHECK(st == PDDE_OK, "%s: %s (%s)", what, pdde_status_str(st), pdde_last_error(o->ctx));
        const char *names[4] = {"output", packed ? "qkv.grad" : "q.grad", "k.grad", "v.grad"};
        if (st == PDDE_OK) check_attention_results(o, what, &got, &ref, names, n, packed ? 2 : 3, s, dt);
        results_free(&got), results_free(&ref);
        pdde_graph_free(gf), pdde_graph_free(gu);
    }
    g_att_starts = NULL;
    free(starts);
}
static void docs_apart_case(const options *o, int device, const int64_t *s, int si, pdde_dtype dt, const char *label) {
    docs_case(o, device, s, si, dt, label, false);
}
static void docs_packed_case(const options *o, int device, const int64_t *s, int si, pdde_dtype dt, const char *label) {
    docs_case(o, device, s, si, dt, label, true);
}
static void test_docs_attention(const options *o, int device) {
    each_attention_case(o, device, "docs", docs_apart_case);
    each_attention_case(o, device, "docs packed", docs_packed_case);
}

/* ------------------------------------------------------------------------------------------------
 * Multi-tensor AdamW: the update nodes of a device run as one launch (one threaded loop on the CPU,
 * k_adamw_multi on the GPUs, 16 tensors a launch) with the numerics of one node each: checked against
 * AdamW written out here (llm.c's), bit for bit on the CPU, over 18 parameters of awkward sizes (more
 * than one GPU launch holds; one larger than a CPU thread's share, so a tensor is split between
 * threads), 1-D ones without weight decay, and clipping by the global norm. The loss sum(p_i * x_i)
 * makes each gradient exactly x_i. The session's trace shows how many update calls a step took. */

enum { MT_PARAMS = 18, MT_STEPS = 3 };
static const int64_t mt_shape[MT_PARAMS][2] = {
    {1, 0}, {7, 0}, {33, 31}, {129, 131}, {3, 0}, {16, 16}, {5, 3}, {2, 0}, {17, 0},
    {1, 1}, {64, 0}, {9, 9}, {31, 0}, {2, 2}, {11, 0}, {8, 3}, {1000, 0}, {3, 5},
};

/* The library's AdamW step over every parameter, as the CPU computes it (float; the squared norm a
 * double sum per gradient, added up in float in graph order). */
static void mt_reference(float **p, float **m, float **v, float *const *x, const int64_t *len, int step, const pdde_optimizer_params *op) {
    float norm_sq = 0;
    for (int i = 0; i < MT_PARAMS; i++) {
        double sum = 0;
        for (int64_t k = 0; k < len[i]; k++) sum += (double)x[i][k] * x[i][k];
        norm_sq = (float)sum + norm_sq;
    }
    float norm = sqrtf(norm_sq), gs = norm > op->clip_norm ? op->clip_norm / (norm + 1e-6f) : 1.0f;
    float b1 = op->beta1, b2 = op->beta2, bc1 = 1.0f - powf(b1, (float)step), bc2 = 1.0f - powf(b2, (float)step);
    for (int i = 0; i < MT_PARAMS; i++) {
        float wd = mt_shape[i][1] ? op->weight_decay : 0.0f; /* (1-D parameters: biases, gains) */
        for (int64_t k = 0; k < len[i]; k++) {
            float gi = x[i][k] * gs;
            m[i][k] = b1 * m[i][k] + (1.0f - b1) * gi;
            v[i][k] = b2 * v[i][k] + (1.0f - b2) * gi * gi;
            float mhat = m[i][k] / bc1, vhat = v[i][k] / bc2;
            p[i][k] -= op->lr * (mhat / (sqrtf(vhat) + op->eps) + wd * p[i][k]);
        }
    }
}

/* How many events of the trace file path are update launches ("adamw_update.<id>"). */
static int mt_update_events(const char *path) {
    FILE *f = fopen(path, "r");
    int n = 0;
    char line[512];
    while (f && fgets(line, sizeof line, f)) n += strstr(line, "\"name\":\"adamw_update.") != NULL;
    if (f) fclose(f);
    return n;
}

static void test_multi_tensor_adamw(const options *o, int device) {
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    pdde_graph *g;
    pdde_graph_init(o->ctx, &g);
    pdde_tensor *params[MT_PARAMS], *inputs[MT_PARAMS], *loss = NULL;
    int64_t len[MT_PARAMS];
    float *p[MT_PARAMS], *m[MT_PARAMS], *v[MT_PARAMS], *x[MT_PARAMS], *got[MT_PARAMS];
    for (int i = 0; i < MT_PARAMS; i++) {
        char name[16];
        int nd = mt_shape[i][1] ? 2 : 1;
        snprintf(name, sizeof name, "p%d", i);
        params[i] = pdde_param(g, name, nd, mt_shape[i], 0.0f);
        snprintf(name, sizeof name, "x%d", i);
        inputs[i] = pdde_input(g, name, PDDE_F32, nd, mt_shape[i]);
        pdde_tensor *term = pdde_sum(g, pdde_mul(g, params[i], inputs[i]), -1, 0);
        loss = loss ? pdde_add(g, loss, term) : term;
        len[i] = mt_shape[i][0] * (mt_shape[i][1] ? mt_shape[i][1] : 1);
        p[i] = malloc((size_t)len[i] * sizeof(float)), x[i] = malloc((size_t)len[i] * sizeof(float)), got[i] = malloc((size_t)len[i] * sizeof(float));
        m[i] = calloc((size_t)len[i], sizeof(float)), v[i] = calloc((size_t)len[i], sizeof(float));
        fill_leaf(params[i], fixed_seed(2000), p[i]), fill_leaf(inputs[i], fixed_seed(2000), x[i]);
    }
    pdde_backward(g, loss);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 0.05f, op.weight_decay = 0.1f, op.clip_norm = 0.5f, op.beta1 = 0.9f, op.beta2 = 0.999f, op.eps = 1e-8f;
    pdde_optimizer_adamw(g, &op);
    char trace[96];
    snprintf(trace, sizeof trace, "/tmp/pdde_test_backend_ops.%d.trace", (int)getpid());
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device, sp.no_cpu_fallback = o->strict; /* (a plugin's device may leave ops to the CPU) */
    pdde_session *s = NULL;
    pdde_status st = pdde_graph_status(g) ? pdde_graph_status(g) : pdde_session_init(g, &sp, &s);
    bool declined = st == PDDE_ERR_UNSUPPORTED || (!st && device != 0 && !nodes_on(s, device, "adamw_update"));
    if (declined && !o->strict) { /* a plugin that does not run the update */
        n_unsupported++;
        pdde_session_free(s);
        for (int i = 0; i < MT_PARAMS; i++) free(p[i]), free(m[i]), free(v[i]), free(x[i]), free(got[i]);
        pdde_graph_free(g);
        return;
    }
    int64_t syncs = 0;
    int launches = -1;
    /* a run checked against the reference, then a traced one (a trace waits for the device after every node) */
    for (int traced = 0; traced < 2 && !st; traced++) {
        if (traced) {
            pdde_session_free(s), s = NULL;
            sp.trace = trace;
            st = pdde_session_init(g, &sp, &s);
        }
        for (int i = 0; i < MT_PARAMS && !st; i++) {
            st = pdde_session_write(s, params[i], p[i], (size_t)len[i] * sizeof(float));
            if (!st) st = pdde_session_write(s, inputs[i], x[i], (size_t)len[i] * sizeof(float));
        }
        for (int k = 1; k <= MT_STEPS && !st; k++) {
            int64_t before = pdde_session_host_syncs(s);
            st = pdde_session_run(s, PDDE_RUN_STEP);
            if (traced) continue;
            syncs += pdde_session_host_syncs(s) - before;
            mt_reference(p, m, v, x, len, k, &op);
        }
        for (int i = 0; i < MT_PARAMS && !st && !traced; i++) st = pdde_session_read(s, params[i], got[i], (size_t)len[i] * sizeof(float));
    }
    pdde_session_free(s);
    if (!st) launches = mt_update_events(trace);
    double worst = 0;
    int64_t differ = 0;
    for (int i = 0; i < MT_PARAMS && !st; i++) {
        differ += memcmp(got[i], p[i], (size_t)len[i] * sizeof(float)) != 0;
        double d[2] = {0, 0};
        for (int64_t k = 0; k < len[i] && !st; k++) {
            double e = fabs((double)got[i][k] - p[i][k]);
            d[0] = fmax(d[0], isnan(e) ? INFINITY : e); /* (fmax drops a NaN) */
            d[1] = fmax(d[1], fabs(p[i][k]));
        }
        worst = fmax(worst, d[0] / (d[1] > 0 ? d[1] : 1));
    }
    bool cpu = !strcmp(props.backend, "cpu");
    CHECK(st == PDDE_OK, "multi-tensor adamw on %s: %s (%s)", props.backend, pdde_status_str(st), pdde_last_error(o->ctx));
    if (cpu) CHECK(!st && differ == 0, "multi-tensor adamw on cpu: %lld of %d parameters differ from the reference (largest relative "
                   "difference %.3g); the CPU must match it bit for bit", (long long)differ, MT_PARAMS, worst);
    else CHECK(!st && worst <= 1e-5, "multi-tensor adamw on %s: parameters differ from the reference by %.3g of the largest (> 1e-5)",
               props.backend, worst);
    /* one update a step (an event of the trace per compute or compute_group call; the GPUs' kernels
     * take 16 tensors a launch within it): the built-in backends' (a plugin need not group them, and
     * its copies to and from the CPU wait too) */
    if (o->strict) CHECK(!st && launches == MT_STEPS, "multi-tensor adamw on %s: %d updates in %d steps, want one a step", props.backend, launches, MT_STEPS);
    /* the host waits for the device once a step, at its end, where it reads the loss and the norm the
     * update kernels checked themselves (the CPU: never) */
    if (o->strict) CHECK(!st && syncs == (cpu ? 0 : MT_STEPS), "multi-tensor adamw on %s: the host waited for the device %lld times in %d steps, "
          "want %d", props.backend, (long long)syncs, MT_STEPS, cpu ? 0 : MT_STEPS);
    if (o->verbose) printf("  multi-tensor adamw on %-10s largest relative difference %.3g, %d updates, %lld host syncs\n", props.backend,
                           worst, launches, (long long)syncs);
    remove(trace);
    for (int i = 0; i < MT_PARAMS; i++) free(p[i]), free(m[i]), free(v[i]), free(x[i]), free(got[i]);
    pdde_graph_free(g);
}

/* ------------------------------------------------------------------------------------------------
 * A non-finite gradient norm: every update kernel (multi-tensor AdamW, AdamW, SGD with momentum)
 * reads the squared norm and does nothing when it is not finite, so the executor checks it after the
 * step, with no wait before the update. A NaN written into one gradient between good steps fails the
 * step naming the norm and that gradient, with every parameter and optimizer state bit-identical to
 * before it and no step counted; the next step is good. A good step waits for the device once. */

enum { NF_MAX_PARAMS = 3 };

/* Every parameter and optimizer state of g, read from s into one buffer (at most cap floats). */
static size_t nf_snapshot(pdde_session *s, pdde_graph *g, float *out, size_t cap) {
    size_t n = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i);
        size_t k = (size_t)pdde_tensor_numel(t);
        bool state = (t->flags & PDDE_TENSOR_STATE) && !(t->flags & PDDE_TENSOR_GRAD);
        if (t->op != PDDE_OP_NONE || !((t->flags & PDDE_TENSOR_PARAM) || state) || n + k > cap) continue;
        if (pdde_session_read(s, t, out + n, k * sizeof(float)) == PDDE_OK) n += k;
    }
    return n;
}

static void test_update_nonfinite_norm(const options *o, int device) {
    static const struct { const char *op; int n_params; } configs[] = {{"adamw_update", 3}, {"adamw_update", 1}, {"sgd_update", 3}};
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    bool cpu = !strcmp(props.backend, "cpu");
    for (size_t c = 0; c < sizeof configs / sizeof *configs; c++) {
        char label[96];
        int n_params = configs[c].n_params;
        bool sgd = !strcmp(configs[c].op, "sgd_update");
        snprintf(label, sizeof label, "%s of %d tensor%s, a NaN gradient, on %s", configs[c].op, n_params, n_params > 1 ? "s" : "", props.backend);
        pdde_graph *g;
        pdde_graph_init(o->ctx, &g);
        pdde_tensor *params[NF_MAX_PARAMS], *inputs[NF_MAX_PARAMS], *loss = NULL;
        float x[NF_MAX_PARAMS][24], p0[NF_MAX_PARAMS][24];
        for (int i = 0; i < n_params; i++) {
            char name[16];
            int64_t shape[2] = {i + 2, 4}; /* (at most 24 elements) */
            snprintf(name, sizeof name, "p%d", i);
            params[i] = pdde_param(g, name, 2, shape, 0.0f);
            snprintf(name, sizeof name, "x%d", i);
            inputs[i] = pdde_input(g, name, PDDE_F32, 2, shape);
            pdde_tensor *term = pdde_sum(g, pdde_mul(g, params[i], inputs[i]), -1, 0);
            loss = loss ? pdde_add(g, loss, term) : term;
            fill_leaf(params[i], fixed_seed(3000), p0[i]), fill_leaf(inputs[i], fixed_seed(3000), x[i]);
        }
        pdde_backward(g, loss);
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        op.lr = 0.05f, op.weight_decay = 0.1f, op.clip_norm = 0.5f, op.momentum = 0.9f;
        if (sgd) pdde_optimizer_sgd(g, &op);
        else pdde_optimizer_adamw(g, &op);
        pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
        sp.device = device, sp.no_cpu_fallback = o->strict;
        pdde_session *s = NULL;
        pdde_status st = pdde_graph_status(g) ? pdde_graph_status(g) : pdde_session_init(g, &sp, &s);
        if (!o->strict && (st == PDDE_ERR_UNSUPPORTED || (!st && device != 0 && !nodes_on(s, device, configs[c].op)))) {
            n_unsupported++; /* a plugin that does not run the update */
            pdde_session_free(s), pdde_graph_free(g);
            continue;
        }
        for (int i = 0; i < n_params && !st; i++) {
            int64_t n = pdde_tensor_numel(params[i]);
            st = pdde_session_write(s, params[i], p0[i], (size_t)n * sizeof(float));
            if (!st) st = pdde_session_write(s, inputs[i], x[i], (size_t)n * sizeof(float));
        }
        int64_t syncs = pdde_session_host_syncs(s);
        if (!st) st = pdde_session_run(s, PDDE_RUN_STEP);
        syncs = pdde_session_host_syncs(s) - syncs;
        CHECK(st == PDDE_OK, "%s: a good step: %s (%s)", label, pdde_status_str(st), pdde_last_error(o->ctx));
        if (o->strict) CHECK(syncs == (cpu ? 0 : 1), "%s: a good step waited for the device %lld times, want %d", label, (long long)syncs, cpu ? 0 : 1);
        float before[NF_MAX_PARAMS * 24 * 3], after[NF_MAX_PARAMS * 24 * 3];
        size_t n_before = nf_snapshot(s, g, before, sizeof before / sizeof *before);
        int64_t steps = pdde_session_step(s);
        /* the backward adds x to the gradient (an accumulator): a NaN there stays one */
        float grad[24] = {0};
        int64_t bad = pdde_tensor_numel(params[n_params - 1]) - 2;
        grad[bad] = NAN;
        char culprit[96];
        snprintf(culprit, sizeof culprit, "gradient %s[%lld]", params[n_params - 1]->grad->name, (long long)bad);
        if (!st) st = pdde_session_write(s, params[n_params - 1]->grad, grad, (size_t)pdde_tensor_numel(params[n_params - 1]) * sizeof(float));
        pdde_status bad_st = st ? st : pdde_session_run(s, PDDE_RUN_STEP);
        const char *e = pdde_last_error(o->ctx);
        CHECK(bad_st == PDDE_ERR_NONFINITE && strstr(e, "step 2") && strstr(e, "squared gradient norm") && strstr(e, culprit),
              "%s: the step fails naming the norm and %s: %s (%s)", label, culprit, pdde_status_str(bad_st), e);
        size_t n_after = nf_snapshot(s, g, after, sizeof after / sizeof *after);
        CHECK(n_after == n_before && n_before > (size_t)(n_params * 8) && memcmp(before, after, n_before * sizeof(float)) == 0,
              "%s: a parameter or optimizer state changed in the failed step", label);
        CHECK(pdde_session_step(s) == steps, "%s: the failed step was counted (%lld -> %lld)", label, (long long)steps, (long long)pdde_session_step(s));
        /* its gradients were dropped: the next step is good */
        st = pdde_session_run(s, PDDE_RUN_STEP);
        CHECK(st == PDDE_OK && isfinite(pdde_session_loss(s)) && pdde_session_step(s) == steps + 1, "%s: the step after: %s (%s)", label,
              pdde_status_str(st), pdde_last_error(o->ctx));
        if (o->verbose) printf("  %-58s refused, nothing changed\n", label);
        pdde_session_free(s);
        pdde_graph_free(g);
    }
}

/* ------------------------------------------------------------------------------------------------
 * rope against a float64 reference of its definition (the CPU's kernel included): y and the gradient of
 * x for sum(y * w), dx = w rotated back. The angle t * inv, inv = 1 / base^(2i/D), is rounded to f32 as
 * the op defines it (Hugging Face's f32 inv_freq); its cosine, sine and the rotation are in double. */

static void test_rope_reference(const options *o, int device) {
    static const int64_t shapes[][5] = {{2, 7, 3, 8, 10000}, {1, 33, 2, 64, 500000}, {1, 300, 1, 256, 10000}};
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t *s = shapes[si];
        int64_t B = s[0], T = s[1], H = s[2], D = s[3], half = D / 2, n = B * T * H * D;
        float base = (float)s[4];
        char label[96];
        snprintf(label, sizeof label, "rope [%lld,%lld,%lld,%lld] base %g on %s vs float64", (long long)B, (long long)T, (long long)H,
                 (long long)D, base, props.backend);
        pdde_graph *g;
        pdde_graph_init(o->ctx, &g);
        pdde_tensor *x = pdde_param(g, "x", 4, s, 0.0f), *y = pdde_rope(g, x, base);
        pdde_tensor *loss = checking_loss(g, y), *w = NULL;
        pdde_mark_output(y);
        pdde_backward(g, loss);
        for (int i = 0; i < pdde_graph_tensor_count(g); i++)
            if (!strcmp(pdde_graph_tensor(g, i)->name, "dy_weights")) w = pdde_graph_tensor(g, i);
        CHECK(pdde_graph_status(g) == PDDE_OK && w && x->grad, "%s: graph: %s", label, pdde_last_error(o->ctx));
        if (pdde_graph_status(g) != PDDE_OK || !w || !x->grad) { pdde_graph_free(g); continue; }
        const pdde_tensor *checks[2] = {y, x->grad};
        results got;
        pdde_status st = run_on(o->ctx, g, device, 4000 + (int)si, "rope", PDDE_RUN_FORWARD_BACKWARD, 1, checks, 2, &got, NULL, 0);
        if (st == PDDE_ERR_UNSUPPORTED && device != 0 && !rope_kernels_on(props.backend)) { /* (rope runs on the CPU there) */
            n_unsupported++;
            results_free(&got), pdde_graph_free(g);
            continue;
        }
        CHECK(st == PDDE_OK, "%s: %s (%s)", label, pdde_status_str(st), pdde_last_error(o->ctx));
        float *xv = malloc((size_t)n * sizeof *xv), *wv = malloc((size_t)n * sizeof *wv);
        double *yr = malloc((size_t)n * sizeof *yr), *dxr = malloc((size_t)n * sizeof *dxr);
        if (st == PDDE_OK && xv && wv && yr && dxr) {
            fill_leaf(x, fixed_seed(4000 + (int)si), xv), fill_leaf(w, fixed_seed(4000 + (int)si), wv);
            for (int64_t r = 0; r < B * T * H; r++)
                for (int64_t i = 0; i < half; i++) {
                    float a = (float)((r / H) % T) * (1.0f / powf(base, (float)(2 * i) / (float)D));
                    double c = cos((double)a), sn = sin((double)a);
                    int64_t e = r * D + i, e2 = e + half;
                    yr[e] = xv[e] * c - xv[e2] * sn, yr[e2] = xv[e2] * c + xv[e] * sn;
                    dxr[e] = wv[e] * c + wv[e2] * sn, dxr[e2] = wv[e2] * c - wv[e] * sn;
                }
            /* f32 cosines, sines and products: a few units of roundoff (2^-24) an element, an NMSE near 1e-14 */
            double ey = nmse(got.v[0], yr, n), edx = nmse(got.v[1], dxr, n), tol = 1e-12;
            CHECK(ey <= tol && edx <= tol, "%s: NMSE y %.3g, dx %.3g > %.3g", label, ey, edx, tol);
            if (o->verbose) printf("  %-64s NMSE y %.3g dx %.3g (bound %.3g)\n", label, ey, edx, tol);
        }
        free(xv), free(wv), free(yr), free(dxr);
        results_free(&got);
        pdde_graph_free(g);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Fused elementwise ops against their unfused graphs (the reference) on the CPU: bias_gelu against
 * gelu(bias_add), the output and the gradients of x and the bias. */

static pdde_tensor *bias_gelu_graph(pdde_graph *g, const int64_t *s, bool fused, const pdde_tensor **checks) {
    pdde_tensor *x = pdde_param(g, "x", 2, s, 0.0f), *b = pdde_param(g, "bias", 1, s + 1, 0.0f);
    pdde_tensor *x3 = pdde_scale(g, x, 3.0f);
    pdde_tensor *y = fused ? pdde_bias_gelu(g, x3, b) : pdde_gelu(g, pdde_bias_add(g, x3, b));
    pdde_tensor *loss = checking_loss(g, y);
    pdde_mark_output(y);
    pdde_backward(g, loss);
    checks[0] = y, checks[1] = x->grad, checks[2] = b->grad;
    return loss;
}

static void test_fused_bias_gelu(const options *o, int device) {
    static const int64_t shapes[][2] = {{1, 1}, {7, 33}, {131, 257}};
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t *s = shapes[si];
        char label[96];
        snprintf(label, sizeof label, "bias_gelu [%lld,%lld] on %s vs unfused", (long long)s[0], (long long)s[1], props.backend);
        pdde_graph *gf, *gu;
        const pdde_tensor *cf[3], *cu[3];
        pdde_graph_init(o->ctx, &gf), pdde_graph_init(o->ctx, &gu);
        bias_gelu_graph(gf, s, true, cf), bias_gelu_graph(gu, s, false, cu);
        bool fused = graph_has_op(gf, "bias_gelu") && graph_has_op(gf, "bias_gelu_back") && !graph_has_op(gf, "gelu");
        CHECK(pdde_graph_status(gf) == PDDE_OK && pdde_graph_status(gu) == PDDE_OK && fused, "%s: graphs: %s", label, pdde_last_error(o->ctx));
        results got, ref;
        /* gelu(z) = z (1 + tanh(a)) / 2: z = x + b reaches -2 here, where 1 + tanh(a) = 0.046 cancels, and two tanhf
         * within 5 ulp each differ there by 10u / 0.046 relative in gelu, ~1.5x that in gelu' (sech^2 has the same
         * factor): a single element's NMSE up to (2e-5)^2 = 4e-10; over many elements the well-conditioned rest
         * averages it below T_DEF */
        double tol = s[0] * s[1] == 1 ? 1e-9 : T_DEF;
        pdde_status st = run_fused_and_reference(o, gf, gu, device, 2000 + (int)si, "bias_gelu", cf, cu, 3, &got, &ref);
        if (fused_case_declined(o, st, label, &got, &ref, gf, gu)) continue; /* (a plugin without bias_gelu) */
        CHECK(st == PDDE_OK, "%s: %s (%s)", label, pdde_status_str(st), pdde_last_error(o->ctx));
        for (int k = 0; st == PDDE_OK && k < 3; k++) {
            double e = nmse(got.v[k], ref.v[k], got.len[k]);
            CHECK(got.len[k] == ref.len[k] && e <= tol, "%s: %s NMSE %.3g > %.3g", label, k ? cu[k]->name : "output", e, tol);
            if (o->verbose) printf("  %-58s %-8s NMSE %.3g\n", label, k ? cu[k]->name : "output", e);
        }
        results_free(&got), results_free(&ref);
        pdde_graph_free(gf), pdde_graph_free(gu);
    }
}

/* ------------------------------------------------------------------------------------------------
 * A linear layer's bias gradient from its weight-gradient matmul (PDDE_FUSE_BGRAD=1) against the unfused
 * graph on the CPU: y = act(x W + b), loss sum(y * w); the loss, the output and the gradients of x, W, b.
 * The fused graph must have the matmul with the column sums on the device and no sum_to left. Shapes:
 * x 2-D and 3-D, gelu after the bias add or bias_gelu (its backward feeds the sums), under f32 and bf16
 * (the sums of dy as rounded for the GEMM: 2^-9 relative on each term), and with PDDE_FUSE_GRAD on too
 * (which then leaves these matmuls to the bias gradient). s = {batch (0: x 2-D), M, K, N, bias_gelu,
 * compute dtype, PDDE_FUSE_GRAD}. */

static pdde_tensor *bgrad_graph(pdde_graph *g, const int64_t *s, const pdde_tensor **checks) {
    pdde_graph_set_compute_dtype(g, (pdde_dtype)s[5]);
    pdde_tensor *x = s[0] ? pdde_param(g, "x", 3, (int64_t[]){s[0], s[1], s[2]}, 0.0f) : pdde_param(g, "x", 2, (int64_t[]){s[1], s[2]}, 0.0f);
    pdde_tensor *w = pdde_param(g, "w", 2, (int64_t[]){s[2], s[3]}, 0.0f), *b = pdde_param(g, "bias", 1, (int64_t[]){s[3]}, 0.0f);
    pdde_tensor *xw = pdde_matmul(g, x, w, 0, 0);
    pdde_tensor *y = s[4] ? pdde_bias_gelu(g, xw, b) : pdde_gelu(g, pdde_bias_add(g, xw, b));
    pdde_tensor *loss = checking_loss(g, y);
    pdde_mark_output(y);
    pdde_backward(g, loss);
    checks[0] = y, checks[1] = x->grad, checks[2] = w->grad, checks[3] = b->grad;
    return loss;
}

/* matmuls with the column sums (PDDE_P_MATMUL_BGRAD) on device, and sum_to nodes anywhere, in g's session */
static void bgrad_nodes(pdde_graph *g, int device, int *fused, int *sums) {
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    pdde_session *s;
    *fused = *sums = -1;
    if (pdde_session_init(g, &sp, &s) != PDDE_OK) return;
    *fused = *sums = 0;
    for (int i = 0; i < pdde_session_node_count(s); i++) {
        const pdde_tensor *t = pdde_session_node(s, i);
        *fused += t->op == PDDE_OP_MATMUL && pdde_op_i32(t, PDDE_P_MATMUL_BGRAD) && t->device == device;
        *sums += t->op == PDDE_OP_SUM_TO;
    }
    pdde_session_free(s);
}

static void test_fused_bias_grad(const options *o, int device) {
    static const int64_t shapes[][7] = {
        {0, 33, 19, 37, 0, 0, 0}, {3, 17, 13, 29, 1, 0, 0}, {0, 1, 1, 1, 0, 0, 0}, {2, 64, 48, 96, 1, PDDE_BF16, 0}, {0, 40, 24, 72, 0, PDDE_BF16, 1},
    };
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        const int64_t *s = shapes[si];
        char label[128];
        snprintf(label, sizeof label, "bias grad from the matmul [%lld,%lld,%lld,%lld]%s %s%s on %s vs unfused", (long long)s[0], (long long)s[1],
                 (long long)s[2], (long long)s[3], s[4] ? " bias_gelu" : "", pdde_dtype_name((pdde_dtype)s[5]), s[6] ? " +FUSE_GRAD" : "",
                 props.backend);
        pdde_graph *gf, *gu;
        const pdde_tensor *cf[4], *cu[4];
        pdde_graph_init(o->ctx, &gf), pdde_graph_init(o->ctx, &gu);
        bgrad_graph(gf, s, cf), bgrad_graph(gu, s, cu);
        CHECK(pdde_graph_status(gf) == PDDE_OK && pdde_graph_status(gu) == PDDE_OK, "%s: graphs: %s", label, pdde_last_error(o->ctx));
        results got, ref;
        unsetenv("PDDE_FUSE_BGRAD"), unsetenv("PDDE_FUSE_GRAD");
        pdde_status st = run_on(o->ctx, gu, 0, 3000 + (int)si, NULL, PDDE_RUN_FORWARD_BACKWARD, 1, cu, 4, &ref, NULL, 0);
        setenv("PDDE_FUSE_BGRAD", "1", 1);
        setenv("PDDE_FUSE_GRAD", s[6] ? "1" : "0", 1);
        int fused, sums;
        bgrad_nodes(gf, device, &fused, &sums);
        if (fused == 0 && !o->strict) { /* (a plugin that does not run the fused matmul: lowering leaves the sum_to, as it should) */
            n_unsupported++;
            unsetenv("PDDE_FUSE_BGRAD"), unsetenv("PDDE_FUSE_GRAD");
            results_free(&ref);
            pdde_graph_free(gf), pdde_graph_free(gu);
            continue;
        }
        CHECK(fused == 1 && sums == 0, "%s: %d fused matmuls on the device (1 expected), %d sum_to left (0 expected)", label, fused, sums);
        if (st == PDDE_OK) st = run_on(o->ctx, gf, device, 3000 + (int)si, NULL, PDDE_RUN_FORWARD_BACKWARD, 1, cf, 4, &got, NULL, 0);
        else memset(&got, 0, sizeof got);
        unsetenv("PDDE_FUSE_BGRAD"), unsetenv("PDDE_FUSE_GRAD");
        CHECK(st == PDDE_OK, "%s: %s (%s)", label, pdde_status_str(st), pdde_last_error(o->ctx));
        for (int k = 0; st == PDDE_OK && k < 4; k++) { /* (bf16: the sums' 2^-9 round-off of each term; a wrong sum is off by O(1)) */
            double e = nmse(got.v[k], ref.v[k], got.len[k]), tol = s[5] && k == 3 ? 1e-4 : s[5] ? 1e-6 : T_MM;
            CHECK(got.len[k] == ref.len[k] && e <= tol, "%s: %s NMSE %.3g > %.3g", label, k ? cu[k]->name : "output", e, tol);
            if (o->verbose) printf("  %-72s %-8s NMSE %.3g\n", label, k ? cu[k]->name : "output", e);
        }
        results_free(&got), results_free(&ref);
        pdde_graph_free(gf), pdde_graph_free(gu);
    }
}

/* ------------------------------------------------------------------------------------------------
 * The bias gradient (sum_to over rows) against column sums computed here: the CPU, the reference
 * of every other comparison, is checked on its own. Shapes: one element, rows of more than one
 * 512-column block on one thread, and a job split over the CPU's threads with blocks crossing the
 * split. w[r][c] = (r * 7 + c * 3) % 11 - 5: small integers, so every order of summing gives the
 * same float. */

static void test_bias_grad_sums(const options *o, int device) {
    static const int64_t shapes[][2] = {{1, 1}, {3, 700}, {41, 1031}, {256, 128}};
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int64_t R = shapes[si][0], C = shapes[si][1];
        pdde_graph *g;
        pdde_session *s = NULL;
        pdde_graph_init(o->ctx, &g);
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){R, C}), *b = pdde_param(g, "b", 1, (int64_t[]){C}, 0.0f);
        pdde_tensor *y = pdde_bias_add(g, x, b);
        pdde_graph_set_layer(g, CHECKING_LOSS_LAYER); /* (the loss on the CPU: only the bias add and its sum on the device) */
        pdde_tensor *w = pdde_input(g, "w", PDDE_F32, 2, (int64_t[]){R, C});
        pdde_tensor *loss = pdde_sum(g, pdde_mul(g, y, w), -1, 0);
        pdde_graph_set_layer(g, -1);
        pdde_backward(g, loss);
        pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
        sp.device = device;
        checking_loss_on_cpu(&sp);
        float *wv = malloc((size_t)(R * C) * sizeof *wv), *got = malloc((size_t)C * sizeof *got);
        for (int64_t i = 0; i < R * C; i++) wv[i] = (float)((i / C * 7 + i % C * 3) % 11 - 5);
        pdde_status st = pdde_graph_status(g);
        if (!st) st = pdde_session_init(g, &sp, &s);
        if (!st) st = pdde_session_write(s, x, wv, (size_t)(R * C) * sizeof *wv); /* (x's value does not matter) */
        if (!st) st = pdde_session_write(s, w, wv, (size_t)(R * C) * sizeof *wv);
        if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
        if (!st) st = pdde_session_read(s, b->grad, got, (size_t)C * sizeof *got);
        CHECK(st == PDDE_OK, "bias gradient [%lld,%lld] on %s: %s (%s)", (long long)R, (long long)C, props.backend, pdde_status_str(st),
              pdde_last_error(o->ctx));
        int64_t bad = -1;
        double want = 0;
        for (int64_t c = 0; st == PDDE_OK && c < C && bad < 0; c++) {
            want = 0;
            for (int64_t r = 0; r < R; r++) want += wv[r * C + c];
            if (got[c] != (float)want) bad = c;
        }
        CHECK(bad < 0, "bias gradient [%lld,%lld] on %s: b.grad[%lld] = %g, expected the column sum %g", (long long)R, (long long)C,
              props.backend, (long long)bad, bad < 0 ? 0.0 : got[bad], want);
        free(wv), free(got);
        pdde_session_free(s);
        pdde_graph_free(g);
    }
}

/* ------------------------------------------------------------------------------------------------
 * sum_to to shapes that are not a trailing part of x's (x [4,3,5] to [4,1,5], [1,3,1], [3,1], ...),
 * x f32 and bf16, against sums in double of the values as stored (bf16: rounded). The gradient pass
 * builds only f32 sum_to nodes, so the node is built here: a scale of y's shape turned into a sum_to
 * of x. Bound: 1e-5 of the sum of the terms' magnitudes (an f32 reduction's round-off; reading the
 * wrong elements or bf16 bits as floats is off by whole terms). */

static void test_sum_to_shapes(const options *o, int device) {
    static const int64_t xs[][3] = {{4, 3, 5}, {7, 33, 9}};
    static const struct { int x, nd; int64_t s[3]; } cases[] = {
        {0, 3, {4, 1, 5}}, {0, 3, {1, 3, 1}}, {0, 2, {3, 1}}, {0, 3, {4, 3, 1}}, {0, 3, {1, 1, 5}}, {0, 1, {5}},
        {0, 3, {1, 1, 1}}, {1, 3, {7, 1, 9}}, {1, 2, {33, 1}}, {1, 3, {1, 33, 1}}};
    pdde_device_props props;
    pdde_device_get_props(o->ctx, device, &props);
    for (int bf = 0; bf < 2; bf++)
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            const int64_t *xd = xs[cases[ci].x];
            int64_t n = xd[0] * xd[1] * xd[2], ny = 1;
            int nd = cases[ci].nd;
            for (int d = 0; d < nd; d++) ny *= cases[ci].s[d];
            char label[96], ys[40] = "";
            for (int d = 0; d < nd; d++) snprintf(ys + strlen(ys), sizeof ys - strlen(ys), "%s%lld", d ? "," : "", (long long)cases[ci].s[d]);
            snprintf(label, sizeof label, "sum_to %s [%lld,%lld,%lld] -> [%s] on %s", bf ? "bf16" : "f32", (long long)xd[0], (long long)xd[1],
                     (long long)xd[2], ys, props.backend);
            pdde_graph *g;
            pdde_session *s = NULL;
            pdde_graph_init(o->ctx, &g);
            pdde_tensor *x = pdde_input(g, "x", bf ? PDDE_BF16 : PDDE_F32, 3, xd);
            pdde_tensor *y = pdde_scale(g, pdde_input(g, "like", PDDE_F32, nd, cases[ci].s), 1.0f);
            if (y) y->op = PDDE_OP_SUM_TO, y->src[0] = x, y->nsrc = 1;
            pdde_mark_output(y);
            float *xv = malloc((size_t)n * sizeof *xv), *got = malloc((size_t)ny * sizeof *got);
            uint16_t *xh = malloc((size_t)n * sizeof *xh);
            double *want = calloc((size_t)ny, sizeof *want), *mag = calloc((size_t)ny, sizeof *mag);
            for (int64_t i = 0; i < n; i++) {
                xv[i] = (float)((i * 37 % 101) - 50) / 7.0f + 0.01f * (float)(i % 13);
                xh[i] = pdde_f32_to_bf16(xv[i]);
                if (bf) xv[i] = pdde_bf16_to_f32(xh[i]);
            }
            /* the reference: element (a, b, c) of x adds to y's element at its coordinates, 0 along y's 1s */
            for (int64_t i = 0; i < n; i++) {
                int64_t c[3] = {i / (xd[1] * xd[2]), i / xd[2] % xd[1], i % xd[2]}, k = 0;
                for (int d = 0; d < nd; d++) {
                    int64_t yd = cases[ci].s[d], xc = c[3 - nd + d];
                    k = k * yd + (yd == 1 ? 0 : xc);
                }
                want[k] += xv[i], mag[k] += fabs(xv[i]);
            }
            pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
            sp.device = device;
            pdde_status st = pdde_graph_status(g);
            if (!st) st = pdde_session_init(g, &sp, &s);
            if (!st) st = bf ? pdde_session_write(s, x, xh, (size_t)n * sizeof *xh) : pdde_session_write(s, x, xv, (size_t)n * sizeof *xv);
            if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
            if (!st) st = pdde_session_read(s, y, got, (size_t)ny * sizeof *got);
            CHECK(st == PDDE_OK, "%s: %s (%s)", label, pdde_status_str(st), pdde_last_error(o->ctx));
            int64_t bad = -1;
            for (int64_t k = 0; st == PDDE_OK && k < ny && bad < 0; k++)
                if (!(fabs(got[k] - want[k]) <= 1e-5 * mag[k] + 1e-30)) bad = k;
            CHECK(bad < 0, "%s: y[%lld] = %.9g, expected %.9g (the sum in double)", label, (long long)bad, bad < 0 ? 0.0 : got[bad],
                  bad < 0 ? 0.0 : want[bad]);
            if (o->verbose) printf("  %s: %s\n", label, bad < 0 && st == PDDE_OK ? "ok" : "wrong");
            free(xv), free(got), free(xh), free(want), free(mag);
            pdde_session_free(s);
            pdde_graph_free(g);
        }
}

/* ------------------------------------------------------------------------------------------------
 * Error paths */

static void test_errors(pdde_context *ctx, int device, const char *backend) {
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    sp.no_cpu_fallback = 1; /* (else the unsupported op below would run on the CPU) */
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_status st;
    /* an op the device cannot run: the vocab-parallel cross-entropy (PDDE_P_VOCAB_SIZE > 0, which an
     * SPMD session sets and runs on host memory) */
    if (strcmp(backend, "cpu")) {
        pdde_graph_init(ctx, &g);
        pdde_tensor *ce = pdde_cross_entropy(g, pdde_input(g, "logits", PDDE_F32, 2, (int64_t[]){4, 5}),
                                             pdde_input(g, "tgt", PDDE_I32, 1, (int64_t[]){4}));
        pdde_op_set_i32(ce, PDDE_P_VOCAB_FIRST, 5), pdde_op_set_i32(ce, PDDE_P_VOCAB_SIZE, 15);
        pdde_mark_output(ce);
        st = pdde_session_init(g, &sp, &s);
        CHECK(st == PDDE_ERR_UNSUPPORTED, "unsupported op: got %s (%s)", pdde_status_str(st), pdde_last_error(ctx));
        CHECK(strstr(pdde_last_error(ctx), "cross_entropy") != NULL, "unsupported op: message: %s", pdde_last_error(ctx));
        pdde_session_free(s), s = NULL;
        pdde_graph_free(g);
    }
    /* a buffer larger than the device */
    pdde_graph_init(ctx, &g);
    int64_t huge[2] = {1 << 18, 1 << 18}; /* 256 GiB */
    pdde_input(g, "huge", PDDE_F32, 2, huge);
    st = pdde_session_init(g, &sp, &s);
    int want = !strcmp(backend, "cpu") ? PDDE_ERR_OOM : PDDE_ERR_DEVICE_OOM;
    CHECK(st == want, "huge buffer on %s: got %s (%s)", backend, pdde_status_str(st), pdde_last_error(ctx));
    if (st != PDDE_OK) CHECK(strstr(pdde_last_error(ctx), "274877906944") != NULL, "OOM message lacks the size: %s", pdde_last_error(ctx));
    pdde_session_free(s), s = NULL;
    pdde_graph_free(g);
}

/* The vocab-parallel embedding (PDDE_P_VOCAB_FIRST = the first id of the table's rows,
 * PDDE_P_VOCAB_SIZE = the whole vocab; an SPMD session sets them where the table is split on the vocab): the CPU looks up the ids
 * in its range, gives zero rows for the others and scatters only its own rows' gradient; an id
 * outside the whole vocab is still an error. Other devices refuse the node cleanly (session init). */
static void test_vocab_offset(pdde_context *ctx, int device) {
    enum { V = 5, C = 3, FIRST = 5, VOCAB = 15, N = 6 };
    static const int32_t ids[N] = {0, 5, 9, 14, 7, 10}; /* rows 0, 4, 2 of this table; the rest elsewhere */
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *table = pdde_param(g, "table", 2, (int64_t[]){V, C}, 0.0f), *idt = pdde_input(g, "ids", PDDE_I32, 1, (int64_t[]){N});
    pdde_tensor *y = pdde_embedding(g, table, idt), *loss = pdde_sum(g, y, -1, 0);
    pdde_mark_output(y);
    pdde_backward(g, loss);
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_EMBEDDING || t->op == PDDE_OP_EMBEDDING_BACK) pdde_op_set_i32(t, PDDE_P_VOCAB_FIRST, FIRST), pdde_op_set_i32(t, PDDE_P_VOCAB_SIZE, VOCAB);
    }
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    sp.no_cpu_fallback = 1;
    pdde_session *s = NULL;
    pdde_status st = pdde_session_init(g, &sp, &s);
    pdde_device_props props;
    pdde_device_get_props(ctx, device, &props);
    if (strcmp(props.backend, "cpu")) {
        CHECK(st == PDDE_ERR_UNSUPPORTED, "vocab offset on %s: got %s (%s)", props.backend, pdde_status_str(st), pdde_last_error(ctx));
        pdde_session_free(s);
        pdde_graph_free(g);
        return;
    }
    float tv[V * C], out[N * C], grad[V * C];
    for (int i = 0; i < V * C; i++) tv[i] = (float)(i + 1);
    if (!st) st = pdde_session_write(s, table, tv, sizeof tv);
    if (!st) st = pdde_session_write(s, idt, ids, sizeof ids);
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
    if (!st) st = pdde_session_read(s, y, out, sizeof out);
    if (!st) st = pdde_session_read(s, table->grad, grad, sizeof grad);
    CHECK(st == PDDE_OK, "vocab offset: %s", pdde_last_error(ctx));
    int bad = 0, counts[V] = {0};
    for (int r = 0; r < N; r++) {
        int row = ids[r] - FIRST;
        if (row >= 0 && row < V) counts[row]++;
        for (int c = 0; c < C; c++) bad += out[r * C + c] != (row >= 0 && row < V ? tv[row * C + c] : 0.0f);
    }
    for (int i = 0; i < V * C; i++) bad += grad[i] != (float)counts[i / C]; /* d sum / d table: one per lookup */
    CHECK(!st && bad == 0, "vocab offset: %d wrong values (rows of ids in [%d, %d), zeros elsewhere)", bad, FIRST, FIRST + V);
    /* an id outside the whole vocab is an error, as with a whole table */
    int32_t wrong[N] = {0, 5, 9, 15, 7, 10};
    pdde_session_write(s, idt, wrong, sizeof wrong);
    st = pdde_session_run(s, PDDE_RUN_FORWARD);
    CHECK(st == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "id 15") && strstr(pdde_last_error(ctx), "[0, 15)"),
          "id outside the vocab: %s (%s)", pdde_status_str(st), pdde_last_error(ctx));
    pdde_session_free(s);
    pdde_graph_free(g);
}

/* A kernel source that does not build: PDDE_ERR_BUILD from session init, with the compiler's log. */
static void test_build_failure(int device) {
    setenv("PDDE_OPENCL_DEBUG_SOURCE", "\n__kernel void k_broken(__global float *y) { y[0] = undefined_thing; }\n", 1);
    pdde_context *ctx;
    pdde_status st = pdde_context_init(NULL, &ctx);
    unsetenv("PDDE_OPENCL_DEBUG_SOURCE");
    CHECK(st == PDDE_OK, "context_init");
    if (st) return;
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    int64_t shp[1] = {5};
    pdde_mark_output(pdde_relu(g, pdde_input(g, "x", PDDE_F32, 1, shp)));
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    pdde_session *s = NULL;
    st = pdde_session_init(g, &sp, &s);
    CHECK(st == PDDE_ERR_BUILD, "broken kernel: got %s (%s)", pdde_status_str(st), pdde_last_error(ctx));
    CHECK(strstr(pdde_last_error(ctx), "undefined_thing") != NULL, "build log missing from: %.300s", pdde_last_error(ctx));
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
}

static const char usage[] = "usage: %s [--backend NAME | --plugin /path/lib.so] [--op NAME] [--perf] [-v]\n"
                            "  --plugin loads a backend plugin (backends/README.md) and tests its device; ops it does\n"
                            "  not run are counted as unsupported, not failed (they fall back to the CPU); so are a\n"
                            "  plugin's from PDDE_BACKEND_PLUGINS, whose devices --backend NAME selects\n";

/* Whether backend is one of pdde's own (not a plugin's). */
static bool builtin_backend(const char *backend) {
    static const char *const builtin[] = {"cpu", "opencl", "cuda", "level_zero"};
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (!strcmp(builtin[i], backend)) return true;
    return false;
}

/* Whether name is an op (pdde_op_name) or a case of this suite ("attention"). */
static bool known_op(const char *name) {
    for (int o = 0; o < PDDE_OP_COUNT; o++)
        if (!strcmp(pdde_op_name((pdde_op)o), name)) return true;
    for (int ci = 0; ci < N_CASES; ci++)
        if (!strcmp(cases[ci].op, name)) return true;
    return false;
}

/* Without -v the library's info lines (one per case that moved nodes to the CPU: hundreds) are counted, not
 * printed; its warnings are printed */
static void count_log_line(pdde_log_level level, const char *line, void *user) {
    if (level == PDDE_LOG_WARN) fprintf(stderr, "%s\n", line);
    else ++*(long *)user;
}

int main(int argc, char **argv) {
    options o = {0};
    const char *plugin = NULL;
    static long log_lines;
    /* lowering's fusions off unless the environment sets them (on CUDA some are on by default in bf16): the
     * device runs the graph the CPU's reference runs; the fused cases set theirs */
    static const char *const fusions[] = {"PDDE_FUSE_EPILOGUE", "PDDE_FUSE_GRAD", "PDDE_FUSE_ADD_LN", "PDDE_BF16_LOGITS",
                                          "PDDE_BF16_GRADS",    "PDDE_ATT_LOWP",  "PDDE_FUSE_GELU"};
    for (size_t i = 0; i < sizeof fusions / sizeof fusions[0]; i++) setenv(fusions[i], "0", 0);
    const char *lowp_bias = getenv("PDDE_CUDA_LT_LOWP_BIAS");
    if (lowp_bias) snprintf(g_lowp_bias_outside, sizeof g_lowp_bias_outside, "%s", lowp_bias);
    for (int k = 0; k < 2; k++) {
        const char *ln2 = getenv(k ? "PDDE_OPENCL_LN2" : "PDDE_CUDA_LN2");
        if (ln2) snprintf(g_ln2_outside[k], sizeof g_ln2_outside[k], "%s", ln2);
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc) o.backend = argv[++i];
        else if (!strcmp(argv[i], "--plugin") && i + 1 < argc) plugin = argv[++i];
        else if (!strcmp(argv[i], "--op") && i + 1 < argc) o.op = argv[++i];
        else if (!strcmp(argv[i], "--perf")) o.perf = 1;
        else if (!strcmp(argv[i], "-v")) o.verbose = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) { printf(usage, argv[0]); return 0; }
        else {
            fprintf(stderr, "test_backend_ops: unknown argument '%s'\n", argv[i]);
            fprintf(stderr, usage, argv[0]);
            return 2;
        }
    }
    if (!o.verbose) pdde_log_set(count_log_line, &log_lines);
    const char *salt = getenv("PDDE_TEST_SEED");
    if (salt && salt[0]) {
        char *end;
        g_seed_salt = strtoull(salt, &end, 10);
        if (*end || salt[0] == '-') {
            fprintf(stderr, "test_backend_ops: PDDE_TEST_SEED=%s: not a non-negative integer\n", salt);
            return 2;
        }
        printf("inputs salted by PDDE_TEST_SEED=%llu\n", (unsigned long long)g_seed_salt);
    }
    for (int ci = 0; ci < N_CASES && o.op; ci++) o.op_has_cases |= !strcmp(cases[ci].op, o.op);
    if (o.op && !known_op(o.op)) {
        fprintf(stderr, "test_backend_ops: --op %s: no such op (pdde_op_name's names, or attention)\n", o.op);
        return 2;
    }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backend_plugins = plugin;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK) { CHECK(0, "context_init"); return test_finish(); }
    o.ctx = ctx;
    bool backend_known = !o.backend;
    for (int b = 0; b < pdde_backend_count(ctx); b++) {
        const char *why;
        pdde_status st = pdde_backend_status(ctx, b, &why);
        printf("backend %-10s %s%s\n", pdde_backend_name(ctx, b), st == PDDE_OK ? "available" : "unavailable: ", st == PDDE_OK ? "" : why);
        backend_known |= o.backend && !strcmp(pdde_backend_name(ctx, b), o.backend);
    }
    if (plugin) { /* the plugin is the last family: test its devices */
        const char *why;
        int last = pdde_backend_count(ctx) - 1;
        if (pdde_backend_status(ctx, last, &why) != PDDE_OK) {
            fprintf(stderr, "test_backend_ops: --plugin %s: %s\n", plugin, why);
            pdde_context_free(ctx);
            return 1;
        }
        if (o.backend && strcmp(o.backend, pdde_backend_name(ctx, last))) {
            fprintf(stderr, "test_backend_ops: --backend %s, but the plugin's backend is %s\n", o.backend, pdde_backend_name(ctx, last));
            pdde_context_free(ctx);
            return 2;
        }
        o.backend = pdde_backend_name(ctx, last);
    } else if (!backend_known) {
        fprintf(stderr, "test_backend_ops: --backend %s: no such backend in this build (see the list above; an out-of-tree one needs --plugin or PDDE_BACKEND_PLUGINS)\n",
                o.backend);
        pdde_context_free(ctx);
        return 2;
    }
    /* the devices under test: every device but the CPU reference, unless --backend cpu */
    int devs[64], n_devs = 0;
    char all_devices[1024] = "";
    for (int d = 0, len = 0; d < pdde_device_count(ctx) && n_devs < 64; d++) {
        pdde_device_props p;
        if (pdde_device_get_props(ctx, d, &p) != PDDE_OK) continue;
        if (len < (int)sizeof all_devices)
            len += snprintf(all_devices + len, sizeof all_devices - (size_t)len, "%s%d %s (backend %s)", d ? ", " : "", d, p.name, p.backend);
        if (o.backend ? strcmp(p.backend, o.backend) != 0 : (d == 0 && !o.perf)) continue;
        printf("device %d: %s (%s)\n", d, p.name, p.backend);
        devs[n_devs++] = d;
    }
    if (n_devs == 0 && o.backend) { /* (a backend asked for and not tested is no pass) */
        fprintf(stderr, "test_backend_ops: --backend %s: no device reports backend %s; the devices: %s. A plugin's devices must report "
                        "its vtable's .name as device_props.backend\n", o.backend, o.backend, all_devices);
        pdde_context_free(ctx);
        return 1;
    }
    if (n_devs == 0) test_skip("opencl", "no device to test besides the CPU");
    if (!o.perf) test_seeds_by_identity();
    double t0 = now_s();
    for (int k = 0; k < n_devs; k++) {
        double td = now_s();
        int passed0 = test_passed, failed0 = test_failed;
        /* the built-in backends run every op of the suite; a plugin's device (from --plugin or
         * PDDE_BACKEND_PLUGINS) may leave ops to the CPU: those are counted, not failed */
        pdde_device_props under_test;
        o.strict = pdde_device_get_props(ctx, devs[k], &under_test) != PDDE_OK || builtin_backend(under_test.backend);
        for (int ci = 0; ci < N_CASES; ci++) {
            const op_case *c = &cases[ci];
            if (o.perf) { if (c->grad != 3) run_case(&o, ci, devs[k], 0); continue; }
            if (c->grad == 3) { run_case(&o, ci, devs[k], 2); continue; }
            run_case(&o, ci, devs[k], 0);
            if (c->grad) run_case(&o, ci, devs[k], 1);
        }
        if (!o.perf && !o.op) {
            pdde_device_props p;
            pdde_device_get_props(ctx, devs[k], &p);
            if (!strcmp(p.backend, "opencl")) {
                test_errors(ctx, devs[k], p.backend);
                test_build_failure(devs[k]);
            }
        }
        if (!o.perf && !o.op) test_vocab_offset(ctx, devs[k]);
        if (!o.perf && (!o.op || !strcmp(o.op, "attention")))
            test_fused_attention(&o, devs[k]), test_packed_attention(&o, devs[k]), test_docs_attention(&o, devs[k]);
        if (!o.perf && (!o.op || !strcmp(o.op, "adamw_update"))) test_multi_tensor_adamw(&o, devs[k]);
        if (!o.perf && (!o.op || !strcmp(o.op, "adamw_update") || !strcmp(o.op, "sgd_update"))) test_update_nonfinite_norm(&o, devs[k]);
        if (!o.perf && (!o.op || !strcmp(o.op, "bias_gelu"))) test_fused_bias_gelu(&o, devs[k]);
        if (!o.perf && (!o.op || !strcmp(o.op, "rope"))) test_rope_reference(&o, devs[k]);
        if (!o.perf && (!o.op || !strcmp(o.op, "sum_to"))) test_bias_grad_sums(&o, devs[k]), test_sum_to_shapes(&o, devs[k]);
        if (!o.perf && (!o.op || !strcmp(o.op, "sum_to") || !strcmp(o.op, "matmul"))) test_fused_bias_grad(&o, devs[k]);
        if (!o.perf) printf("device %d: %d passed, %d failed, %d cases of ops it does not run (%.1fs)\n", devs[k], test_passed - passed0,
                            test_failed - failed0, n_unsupported, now_s() - td);
        n_unsupported = 0;
    }
    o.strict = 1; /* (the CPU's own checks below) */
    if (!o.perf && !o.op && !o.backend) test_vocab_offset(ctx, 0); /* the CPU, the reference (not among devs) */
    if (!o.perf && (!o.op || !strcmp(o.op, "attention")) && !o.backend)
        test_fused_attention(&o, 0), test_packed_attention(&o, 0), test_docs_attention(&o, 0);
    if (!o.perf && (!o.op || !strcmp(o.op, "adamw_update")) && !o.backend) test_multi_tensor_adamw(&o, 0);
    if (!o.perf && (!o.op || !strcmp(o.op, "adamw_update") || !strcmp(o.op, "sgd_update")) && !o.backend) test_update_nonfinite_norm(&o, 0);
    if (!o.perf && (!o.op || !strcmp(o.op, "bias_gelu")) && !o.backend) test_fused_bias_gelu(&o, 0);
    if (!o.perf && (!o.op || !strcmp(o.op, "rope")) && !o.backend) test_rope_reference(&o, 0);
    if (!o.perf && (!o.op || !strcmp(o.op, "sum_to")) && !o.backend) test_bias_grad_sums(&o, 0), test_sum_to_shapes(&o, 0);
    if (!o.perf && (!o.op || !strcmp(o.op, "sum_to") || !strcmp(o.op, "matmul")) && !o.backend) test_fused_bias_grad(&o, 0);
    if (o.verbose) printf("total %.1fs\n", now_s() - t0);
    pdde_context_free(ctx);
    if (log_lines) printf("the library logged %ld info lines (nodes moved to the CPU and the like): -v prints them\n", log_lines);
    return test_finish();
}
