/* backends/gpu_dispatch.h — op -> kernel launches, shared by the device backends (opencl.c, cuda.c,
 * level_zero.c).
 *
 * The backends carry the same kernel set (backends/cuda_kernels.cu in CUDA C; backends/gpu_kernels.cl
 * in OpenCL C for OpenCL and Level Zero: the same kernels with the same names and argument lists), so
 * what a backend runs, which kernels an op needs, their shapes and their arguments are decided once,
 * here, and this is the one place that reads the nodes' op parameters for them. A backend supplies a
 * pgd_ctx: how to launch kernel k with a grid of groups, a per-stream scratch buffer, a 32-bit fill, a
 * device copy and optionally a vendor GEMM.
 *
 * Tensors are contiguous row-major; the struct kernel arguments below are mirrored field for field
 * in both kernel sources. */
#ifndef PDDE_GPU_DISPATCH_H
#define PDDE_GPU_DISPATCH_H

#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../pdde_extension.h" /* the backend vtable and the named op parameters */
#include "flash_f32_tiles.h"   /* the f32 tiled attention kernels' launch shape (CUDA) */

/* A device address: a buffer (the backend's buffer handle, as in pdde_tensor.data) and a byte offset into
 * it; base 0 is a null pointer. CUDA and Level Zero add the two into one pointer (pgd_addr); OpenCL
 * passes both, since a cl_mem has no address. */
typedef struct { uint64_t base, off; } pgd_ptr;
/* A kernel argument: its value and size; is_ptr 1 marks a pgd_ptr, PGD_ARG_LOCAL a group's local (shared) memory of
 * size bytes (PGD_LOCAL: OpenCL's __local argument, CUDA's dynamic shared memory; the last argument, and only where
 * pgd_ctx.max_local holds it). */
enum { PGD_ARG_LOCAL = 2 };
typedef struct { const void *p; size_t size; int is_ptr; } pgd_arg;

static inline uint64_t pgd_addr(pgd_ptr p) { return p.base ? p.base + p.off : 0; }
static inline pgd_ptr pgd_at(pgd_ptr p, int64_t bytes) { return (pgd_ptr){p.base, p.off + (uint64_t)bytes}; }

enum {
    PGD_K_UNARY, PGD_K_UNARY_BACK, PGD_K_BINARY, PGD_K_BINARY_BCAST, PGD_K_GATHER, PGD_K_COPY2D,
    PGD_K_REDUCE_THREAD, PGD_K_REDUCE_BLOCK, PGD_K_COLSUM, PGD_K_SUM_PARTIAL, PGD_K_SUM_FINAL,
    PGD_K_LAYERNORM, PGD_K_LAYERNORM_BACK, PGD_K_RMSNORM, PGD_K_RMSNORM_BACK, PGD_K_ROW_STATS,
    PGD_K_GAMMA_BACK, PGD_K_SOFTMAX, PGD_K_SOFTMAX_BACK, PGD_K_CE_ROWS, PGD_K_CE_FINAL, PGD_K_CE_COUNT,
    PGD_K_CE_BACK, PGD_K_EMBEDDING, PGD_K_EMBEDDING_BACK, PGD_K_DROPOUT, PGD_K_CAST, PGD_K_SGD,
    PGD_K_ADAMW, PGD_K_GEMM, PGD_K_ATTENTION, PGD_K_ATTENTION_BACK_Q, PGD_K_ATTENTION_BACK_KV,
    PGD_K_ADAMW_MULTI, PGD_K_BIAS_GELU, PGD_K_ATT_SOFTMAX, PGD_K_ATT_DSOFTMAX, PGD_K_FLASH_ROWDOT,
    PGD_K_FLASH_FWD, PGD_K_FLASH_FWD_D128, PGD_K_FLASH_BACK_DQ, PGD_K_FLASH_BACK_DQ_D128, PGD_K_FLASH_BACK_DKV,
    PGD_K_FLASH_BACK_DKV_D128, PGD_K_ATT_REPACK,
    /* Mixture-of-Experts (gpu_moe.h) */
    PGD_K_MOE_LAYOUT, PGD_K_MOE_TOPK, PGD_K_MOE_GATE, PGD_K_MOE_DISPATCH, PGD_K_MOE_COMBINE, PGD_K_MOE_COMBINE_BACK_W,
    PGD_K_MOE_GEMM, PGD_K_MOE_GEMM_BACK_W, PGD_K_MOE_AUX_LOSS, PGD_K_MOE_AUX_LOSS_BACK,
    /* memory-bound kernels: the fused cross-entropy (lowering's PDDE_FUSE_CE), the column sums in two levels and the
     * multi-tensor AdamW in chunks, the fused cross-entropy staging each row in local memory (the backends' switches:
     * pgd_ctx.mem_kernels) */
    PGD_K_CE_FUSED, PGD_K_COLSUM2, PGD_K_ADAMW_CHUNKS, PGD_K_CE_STAGED,
    /* the reproducible embedding backward (pgd_ctx.embedding_back) */
    PGD_K_EMBEDDING_SORT, PGD_K_EMBEDDING_COUNT_SORT, PGD_K_EMBEDDING_BACK_ROWS, PGD_K_EMBEDDING_KEYS,
    PGD_K_EMBEDDING_RADIX_COUNT, PGD_K_EMBEDDING_RADIX_SCAN, PGD_K_EMBEDDING_RADIX_SCATTER,
    /* layernorm with a warp (32 items) per row (pgd_ctx.mem_kernels PGD_MEM_LN2), for rows of up to 768 columns and,
     * in PGD_LN2_WIDTHS's order, the wider instances (each kernel's instances consecutive) */
    PGD_K_LAYERNORM2, PGD_K_LAYERNORM2_1024, PGD_K_LAYERNORM2_1664, PGD_K_LAYERNORM2_2048,
    PGD_K_LAYERNORM_BACK2, PGD_K_LAYERNORM_BACK2_1024, PGD_K_LAYERNORM_BACK2_1664, PGD_K_LAYERNORM_BACK2_2048,
    PGD_K_LAYERNORM_GAMMA2, PGD_K_LAYERNORM_GAMMA2_1024, PGD_K_LAYERNORM_GAMMA2_1664, PGD_K_LAYERNORM_GAMMA2_2048,
    PGD_K_ROPE, /* rotary position embedding (pgd_rope) */
    PGD_K_COUNT
};
static const char *const pgd_kernel_names[PGD_K_COUNT] = {
    "k_unary", "k_unary_back", "k_binary", "k_binary_bcast", "k_gather", "k_copy2d",
    "k_reduce_thread", "k_reduce_block", "k_colsum", "k_sum_partial", "k_sum_final",
    "k_layernorm", "k_layernorm_back", "k_rmsnorm", "k_rmsnorm_back", "k_row_stats",
    "k_gamma_back", "k_softmax", "k_softmax_back", "k_ce_rows", "k_ce_final", "k_ce_count",
    "k_ce_back", "k_embedding", "k_embedding_back", "k_dropout", "k_cast", "k_sgd",
    "k_adamw", "k_gemm", "k_attention", "k_attention_back_q", "k_attention_back_kv",
    "k_adamw_multi", "k_bias_gelu", "k_att_softmax", "k_att_dsoftmax", "k_flash_rowdot",
    "k_flash_fwd", "k_flash_fwd_d128", "k_flash_back_dq", "k_flash_back_dq_d128", "k_flash_back_dkv",
    "k_flash_back_dkv_d128", "k_att_repack",
    /* Mixture-of-Experts */
    "k_moe_layout", "k_moe_topk", "k_moe_gate", "k_moe_dispatch", "k_moe_combine", "k_moe_combine_back_w",
    "k_moe_gemm", "k_moe_gemm_back_w", "k_moe_aux_loss", "k_moe_aux_loss_back",
    "k_ce_fused", "k_colsum2", "k_adamw_chunks", "k_ce_staged",
    "k_embedding_sort", "k_embedding_count_sort", "k_embedding_back_rows", "k_embedding_keys",
    "k_embedding_radix_count", "k_embedding_radix_scan", "k_embedding_radix_scatter",
    "k_layernorm2", "k_layernorm2_1024", "k_layernorm2_1664", "k_layernorm2_2048",
    "k_layernorm_back2", "k_layernorm_back2_1024", "k_layernorm_back2_1664", "k_layernorm_back2_2048",
    "k_layernorm_gamma2", "k_layernorm_gamma2_1024", "k_layernorm_gamma2_1664", "k_layernorm_gamma2_2048",
    "k_rope",
};
/* Kernels only the CUDA backend has (the flash2 attention backward, PGD_FLASH2 in pgd_ctx.has_flash; the
 * f32 tiled attention, PGD_FLASH_F32_NAMED), numbered after PGD_K_COUNT: the other backends build
 * PGD_K_COUNT kernels and are never sent these. */
enum {
    PGD_K_FLASH2_PREP = PGD_K_COUNT, PGD_K_FLASH2_PREP_D128, PGD_K_FLASH2_BACK, PGD_K_FLASH2_BACK_D128, PGD_K_FLASH2_BACK_QKV,
    PGD_K_FLASH2_BACK_QKV_D128, PGD_K_FLASH2_FWD, PGD_K_FLASH2_FWD_QKV,
    PGD_K_FLASH_F32_FWD, PGD_K_FLASH_F32_FWD_D128, PGD_K_FLASH_F32_BACK_DQ, PGD_K_FLASH_F32_BACK_DQ_D128, PGD_K_FLASH_F32_BACK_DKV,
    PGD_K_FLASH_F32_BACK_DKV_D128, PGD_K_FLASH_F32_ZERO_DQ, PGD_K_FLASH_F32_BACK2, PGD_K_FLASH_F32_BACK2_D128,
    PGD_K_ADAMW_VEC, PGD_K_BIAS_GELU2, /* (PGD_MEM_ADAMW_VEC, PGD_MEM_GELU2) */
    /* flash2's variants (pgd_ctx.flash2_variant); the dqs kernels in k_flash2_back's order (+ 2 packed + d128) */
    PGD_K_FLASH2_BACK_K128, PGD_K_FLASH2_BACK_QKV_K128, PGD_K_FLASH2_BACK_DQS, PGD_K_FLASH2_BACK_D128_DQS, PGD_K_FLASH2_BACK_QKV_DQS,
    PGD_K_FLASH2_BACK_QKV_D128_DQS, PGD_K_FLASH2_FWD_Q128, PGD_K_FLASH2_FWD_QKV_Q128,
    /* flash2's kernels that take starts (*_docs: the same, and then starts and heads), in the order of those above
     * (pgd_flash2_docs) */
    PGD_K_FLASH2_BACK_DOCS, PGD_K_FLASH2_BACK_D128_DOCS, PGD_K_FLASH2_BACK_QKV_DOCS, PGD_K_FLASH2_BACK_QKV_D128_DOCS,
    PGD_K_FLASH2_FWD_DOCS, PGD_K_FLASH2_FWD_QKV_DOCS,
    PGD_K_FLASH2_BACK_K128_DOCS, PGD_K_FLASH2_BACK_QKV_K128_DOCS, PGD_K_FLASH2_BACK_DQS_DOCS, PGD_K_FLASH2_BACK_D128_DQS_DOCS,
    PGD_K_FLASH2_BACK_QKV_DQS_DOCS, PGD_K_FLASH2_BACK_QKV_D128_DQS_DOCS, PGD_K_FLASH2_FWD_Q128_DOCS, PGD_K_FLASH2_FWD_QKV_Q128_DOCS,
    PGD_K_CUDA_COUNT
};
static const char *const pgd_cuda_kernel_names[PGD_K_CUDA_COUNT - PGD_K_COUNT] = {
    "k_flash2_prep", "k_flash2_prep_d128", "k_flash2_back", "k_flash2_back_d128", "k_flash2_back_qkv", "k_flash2_back_qkv_d128",
    "k_flash2_fwd", "k_flash2_fwd_qkv",
    "k_flash_f32_fwd", "k_flash_f32_fwd_d128", "k_flash_f32_back_dq", "k_flash_f32_back_dq_d128", "k_flash_f32_back_dkv",
    "k_flash_f32_back_dkv_d128", "k_flash_f32_zero_dq", "k_flash_f32_back2", "k_flash_f32_back2_d128",
    "k_adamw_vec", "k_bias_gelu2",
    "k_flash2_back_k128", "k_flash2_back_qkv_k128", "k_flash2_back_dqs", "k_flash2_back_d128_dqs", "k_flash2_back_qkv_dqs",
    "k_flash2_back_qkv_d128_dqs", "k_flash2_fwd_q128", "k_flash2_fwd_qkv_q128",
    "k_flash2_back_docs", "k_flash2_back_d128_docs", "k_flash2_back_qkv_docs", "k_flash2_back_qkv_d128_docs",
    "k_flash2_fwd_docs", "k_flash2_fwd_qkv_docs",
    "k_flash2_back_k128_docs", "k_flash2_back_qkv_k128_docs", "k_flash2_back_dqs_docs", "k_flash2_back_d128_dqs_docs",
    "k_flash2_back_qkv_dqs_docs", "k_flash2_back_qkv_d128_dqs_docs", "k_flash2_fwd_q128_docs", "k_flash2_fwd_qkv_q128_docs",
};
static inline const char *pgd_kernel_name(int k) {
    return k < PGD_K_COUNT ? pgd_kernel_names[k] : k < PGD_K_CUDA_COUNT ? pgd_cuda_kernel_names[k - PGD_K_COUNT] : "?";
}
/* flash2's kernel k (back, fwd and their variants; not prep) as the twin that takes starts */
static inline int pgd_flash2_docs(int k) {
    return k < PGD_K_FLASH2_BACK_K128 ? k - PGD_K_FLASH2_BACK + PGD_K_FLASH2_BACK_DOCS : k - PGD_K_FLASH2_BACK_K128 + PGD_K_FLASH2_BACK_K128_DOCS;
}

/* The largest head dim of the attention kernels: an item keeps a few rows of D floats in registers
 * (PGD_ATT_DMAX in both kernel sources); larger heads run on the CPU. */
#define PGD_ATT_DMAX 128

#define PGD_MAX_DIMS 6
/* Broadcast / gather: for an output of ndim dims, sa/sb are the element strides of the two inputs
 * for each output dim (0 on a broadcast dim). */
typedef struct {
    int64_t ndim;
    int64_t shape[PGD_MAX_DIMS];
    int64_t sa[PGD_MAX_DIMS];
    int64_t sb[PGD_MAX_DIMS];
} pgd_shape;
/* Reduction: kept dims (the output's, with their strides in the input) and reduced dims. */
typedef struct {
    int64_t nk, nr;
    int64_t kshape[PGD_MAX_DIMS], kstride[PGD_MAX_DIMS];
    int64_t rshape[PGD_MAX_DIMS], rstride[PGD_MAX_DIMS];
} pgd_reduce_desc;

/* Multi-tensor AdamW (k_adamw_multi): up to PGD_MULTI_MAX tensors a launch, passed by value (within
 * the 1 KiB of kernel arguments OpenCL guarantees), as element offsets from the start of the buffer
 * holding the parameters and moments (the session's persistent buffer) and of the one holding the
 * gradients (the same, or the activation arena where a reduction wrote them). */
#define PGD_MULTI_MAX 16
#define PGD_ADAMW_CHUNK 4096 /* elements a group of k_adamw_chunks (ADAMW_CHUNK in both kernel sources) */
typedef struct {
    int64_t n[PGD_MULTI_MAX], p[PGD_MULTI_MAX], g[PGD_MULTI_MAX], m[PGD_MULTI_MAX], v[PGD_MULTI_MAX];
    int64_t s[PGD_MULTI_MAX]; /* the parameter's bf16/f16 copy (PDDE_P_UPDATE_SHADOW), in 2-byte elements; -1: none */
    float wd[PGD_MULTI_MAX];
} pgd_multi;

/* RoPE (k_rope): each pair's inverse frequency 1 / base^(2i/D), i < D/2, computed on the host by the CPU backend's
 * formula (so a device's angles t * inv are the CPU's, bit for bit: only its cosines and sines round otherwise) and
 * passed by value, within OpenCL's 1 KiB of kernel arguments: heads of up to 2 * PGD_ROPE_HALF_MAX (wider ones run
 * on the CPU). Mirrored in both kernel sources. */
#define PGD_ROPE_HALF_MAX 128
typedef struct { float inv[PGD_ROPE_HALF_MAX]; } pgd_rope_freqs;

enum { PGD_U_SCALE = 0, PGD_U_GELU, PGD_U_RELU, PGD_U_SILU };
enum { PGD_B_ADD = 0, PGD_B_SUB, PGD_B_MUL };

typedef struct {
    pdde_context *ctx;
    const char *name;     /* backend name, for messages */
    void *impl, *stream;  /* the backend's device and stream, passed back to the callbacks */
    unsigned units;       /* compute units (SMs, Xe cores): sizes grid-stride grids */
    int item_per_element; /* 1: elementwise grids have an item per element, as kernels built with
                             PGD_ITEM_PER_ELEMENT (OpenCL on a CPU) need */
    unsigned max_block;   /* the largest power-of-2 group of the row kernels (other launches use 256) */
    int (*launch)(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                  int nargs, const pgd_arg *args);
    int (*scratch)(void *impl, void *stream, size_t nbytes, pgd_ptr *out);
    int (*fill32)(void *impl, void *stream, pgd_ptr dst, uint32_t value, size_t count);
    int (*copy)(void *impl, void *stream, pgd_ptr dst, pgd_ptr src, size_t nbytes);
    /* optional: row-major batched C = op(A) op(B); returns 1 when it declines (then k_gemm runs) */
    int (*gemm)(void *impl, void *stream, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a, int64_t sA,
                pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch);
    /* optional: the same with a and b of dtype dt (bf16 or f16), f32 accumulation and C; returns 1 when
     * it declines (then the operands are widened and the f32 GEMM runs) */
    int (*gemm_lowp)(void *impl, void *stream, pdde_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a,
                     int64_t sA, pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch);
    /* Attention (pgd_attention): the backend's own switch (an environment variable read before
     * PDDE_ATTENTION; NULL: none), the path it takes when neither is set (PGD_ATT_*; a default of flash2
     * takes flash for nodes with starts, where flash2 runs them only when named), which q, k, v dtypes its tiled
     * kernels take (PGD_FLASH_* bits; 0: it has none) and their launch shape: query (key) rows a group
     * and items a group. */
    const char *attention_env;
    int attention_default, has_flash;
    unsigned flash_rows, flash_threads;
    unsigned flash2_variant; /* PGD_FLASH2_* variant bits of the flash2 kernels (0: the defaults): pgd_flash2_variant_env */
    /* optional: row-major batched D = op(A) op(B) [+ C] (beta 0 or 1; C f32 of D's layout, null: D itself)
     * [+ bias[N] on every row] with A and B of dtype dt, f32 accumulation, D of dtype ddt (f32, bf16, f16;
     * beta 1: f32), bias f32 (null: none), rounded once on the store; returns 1 when it declines (then
     * the GEMM and the epilogue run apart) */
    int (*gemm_epi)(void *impl, void *stream, pdde_dtype dt, pdde_dtype ddt, int ta, int tb, int64_t M, int64_t N, int64_t K,
                    pgd_ptr a, int64_t sA, pgd_ptr b, int64_t sB, pgd_ptr d, int64_t sD, int64_t batch, pgd_ptr bias, pgd_ptr c, float beta);
    /* optional: row-major D [M, N] = A op(B) with an activation epilogue (A, B of dtype dt, f32 accumulation, D
     * of dtype ddt): PDDE_MATMUL_GELU: X = A op(B) + bias[N] (f32) into aux, D = gelu(X); PDDE_MATMUL_DGELU: D =
     * (A op(B)) * gelu'(aux); aux of dtype xdt. Returns 1 when it declines (then the kernels run it) */
    int (*gemm_act)(void *impl, void *stream, int act, pdde_dtype dt, pdde_dtype ddt, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a,
                    pgd_ptr b, pgd_ptr d, pgd_ptr bias, pgd_ptr aux, pdde_dtype xdt);
    /* optional: row-major D [M, N] = op(A) B (f32) and bgrad [N] = the column sums of B [K, N] (f32), A and B
     * of dtype dt, f32 accumulation (lowering's PDDE_FUSE_BGRAD). Returns 1 when it declines (then the
     * column sums and the GEMM run apart) */
    int (*gemm_bgrad)(void *impl, void *stream, pdde_dtype dt, int ta, int64_t M, int64_t N, int64_t K, pgd_ptr a, pgd_ptr b, pgd_ptr d,
                      pgd_ptr bgrad);
    /* the memory-bound kernels it takes instead of the plain ones (PGD_MEM_* bits; 0: none): pgd_mem_kernels_env */
    unsigned mem_kernels;
    size_t max_local; /* bytes of local memory a group may take by a PGD_LOCAL argument (0: none) */
    int embedding_back; /* PGD_EMB_*: how the embedding backward adds dy into the table's gradient */
    int embedding_sort; /* PGD_EMB_SORT_*: how PGD_EMB_SORTED sorts the ids (0: by the ids' count and the device) */
} pgd_ctx;

/* k_colsum2 for column sums (bias gradients) and k_adamw_chunks for AdamW (grouped or single): 16-byte loads, more
 * loads in flight; k_ce_staged for the fused cross-entropy (each row read from device memory once, where it fits in
 * pgd_ctx.max_local); a backend gives its defaults (CUDA: the first two, measured faster on an H200 by
 * tools/bench/cuda_memk.sh; OpenCL: none, until a GPU run measures them there) and its variables turn each on ("1")
 * or off ("0"). CUDA's kernels only: PGD_MEM_ADAMW_VEC, k_adamw_chunks's chunks by k_adamw_vec (a few blocks a
 * multiprocessor, more loads in flight; PDDE_CUDA_ADAMW_VEC=1 sets it with PGD_MEM_ADAMW_CHUNKS); PGD_MEM_GELU2,
 * bias_gelu and its backward by k_bias_gelu2 (16-byte loads, 4 rows in flight). PGD_MEM_LN2: layernorm by k_layernorm2,
 * k_layernorm_back2 and k_layernorm_gamma2 (pgd_ln2_on: a row in a warp's registers, read once; off on every backend
 * until a GPU run measures it) */
enum { PGD_MEM_COLSUM2 = 1, PGD_MEM_ADAMW_CHUNKS = 2, PGD_MEM_CE1 = 4, PGD_MEM_ADAMW_VEC = 8, PGD_MEM_GELU2 = 16, PGD_MEM_LN2 = 32 };
static void pgd_say_once(int which, const char *fmt, const char *a, const char *b, const char *c);
/* The PGD_MEM_* bits: `defaults`, changed by <prefix>COLSUM2, <prefix>ADAMW_CHUNKS, <prefix>CE1, <prefix>LN2,
 * PDDE_CUDA_ADAMW_VEC and PDDE_CUDA_GELU2 (prefix: the backend's, as PDDE_CUDA_; "1" (on, true, yes) sets a switch's
 * bit and those it takes with it, "0" (off, false, no) clears its own, anything else is said once and changes nothing) */
static inline unsigned pgd_mem_kernels_env(const char *prefix, unsigned defaults) {
    static const struct { const char *name; unsigned bit, with; int cuda_only; } sw[] = {
        {"COLSUM2", PGD_MEM_COLSUM2, 0, 0}, {"ADAMW_CHUNKS", PGD_MEM_ADAMW_CHUNKS, 0, 0}, {"CE1", PGD_MEM_CE1, 0, 0},
        {"ADAMW_VEC", PGD_MEM_ADAMW_VEC, PGD_MEM_ADAMW_CHUNKS, 1}, {"GELU2", PGD_MEM_GELU2, 0, 1},
        {"LN2", PGD_MEM_LN2, 0, 0}};
    unsigned bits = defaults;
    for (size_t i = 0; i < sizeof sw / sizeof sw[0]; i++) {
        if (sw[i].cuda_only && strcmp(prefix, "PDDE_CUDA_")) continue;
        char name[64];
        snprintf(name, sizeof name, "%s%s", prefix, sw[i].name);
        const char *v = getenv(name);
        int on = v && (!strcmp(v, "1") || !strcasecmp(v, "on") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
        int off = v && (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "false") || !strcasecmp(v, "no"));
        if (on) bits |= sw[i].bit | sw[i].with;
        else if (off) bits &= ~sw[i].bit;
        else if (v && *v) /* (a measurement run with a typo would time the default unawares) */
            pgd_say_once(11 + (int)i, "%s=%s is not 1 or 0 (on/off, true/false, yes/no): %s", name, v,
                         bits & sw[i].bit ? "it stays on" : "it stays off");
    }
    return bits;
}

/* The embedding backward: PGD_EMB_ATOMIC adds every dy element into its row by a float atomic (fast where
 * ids repeat little, but the order of the adds is the device's: two runs differ in the last bits);
 * PGD_EMB_SORTED sorts the ids with their positions (k_embedding_sort) and sums each row's dy rows in the
 * order of the ids (k_embedding_back_rows): the CPU backend's order, so the same bits every run and as on
 * the CPU. A backend's default, or <prefix>EMBEDDING_BACK=atomic|sorted (prefix: the backend's, as
 * PDDE_CUDA_). */
enum { PGD_EMB_ATOMIC = 0, PGD_EMB_SORTED = 1 };
/* <prefix><suffix> as the index of its word in words[n] (an enum's order); unset: dflt; any other word: dflt,
 * said once (pgd_say_once's `which`; fmt given the variable's name, its word and `instead`) */
static inline int pgd_env_word(const char *prefix, const char *suffix, const char *const *words, int n, int dflt, int which,
                               const char *fmt, const char *instead) {
    char name[64];
    snprintf(name, sizeof name, "%s%s", prefix, suffix);
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, words[i])) return i;
    pgd_say_once(which, fmt, name, v, instead);
    return dflt;
}
static inline int pgd_embedding_back_env(const char *prefix, int dflt) {
    static const char *const words[] = {"atomic", "sorted"}; /* (PGD_EMB_*) */
    return pgd_env_word(prefix, "EMBEDDING_BACK", words, 2, dflt, 8, "%s=%s is not atomic or sorted: the embedding backward takes %s",
                        words[dflt]);
}

/* How PGD_EMB_SORTED sorts the keys: PGD_EMB_SORT_AUTO picks by the device and the ids' count (one item's
 * counting sort on a CPU device unless the table dwarfs the ids; else one group's bitonic network below
 * PGD_EMB_RADIX_MIN ids, the radix sort over many groups from there); <prefix>EMBEDDING_SORT=count|network|radix
 * forces one (tests run the GPUs' sorts on a CPU device so). */
enum { PGD_EMB_SORT_AUTO = 0, PGD_EMB_SORT_COUNT, PGD_EMB_SORT_NETWORK, PGD_EMB_SORT_RADIX };
static inline int pgd_embedding_sort_env(const char *prefix) {
    static const char *const words[] = {"auto", "count", "network", "radix"}; /* (PGD_EMB_SORT_*) */
    return pgd_env_word(prefix, "EMBEDDING_SORT", words, 4, PGD_EMB_SORT_AUTO, 9,
                        "%s=%s is not auto, count, network or radix: the embedding backward's sort is %s", "picked by the ids' count");
}

/* The attention paths: the row kernels (k_attention*: an item per query or key row), the unfused form
 * inside the node (vendor GEMMs and a causal softmax, pgd_attention_unfused), the tiled kernels
 * (k_flash_*: key and value tiles in group memory, online softmax), and flash2: the tiled forward with
 * a one-pass backward (k_flash2_*, where the backend has them: PGD_FLASH2; elsewhere it is flash). */
enum { PGD_ATT_ROWS = 0, PGD_ATT_UNFUSED, PGD_ATT_FLASH, PGD_ATT_FLASH2, PGD_ATT_COUNT };
enum { PGD_FLASH_BF16 = 1, PGD_FLASH_F32 = 2, PGD_FLASH2 = 4,
       PGD_FLASH_COPY = 8, /* the k_flash_* kernels take a last argument cp: their output also stored as bf16 there (NULL: not) */
       /* f32 q, k, v run on the backend's own f32 kernels (k_flash_f32_*, their shape in backends/flash_f32_tiles.h),
        * and only where the path is named: flash (dq and dk, dv kernels) or flash2 (flash's forward, the one-pass
        * backward k_flash_f32_back2, dq by atomics); by default f32 takes the backend's fallback (unfused) */
       PGD_FLASH_F32_NAMED = 16 };
/* The CUDA backend's attention settings (its pgd_ctx where the sm_80 kernels are loaded; here so that
 * tests/test_attention_dispatch.c checks the paths they give): the tiled bf16 kernels by default (f32
 * takes the unfused path unless PDDE_CUDA_ATTENTION or PDDE_ATTENTION names flash or flash2: then its
 * f32 tiled kernels, not yet measured on a GPU); tools/gpu-check.sh measured them correct and 2.1x faster than the unfused
 * graph on an H200, flash2 on q, k, v apart 1.34x flash, on the packed qkv 1.11x a GPT-2 step
 * (tools/bench/cuda_h200_results.md) */
#define PGD_CUDA_ATTENTION_ENV "PDDE_CUDA_ATTENTION"
#define PGD_CUDA_ATTENTION_DEFAULT PGD_ATT_FLASH2
#define PGD_CUDA_FLASH (PGD_FLASH_BF16 | PGD_FLASH2 | PGD_FLASH_COPY | PGD_FLASH_F32_NAMED)
/* ...and its memory-bound kernels (pgd_mem_kernels_env's defaults): both, measured faster on an H200 */
#define PGD_CUDA_MEM_KERNELS (PGD_MEM_COLSUM2 | PGD_MEM_ADAMW_CHUNKS)

/* flash2's variants, off until a GPU run measures them (backends/cuda_flash2.cuh; PDDE_FLASH2_VARIANT=NAME[,NAME]):
 * k128, the backward with 128 keys a group of 256 items (D 64; elsewhere the default), its dQ atomics halved;
 * dqsmem, the backward's dQ tile through group memory, added by coalesced atomics; q128, the forward with 128
 * query rows a group of 128 items (D 64). Names joined by , or +; k128 and dqsmem are both backward: k128 takes
 * precedence (dqsmem then runs at D 128). */
enum { PGD_FLASH2_K128 = 1, PGD_FLASH2_DQSMEM = 2, PGD_FLASH2_Q128 = 4 };
#define PGD_FLASH2_ROWS128 128      /* the keys (queries) a group of k128 (q128): FL2_K128_WARPS * 16, FL2_Q128_ROWS */
#define PGD_FLASH2_K128_THREADS 256 /* FL2_K128_WARPS * 32 */
static inline unsigned pgd_flash2_variant_env(void) {
    static const char *const words[] = {"k128", "dqsmem", "q128"}; /* (bit i: PGD_FLASH2_*) */
    const char *v = getenv("PDDE_FLASH2_VARIANT");
    unsigned bits = 0;
    for (const char *p = v; p && *p;) {
        size_t len = strcspn(p, ",+"); /* (+ too: tools/bench/cuda_switches.sh splits its specs at commas) */
        int hit = 0;
        for (int i = 0; i < 3; i++)
            if (len == strlen(words[i]) && !strncmp(p, words[i], len)) bits |= 1u << i, hit = 1;
        if (!hit && len) pgd_say_once(10, "%s=%s has a name other than k128, dqsmem, q128: %s", "PDDE_FLASH2_VARIANT", v, "it is ignored");
        p += len + (p[len] != 0);
    }
    return bits;
}

#define PGD_ARGS(...) (sizeof((pgd_arg[]){__VA_ARGS__}) / sizeof(pgd_arg)), ((pgd_arg[]){__VA_ARGS__})
#define PGD_A(v) {&(v), sizeof(v), 0}
#define PGD_P(v) {&(v), sizeof(v), 1}
#define PGD_LOCAL(bytes) {NULL, (bytes), PGD_ARG_LOCAL}

static inline pgd_ptr pgd_ptr_of(const pdde_tensor *t) { return (pgd_ptr){(uintptr_t)t->data, t->offset}; }
static const pgd_ptr pgd_null = {0, 0};

static int64_t pgd_numel(const pdde_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Whether a node is the vocab-parallel form of the embedding or cross-entropy (or their backward). */
static int pgd_vocab_split(const pdde_tensor *node) {
    return pdde_op_i32(node, PDDE_P_VOCAB_FIRST) != 0 || pdde_op_i32(node, PDDE_P_VOCAB_SIZE) != 0;
}

/* 1 if the device can run this node: every op of the enum in f32 (ids and targets i32), any cast, and
 * matmuls of two bf16 or two f16 operands (f32 output: mixed precision).
 * Vocab-parallel forms of the embedding and cross-entropy (PDDE_P_VOCAB_FIRST/SIZE set by an SPMD
 * session, which runs them on host memory) have no device kernels. */
/* A sum_to whose output is a trailing suffix of its input's shape: the rows summed (x as [rows, numel(y)]),
 * else 0 */
static int pgd_is_suffix(const pdde_tensor *b, const pdde_tensor *out);
static int64_t pgd_sum_to_rows(const pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int64_t n = pgd_numel(node);
    if (node->ndim > x->ndim || n < 1 || !pgd_is_suffix(node, x)) return 0;
    return pgd_numel(x) / n;
}

static int pgd_supports_op(const pdde_tensor *node) {
    if (!node || node->ndim > PGD_MAX_DIMS) return 0;
    if (node->op == PDDE_OP_NONE || (node->op >= PDDE_OP_COPY && node->op <= PDDE_OP_RECV))
        return 0; /* copies, collectives and pipeline sends are the core's */
    if (node->op >= PDDE_OP_MOE_TOPK && node->op <= PDDE_OP_MOE_AUX_LOSS_BACK) return 0; /* MoE: the CPU's (fallback) */
    if (node->op == PDDE_OP_ROPE) return 0; /* (where a backend offers it: pgd_supports_rope) */
    for (int i = 0; i < node->nsrc; i++)
        if (!node->src[i] || node->src[i]->ndim > PGD_MAX_DIMS) return 0;
    const pdde_tensor *a = node->nsrc > 0 ? node->src[0] : NULL, *b = node->nsrc > 1 ? node->src[1] : NULL;
    switch (node->op) {
    case PDDE_OP_CAST:
        return node->nsrc == 1 && (unsigned)a->dtype < PDDE_DTYPE_COUNT && (unsigned)node->dtype < PDDE_DTYPE_COUNT;
    case PDDE_OP_RESHAPE: return node->nsrc == 1 && (node->dtype == a->dtype || pdde_is_lowp_copy_view(node)); /* (a view: never run) */
    case PDDE_OP_EMBEDDING:
        if (node->nsrc != 2 || pgd_vocab_split(node)) return 0;
        break;
    case PDDE_OP_CROSS_ENTROPY: { /* logits, targets [, dloss, dlogits: written too, lowering's PDDE_FUSE_CE] */
        int32_t d = pdde_op_i32(node, PDDE_P_CE_DLOGITS);
        if (node->nsrc != 2 + 2 * (d != 0) || pgd_vocab_split(node)) return 0;
        if (d && (d - 1 != (int32_t)node->src[3]->dtype || (d - 1 != PDDE_F32 && d - 1 != PDDE_BF16 && d - 1 != PDDE_F16) ||
                  pgd_numel(node->src[3]) != pgd_numel(a) || node->src[2]->dtype != PDDE_F32))
            return 0;
        if (d) return node->dtype == PDDE_F32 && (a->dtype == PDDE_F32 || a->dtype == PDDE_BF16 || a->dtype == PDDE_F16) && b->dtype == PDDE_I32;
        break;
    }
    case PDDE_OP_CROSS_ENTROPY_BACK:
        if (node->nsrc != 3 || pgd_vocab_split(node)) return 0;
        break;
    case PDDE_OP_EMBEDDING_BACK: /* [base,] ids, dy */
        if (node->nsrc < 2 || node->nsrc > 3 || node->ndim != 2 || pgd_vocab_split(node)) return 0;
        break;
    case PDDE_OP_ATTENTION: case PDDE_OP_ATTENTION_BACK: {
        int64_t B, H, T, D;
        int packed = pdde_op_i32(node, PDDE_P_ATTENTION_QKV_D) > 0, docs = pdde_attention_starts(node) != NULL; /* (starts last) */
        if (node->nsrc != (node->op == PDDE_OP_ATTENTION ? 3 : 5) - (packed ? 2 : 0) + docs || a->ndim != (packed ? 3 : 4)) return 0;
        pdde_attention_dims(node, &B, &H, &T, &D, &packed);
        if (D > PGD_ATT_DMAX || (packed && a->shape[2] != 3 * H * D)) return 0;
        int32_t cdt = pdde_op_i32(node, PDDE_P_ATTENTION_LOWP_COPY); /* (a rounded copy of the output beside it: PDDE_ATT_LOWP) */
        if (cdt && (!packed || (cdt != PDDE_BF16 && cdt != PDDE_F16))) return 0;
        break;
    }
    case PDDE_OP_LAYERNORM: /* x, gamma [, beta] [, r added to x first: lowering's PDDE_FUSE_ADD_LN] */
        if (pdde_op_i32(node, PDDE_P_NORM_ADD_IN) && (node->nsrc != 4 || pgd_numel(node->src[3]) != pgd_numel(node))) return 0;
        if (!pdde_op_i32(node, PDDE_P_NORM_ADD_IN) && node->nsrc > 3) return 0;
        break;
    case PDDE_OP_LAYERNORM_BACK: /* x, gamma, dy [, the other gradient of x (lowering's PDDE_FUSE_ADD_LN)]; [a bf16 copy of dx] */
        if (node->nsrc == 4 && pgd_numel(node->src[3]) != pgd_numel(node)) return 0;
        if (pdde_op_i32(node, PDDE_P_NORM_LOWP_COPY) && pdde_op_i32(node, PDDE_P_NORM_LOWP_COPY) != PDDE_BF16 &&
            pdde_op_i32(node, PDDE_P_NORM_LOWP_COPY) != PDDE_F16)
            return 0; /* (its rounded copy: PDDE_BF16_GRADS) */
        break;
    case PDDE_OP_GRAD_ACCUM: /* acc += g, or (lowering's PDDE_FUSE_GRAD) acc [M, N] += op(A) op(B) of 2-D A and B of one dtype */
        if (node->nsrc == 3)
            return node->ndim == 2 && a->dtype == PDDE_F32 && b->ndim == 2 && node->src[2]->ndim == 2 && b->dtype == node->src[2]->dtype &&
                   (b->dtype == PDDE_F32 || b->dtype == PDDE_BF16 || b->dtype == PDDE_F16) && node->dtype == PDDE_F32 &&
                   b->shape[pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) ? 1 : 0] == node->shape[0] &&
                   node->src[2]->shape[pdde_op_i32(node, PDDE_P_MATMUL_TRANS_B) ? 0 : 1] == node->shape[1];
        break;
    case PDDE_OP_MATMUL: { /* each operand one matrix (shared) or one per batch; [a bias [N]] [a residual] (lowering's fusions) */
        int residual = pdde_op_i32(node, PDDE_P_MATMUL_RESIDUAL) != 0, act = pdde_op_i32(node, PDDE_P_MATMUL_ACT);
        if (act) { /* (PDDE_FUSE_GELU: a bias and gelu(X) beside X, or X read for gelu'; one GEMM of a shared 2-D B) */
            const pdde_tensor *x3 = node->nsrc == 3 ? node->src[2] : NULL;
            if ((act != PDDE_MATMUL_GELU && act != PDDE_MATMUL_DGELU) || residual || !x3 || b->ndim != 2 || pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) ||
                node->ndim < 2 || a->ndim < 2)
                return 0;
            if (act == PDDE_MATMUL_GELU && (x3->dtype != PDDE_F32 || x3->ndim != 1 || x3->shape[0] != node->shape[node->ndim - 1])) return 0;
            if (act == PDDE_MATMUL_DGELU && (pgd_numel(x3) != pgd_numel(node) || (x3->dtype != PDDE_F32 && x3->dtype != PDDE_BF16 && x3->dtype != PDDE_F16)))
                return 0;
            if (a->dtype != b->dtype || (a->dtype != PDDE_F32 && a->dtype != PDDE_BF16 && a->dtype != PDDE_F16)) return 0;
            return node->dtype == PDDE_F32 || node->dtype == PDDE_BF16 || node->dtype == PDDE_F16;
        }
        if (pdde_op_i32(node, PDDE_P_MATMUL_BGRAD)) /* (PDDE_FUSE_BGRAD: 2-D, B not transposed, f32 out, a bias gradient beside) */
            return !residual && node->nsrc == 2 && node->ndim == 2 && a->ndim == 2 && b->ndim == 2 && !pdde_op_i32(node, PDDE_P_MATMUL_TRANS_B) &&
                   node->dtype == PDDE_F32 && a->dtype == b->dtype && (a->dtype == PDDE_F32 || a->dtype == PDDE_BF16 || a->dtype == PDDE_F16) &&
                   b->shape[1] == node->shape[1] && a->shape[pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) ? 1 : 0] == node->shape[0] &&
                   a->shape[pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) ? 0 : 1] == b->shape[0];
        if (node->nsrc - residual < 2 || node->nsrc - residual > 3 || node->ndim < 2 || a->ndim < 2 || b->ndim < 2) return 0;
        int64_t M = node->shape[node->ndim - 2], N = node->shape[node->ndim - 1];
        if (node->nsrc - residual == 3 && (node->src[2]->dtype != PDDE_F32 || node->src[2]->ndim != 1 || node->src[2]->shape[0] != N)) return 0;
        if (residual && (node->src[node->nsrc - 1]->dtype != PDDE_F32 || pgd_numel(node->src[node->nsrc - 1]) != pgd_numel(node))) return 0;
        int64_t K = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
        int64_t batch = M && N ? pgd_numel(node) / (M * N) : 0, ab = M && K ? pgd_numel(a) / (M * K) : 1,
                bb = K && N ? pgd_numel(b) / (K * N) : 1;
        if (batch && !((ab == 1 || ab == batch) && (bb == 1 || bb == batch))) return 0;
        break;
    }
    default: break;
    }
    /* layernorm, bias_gelu (and its backward) and cross_entropy_back also write bf16 / f16 (a cast folded into them), from f32 inputs */
    int lowp_out = (node->op == PDDE_OP_LAYERNORM || node->op == PDDE_OP_BIAS_GELU || node->op == PDDE_OP_BIAS_GELU_BACK || node->op == PDDE_OP_CROSS_ENTROPY_BACK ||
                    node->op == PDDE_OP_MATMUL) && (node->dtype == PDDE_BF16 || node->dtype == PDDE_F16);
    if ((unsigned)node->op >= PDDE_OP_COUNT || (node->dtype != PDDE_F32 && !lowp_out) || node->nsrc < 1) return 0;
    if (node->op == PDDE_OP_MATMUL && a->dtype == b->dtype && (a->dtype == PDDE_BF16 || a->dtype == PDDE_F16)) return 1;
    if ((node->op == PDDE_OP_ATTENTION || node->op == PDDE_OP_ATTENTION_BACK) && (a->dtype == PDDE_BF16 || a->dtype == PDDE_F16)) {
        int nin = pdde_op_i32(node, PDDE_P_ATTENTION_QKV_D) > 0 ? 1 : 3, nf = node->nsrc - (pdde_attention_starts(node) != NULL);
        for (int i = 0; i < nf; i++) /* q, k, v (or qkv) of a->dtype (pgd_attention widens them); y, dy f32; [starts i32] */
            if (node->src[i]->dtype != (i < nin ? a->dtype : PDDE_F32)) return 0;
        return 1;
    }
    if (node->op == PDDE_OP_SUM_TO && (a->dtype == PDDE_BF16 || a->dtype == PDDE_F16)) /* bf16 rows to an f32 suffix (PDDE_BF16_GRADS) */
        return pgd_sum_to_rows(node) > 1;
    int nsrc = node->nsrc;
    if ((node->op == PDDE_OP_SGD_UPDATE || node->op == PDDE_OP_ADAMW_UPDATE) && pdde_op_i32(node, PDDE_P_UPDATE_SHADOW)) {
        pdde_dtype sdt = node->src[--nsrc]->dtype; /* the parameter's copy the update rewrites */
        if (sdt != PDDE_BF16 && sdt != PDDE_F16) return 0;
    }
    /* (the op's facts out of the loop: this runs at every op) */
    int ce = node->op == PDDE_OP_CROSS_ENTROPY || node->op == PDDE_OP_CROSS_ENTROPY_BACK;
    int ids = ce || node->op == PDDE_OP_EMBEDDING ? 1 : node->op == PDDE_OP_EMBEDDING_BACK ? node->nsrc - 2 : -1; /* [base,] ids, dy */
    if ((node->op == PDDE_OP_ATTENTION || node->op == PDDE_OP_ATTENTION_BACK) && pdde_attention_starts(node)) ids = node->nsrc - 1;
    int lowp_logits = ce && (a->dtype == PDDE_BF16 || a->dtype == PDDE_F16); /* (PDDE_BF16_LOGITS) */
    for (int i = 0; i < nsrc; i++)
        if (node->src[i]->dtype != (i == ids ? PDDE_I32 : PDDE_F32) && !(i == 0 && lowp_logits)) return 0;
    return 1;
}

/* 1 if k_rope takes this rope node: x [B, T, H, D] f32, D even and at most 2 * PGD_ROPE_HALF_MAX, the output of x's
 * shape and dtype. Not in pgd_supports_op: each backend says whether it offers rope (OpenCL does; CUDA under its
 * switch, pgd_cuda_takes_rope; Level Zero not). The kernels also read and write bf16 and f16 (dt), but the graph builds
 * f32 rope only, all the conformance suite can check, so only f32 is taken. */
static inline int pgd_supports_rope(const pdde_tensor *node) {
    if (!node || node->op != PDDE_OP_ROPE || node->nsrc != 1 || !node->src[0] || node->ndim != 4) return 0;
    const pdde_tensor *x = node->src[0];
    if (x->ndim != 4 || x->dtype != PDDE_F32 || node->dtype != PDDE_F32) return 0;
    for (int d = 0; d < 4; d++)
        if (x->shape[d] != node->shape[d]) return 0;
    return x->shape[3] % 2 == 0 && x->shape[3] / 2 <= PGD_ROPE_HALF_MAX;
}

/* RoPE on the CUDA backend: k_rope has not run on a GPU yet, so CUDA takes rope only where PDDE_CUDA_ROPE=1
 * (rope_switch: that variable as backends/cuda.c reads it, pdde_env_bool with default 0); without it rope runs on the
 * CPU, with copies. Here so that tests/test_attention_dispatch.c checks the gate where there is no GPU. */
#define PGD_CUDA_ROPE_ENV "PDDE_CUDA_ROPE"
static inline int pgd_cuda_takes_rope(const pdde_tensor *node, int rope_switch) {
    return rope_switch == 1 && pgd_supports_rope(node);
}

static unsigned pgd_grid(const pgd_ctx *g, int64_t n, unsigned block) {
    int64_t b = (n + block - 1) / block, cap = (int64_t)(g->units ? g->units : 1) * 32;
    if (b > cap && !g->item_per_element) b = cap;
    return b < 1 ? 1u : (unsigned)b;
}

/* Group size for one group per row of C: ~4 elements a thread, a power of 2 in [32, max_block]. */
static unsigned pgd_row_block(const pgd_ctx *g, int64_t C) {
    unsigned t = 32;
    while (t < g->max_block && (int64_t)t * 4 < C) t *= 2;
    return t;
}

static unsigned pgd_rows_grid(int64_t rows) { return rows < 1 ? 1u : rows > 65535 ? 65535u : (unsigned)rows; }

static int pgd_launch(const pgd_ctx *g, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      int nargs, const pgd_arg *args) {
    return g->launch(g->impl, g->stream, k, gx, gy, gz, bx, by, nargs, args);
}

/* With an item per element, a grid of 256-wide groups holds at most this many. */
static int pgd_too_many(const pgd_ctx *g, int k, int64_t n) {
    if (!g->item_per_element || n <= (int64_t)UINT32_MAX / 256 * 256) return PDDE_OK;
    return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: %s over %lld elements: more than one launch holds", g->name,
                      pgd_kernel_name(k), (long long)n);
}

/* Elementwise launch of n items with 256-wide groups. */
static int pgd_launch_1d(const pgd_ctx *g, int k, int64_t n, int nargs, const pgd_arg *args) {
    int e = pgd_too_many(g, k, n);
    return e ? e : pgd_launch(g, k, pgd_grid(g, n, 256), 1, 1, 256, 1, nargs, args);
}

static int pgd_row_launch(const pgd_ctx *g, int k, int64_t rows, int64_t C, int nargs, const pgd_arg *args) {
    return pgd_launch(g, k, pgd_rows_grid(rows), 1, 1, pgd_row_block(g, C), 1, nargs, args);
}

/* t's shape right-aligned to nd dims, with contiguous strides (0 where broadcast onto out_shape). */
static void pgd_bcast_strides(const pdde_tensor *t, int nd, const int64_t *out_shape, int64_t *strides) {
    int64_t sh[PGD_MAX_DIMS];
    int off = nd - t->ndim;
    for (int i = 0; i < nd; i++) sh[i] = i < off ? 1 : t->shape[i - off];
    int64_t st = 1;
    for (int i = nd - 1; i >= 0; i--) {
        strides[i] = (sh[i] == 1 && out_shape[i] != 1) ? 0 : st;
        st *= sh[i];
    }
}

/* b is a suffix of out's shape (after dropping b's leading 1s): a bias repeated over leading dims. */
static int pgd_is_suffix(const pdde_tensor *b, const pdde_tensor *out) {
    int bi = 0;
    while (bi < b->ndim && b->shape[bi] == 1) bi++;
    int nb = b->ndim - bi;
    if (nb > out->ndim) return 0;
    for (int i = 0; i < nb; i++)
        if (b->shape[bi + i] != out->shape[out->ndim - nb + i]) return 0;
    return 1;
}

static int pgd_binary(const pgd_ctx *g, pdde_tensor *node, int op) {
    pdde_tensor *a = node->src[0], *b = node->src[1];
    int64_t n = pgd_numel(node);
    if (!n) return PDDE_OK;
    pgd_ptr pa = pgd_ptr_of(a), pb = pgd_ptr_of(b), py = pgd_ptr_of(node);
    int32_t opi = op;
    /* a not broadcast (equal counts of broadcast-compatible shapes) and b a trailing block */
    if (pgd_numel(a) == n && pgd_is_suffix(b, node)) {
        int64_t nb = pgd_numel(b);
        return pgd_launch_1d(g, PGD_K_BINARY, n, PGD_ARGS(PGD_P(pa), PGD_P(pb), PGD_P(py), PGD_A(n), PGD_A(nb), PGD_A(opi)));
    }
    pgd_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.ndim = node->ndim;
    for (int i = 0; i < node->ndim; i++) sh.shape[i] = node->shape[i];
    pgd_bcast_strides(a, node->ndim, node->shape, sh.sa);
    pgd_bcast_strides(b, node->ndim, node->shape, sh.sb);
    return pgd_launch_1d(g, PGD_K_BINARY_BCAST, n,
                         PGD_ARGS(PGD_P(pa), PGD_P(pb), PGD_P(py), PGD_A(n), PGD_A(sh), PGD_A(opi)));
}

static int pgd_unary(const pgd_ctx *g, pgd_ptr px, pgd_ptr py, int64_t n, int op, float a) {
    if (!n) return PDDE_OK;
    int32_t opi = op;
    /* (CUDA's k_unary moves 4 elements an item as a float4) */
    return pgd_launch_1d(g, PGD_K_UNARY, g->item_per_element ? n : (n + 3) / 4,
                         PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(n), PGD_A(opi), PGD_A(a)));
}

static int pgd_unary_back(const pgd_ctx *g, pdde_tensor *node, int op) {
    int64_t n = pgd_numel(node);
    if (!n) return PDDE_OK;
    pgd_ptr px = pgd_ptr_of(node->src[0]), pdy = pgd_ptr_of(node->src[1]), pdx = pgd_ptr_of(node);
    int32_t opi = op;
    return pgd_launch_1d(g, PGD_K_UNARY_BACK, n, PGD_ARGS(PGD_P(px), PGD_P(pdy), PGD_P(pdx), PGD_A(n), PGD_A(opi)));
}

/* Sum of (x or x^2) over n contiguous elements: y[0] = (prev ? prev[0] : 0) + scale * sum, in two passes. */
static int pgd_sum_all(const pgd_ctx *g, pgd_ptr px, int64_t n, int32_t square, pgd_ptr prev, float scale, pgd_ptr py) {
    int e = pgd_too_many(g, PGD_K_SUM_PARTIAL, n);
    if (e) return e;
    unsigned blocks = pgd_grid(g, n, 256);
    if (blocks > 1024 && !g->item_per_element) blocks = 1024;
    pgd_ptr part = pgd_null;
    e = g->scratch(g->impl, g->stream, (size_t)blocks * sizeof(float), &part);
    if (e) return e;
    e = pgd_launch(g, PGD_K_SUM_PARTIAL, blocks, 1, 1, 256, 1,
                   PGD_ARGS(PGD_P(px), PGD_A(n), PGD_A(square), PGD_P(part)));
    if (e) return e;
    int64_t np = blocks;
    return pgd_launch(g, PGD_K_SUM_FINAL, 1, 1, 1, 256, 1,
                      PGD_ARGS(PGD_P(part), PGD_A(np), PGD_P(prev), PGD_A(scale), PGD_P(py)));
}

/* y[j] = scale * sum_r x[r, j] over x [R, Cn]. Few columns and many rows (a bias gradient): the rows are
 * split into chunks summed by their own groups, then the chunk sums are summed (deterministic). */
/* Row chunks for a column reduction of [R, Cn] so that the groups fill the device (1 = no split). */
static int64_t pgd_row_chunks(const pgd_ctx *g, int64_t R, int64_t Cn) {
    int64_t colgroups = (Cn + 31) / 32, want = (int64_t)(g->units ? g->units : 1) * 4, chunks = 1;
    if (colgroups < want && R >= 512) {
        chunks = (want + colgroups - 1) / colgroups;
        if (chunks > R / 64) chunks = R / 64;
        if (chunks > 65535) chunks = 65535;
        if (chunks < 1) chunks = 1;
    }
    if (chunks > 1) {
        int64_t rpc = (R + chunks - 1) / chunks;
        chunks = (R + rpc - 1) / rpc;
    }
    return chunks;
}

/* k_colsum2's two levels (PGD_MEM_COLSUM2): row chunks of at least 64 rows so that about 8 groups a compute unit
 * read at once, their partial sums [chunks, Cn] then summed by k_colsum (one chunk: y directly). Cn a multiple of
 * 4 and x 16-byte aligned (8 for bf16 / f16), else 1 (declined, nothing enqueued). */
static int pgd_colsum2(const pgd_ctx *g, pgd_ptr px, pgd_ptr py, int64_t R, int64_t Cn, float scale, int32_t xdt) {
    if (Cn % 4 || (px.off % (xdt == (int32_t)PDDE_F32 ? 16 : 8)) || R < 1) return 1;
    int64_t colgroups = (Cn + 127) / 128, want = (int64_t)(g->units ? g->units : 1) * 8, chunks = (want + colgroups - 1) / colgroups;
    if (chunks > R / 64) chunks = R / 64;
    if (chunks > 65535) chunks = 65535;
    if (chunks < 1) chunks = 1;
    int64_t rpc = (R + chunks - 1) / chunks;
    chunks = (R + rpc - 1) / rpc;
    if (chunks == 1)
        return pgd_launch(g, PGD_K_COLSUM2, (unsigned)colgroups, 1, 1, 256, 1,
                          PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(R), PGD_A(Cn), PGD_A(scale), PGD_A(R), PGD_A(xdt)));
    pgd_ptr part = pgd_null;
    int e = g->scratch(g->impl, g->stream, (size_t)(chunks * Cn) * sizeof(float), &part);
    if (e) return e;
    float one = 1.0f;
    int32_t f32 = (int32_t)PDDE_F32;
    e = pgd_launch(g, PGD_K_COLSUM2, (unsigned)colgroups, (unsigned)chunks, 1, 256, 1,
                   PGD_ARGS(PGD_P(px), PGD_P(part), PGD_A(R), PGD_A(Cn), PGD_A(one), PGD_A(rpc), PGD_A(xdt)));
    if (e) return e;
    return pgd_launch(g, PGD_K_COLSUM, (unsigned)((Cn + 31) / 32), 1, 1, 32, 8,
                      PGD_ARGS(PGD_P(part), PGD_P(py), PGD_A(chunks), PGD_A(Cn), PGD_A(scale), PGD_A(chunks), PGD_A(f32)));
}

/* xdt: x's dtype (f32, or bf16 / f16: PDDE_BF16_GRADS's bias gradients), summed in f32 */
static int pgd_colsum(const pgd_ctx *g, pgd_ptr px, pgd_ptr py, int64_t R, int64_t Cn, float scale, int32_t xdt) {
    if (g->mem_kernels & PGD_MEM_COLSUM2) {
        int e = pgd_colsum2(g, px, py, R, Cn, scale, xdt);
        if (e != 1) return e;
    }
    int64_t colgroups = (Cn + 31) / 32, chunks = pgd_row_chunks(g, R, Cn);
    int32_t f32 = (int32_t)PDDE_F32;
    if (chunks == 1)
        return pgd_launch(g, PGD_K_COLSUM, (unsigned)colgroups, 1, 1, 32, 8,
                          PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(R), PGD_A(Cn), PGD_A(scale), PGD_A(R), PGD_A(xdt)));
    int64_t rpc = (R + chunks - 1) / chunks;
    pgd_ptr part = pgd_null;
    int e = g->scratch(g->impl, g->stream, (size_t)(chunks * Cn) * sizeof(float), &part);
    if (e) return e;
    float one = 1.0f;
    e = pgd_launch(g, PGD_K_COLSUM, (unsigned)colgroups, (unsigned)chunks, 1, 32, 8,
                   PGD_ARGS(PGD_P(px), PGD_P(part), PGD_A(R), PGD_A(Cn), PGD_A(one), PGD_A(rpc), PGD_A(xdt)));
    if (e) return e;
    return pgd_launch(g, PGD_K_COLSUM, (unsigned)colgroups, 1, 1, 32, 8,
                      PGD_ARGS(PGD_P(part), PGD_P(py), PGD_A(chunks), PGD_A(Cn), PGD_A(scale), PGD_A(chunks), PGD_A(f32)));
}

/* y = scale * sum of x over the dims marked in red[] (x's dims; y holds the kept ones in order). */
static int pgd_reduce(const pgd_ctx *g, pgd_ptr px, const int64_t *xshape, int nd, const int *red, pgd_ptr py,
                      float scale) {
    pgd_reduce_desc r;
    memset(&r, 0, sizeof r);
    int64_t stride[PGD_MAX_DIMS], st = 1, nout = 1, nred = 1;
    for (int i = nd - 1; i >= 0; i--) {
        stride[i] = st;
        st *= xshape[i];
    }
    int64_t n = st;
    if (!n) return PDDE_OK;
    int max_red = -1, min_kept = nd, max_kept = -1;
    for (int i = 0; i < nd; i++) {
        if (xshape[i] == 1) continue; /* size-1 dims neither add work nor move data */
        if (red[i]) {
            r.rshape[r.nr] = xshape[i];
            r.rstride[r.nr++] = stride[i];
            nred *= xshape[i];
            max_red = i;
        } else {
            r.kshape[r.nk] = xshape[i];
            r.kstride[r.nk++] = stride[i];
            nout *= xshape[i];
            if (i < min_kept) min_kept = i;
            max_kept = i;
        }
    }
    if (nout == 1) return pgd_sum_all(g, px, n, 0, pgd_null, scale, py);
    if (nred == 1) return pgd_unary(g, px, py, n, PGD_U_SCALE, scale);
    if (max_red < min_kept) return pgd_colsum(g, px, py, nred, nout, scale, (int32_t)PDDE_F32); /* reduced dims lead */
    if (max_red > max_kept) /* the innermost data is reduced: a group per output */
        return pgd_row_launch(g, PGD_K_REDUCE_BLOCK, nout, nred,
                              PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(nout), PGD_A(nred), PGD_A(r), PGD_A(scale)));
    return pgd_launch_1d(g, PGD_K_REDUCE_THREAD, nout,
                         PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(nout), PGD_A(nred), PGD_A(r), PGD_A(scale)));
}

/* Row-major batched C = op(A) op(B) (strides in elements, 0: shared) of operands of dtype dt, f32
 * accumulation and output: the vendor GEMM where the backend has one for dt and takes the shapes, else
 * (bf16 / f16) the operands widened to f32 in work (at least na + nb floats; a null work: the stream's
 * scratch) and the f32 vendor GEMM, else k_gemm. Widening is exact and the products of rounded
 * operands are exact in f32, so every route computes the same function. A caller that holds part of the
 * scratch itself reserves the widened operands' room only where they are widened: pgd_gemm_direct first,
 * then, where it returns 1, its room and pgd_gemm_widened. */
static int pgd_gemm_f32(const pgd_ctx *g, int32_t ta, int32_t tb, int64_t M, int64_t N, int64_t K, pgd_ptr pa, int64_t sA, pgd_ptr pb,
                        int64_t sB, pgd_ptr pc, int64_t sC, int64_t batch) {
    if (g->gemm) {
        int e = g->gemm(g->impl, g->stream, ta, tb, M, N, K, pa, sA, pb, sB, pc, sC, batch);
        if (e != 1) return e;
    }
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX)
        return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: a %lldx%lldx%lld matmul is too large for the built-in kernel", g->name,
                          (long long)M, (long long)N, (long long)K);
    int32_t Mi = (int32_t)M, Ni = (int32_t)N, Ki = (int32_t)K;
    for (int64_t b0 = 0; b0 < batch; b0 += 65535) {
        int64_t nb = batch - b0 < 65535 ? batch - b0 : 65535;
        pgd_ptr qa = pgd_at(pa, b0 * sA * 4), qb = pgd_at(pb, b0 * sB * 4), qc = pgd_at(pc, b0 * sC * 4);
        int e = pgd_launch(g, PGD_K_GEMM, (unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64), (unsigned)nb, 256, 1,
                           PGD_ARGS(PGD_P(qa), PGD_P(qb), PGD_P(qc), PGD_A(Mi), PGD_A(Ni), PGD_A(Ki), PGD_A(ta),
                                    PGD_A(tb), PGD_A(sA), PGD_A(sB), PGD_A(sC)));
        if (e) return e;
    }
    return PDDE_OK;
}

/* The f32 floats pgd_gemm_widened writes: the widened A and B */
static int64_t pgd_gemm_widened_floats(int64_t M, int64_t N, int64_t K, int64_t sA, int64_t sB, int64_t batch) {
    return (sA ? sA * (batch - 1) : 0) + M * K + (sB ? sB * (batch - 1) : 0) + K * N;
}

/* The GEMM where it needs no widened operands: an empty product (K 0: C zeroed), f32 operands, or bf16 / f16 ones
 * the backend's GEMM reads itself (gemm_lowp); 1 where nothing ran and the operands must be widened. */
static int pgd_gemm_direct(const pgd_ctx *g, pdde_dtype dt, int32_t ta, int32_t tb, int64_t M, int64_t N, int64_t K, pgd_ptr pa,
                           int64_t sA, pgd_ptr pb, int64_t sB, pgd_ptr pc, int64_t sC, int64_t batch) {
    if (!batch || !M || !N) return PDDE_OK;
    if (K == 0) {
        for (int64_t b0 = 0; b0 < batch; b0++) {
            int e = g->fill32(g->impl, g->stream, pgd_at(pc, b0 * sC * 4), 0, (size_t)(M * N));
            if (e) return e;
        }
        return PDDE_OK;
    }
    if (dt == PDDE_F32) return pgd_gemm_f32(g, ta, tb, M, N, K, pa, sA, pb, sB, pc, sC, batch);
    return g->gemm_lowp ? g->gemm_lowp(g->impl, g->stream, dt, ta, tb, M, N, K, pa, sA, pb, sB, pc, sC, batch) : 1;
}

/* The bf16 / f16 operands widened to f32 in work (pgd_gemm_widened_floats of them; a null work: the stream's scratch), then
 * the f32 GEMM (after pgd_gemm_direct returned 1) */
static int pgd_gemm_widened(const pgd_ctx *g, pdde_dtype dt, int32_t ta, int32_t tb, int64_t M, int64_t N, int64_t K, pgd_ptr pa,
                            int64_t sA, pgd_ptr pb, int64_t sB, pgd_ptr pc, int64_t sC, int64_t batch, pgd_ptr work) {
    int64_t na = (sA ? sA * (batch - 1) : 0) + M * K, nb = (sB ? sB * (batch - 1) : 0) + K * N;
    int32_t sdt = (int32_t)dt, ddt = (int32_t)PDDE_F32;
    int e = work.base ? PDDE_OK : g->scratch(g->impl, g->stream, (size_t)(na + nb) * sizeof(float), &work);
    pgd_ptr wa = work, wb = pgd_at(work, na * (int64_t)sizeof(float));
    if (!e) e = pgd_launch_1d(g, PGD_K_CAST, na, PGD_ARGS(PGD_P(pa), PGD_P(wa), PGD_A(na), PGD_A(sdt), PGD_A(ddt)));
    if (!e) e = pgd_launch_1d(g, PGD_K_CAST, nb, PGD_ARGS(PGD_P(pb), PGD_P(wb), PGD_A(nb), PGD_A(sdt), PGD_A(ddt)));
    return e ? e : pgd_gemm_f32(g, ta, tb, M, N, K, wa, sA, wb, sB, pc, sC, batch);
}

static int pgd_gemm_run(const pgd_ctx *g, pdde_dtype dt, int32_t ta, int32_t tb, int64_t M, int64_t N, int64_t K, pgd_ptr pa,
                        int64_t sA, pgd_ptr pb, int64_t sB, pgd_ptr pc, int64_t sC, int64_t batch, pgd_ptr work) {
    int e = pgd_gemm_direct(g, dt, ta, tb, M, N, K, pa, sA, pb, sB, pc, sC, batch);
    return e != 1 ? e : pgd_gemm_widened(g, dt, ta, tb, M, N, K, pa, sA, pb, sB, pc, sC, batch, work);
}

/* pgd_gemm_run for a caller holding the first held bytes of the stream's scratch (*scr), C there (c_held) or at pc: the
 * widened operands' room is reserved after them only where they are widened. The scratch may then move (*scr says
 * where it is), so the caller writes none of it before, and takes its pointers into it after. */
static int pgd_gemm_run_held(const pgd_ctx *g, pgd_ptr *scr, int64_t held, int c_held, pdde_dtype dt, int32_t ta, int32_t tb, int64_t M,
                             int64_t N, int64_t K, pgd_ptr pa, int64_t sA, pgd_ptr pb, int64_t sB, pgd_ptr pc, int64_t sC, int64_t batch) {
    int e = pgd_gemm_direct(g, dt, ta, tb, M, N, K, pa, sA, pb, sB, c_held ? *scr : pc, sC, batch);
    if (e != 1) return e;
    int64_t wbytes = pgd_gemm_widened_floats(M, N, K, sA, sB, batch) * (int64_t)sizeof(float);
    e = g->scratch(g->impl, g->stream, (size_t)(held + wbytes), scr);
    return e ? e : pgd_gemm_widened(g, dt, ta, tb, M, N, K, pa, sA, pb, sB, c_held ? *scr : pc, sC, batch, pgd_at(*scr, held));
}

static int pgd_matmul_epi(const pgd_ctx *g, pdde_tensor *node);

static int pgd_matmul(const pgd_ctx *g, pdde_tensor *node) {
    if (node->nsrc > 2 || node->dtype != PDDE_F32 || pdde_op_i32(node, PDDE_P_MATMUL_RESIDUAL) || pdde_op_i32(node, PDDE_P_MATMUL_BGRAD))
        return pgd_matmul_epi(g, node);
    pdde_tensor *a = node->src[0], *b = node->src[1];
    int32_t ta = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) != 0, tb = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_B) != 0;
    if (node->ndim < 2 || a->ndim < 2 || b->ndim < 2)
        return pdde_error(g->ctx, PDDE_ERR_SHAPE, "%s: matmul %s needs operands of 2 dims or more", g->name, node->name);
    int64_t M = node->shape[node->ndim - 2], N = node->shape[node->ndim - 1];
    int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    int64_t batch = M && N ? pgd_numel(node) / (M * N) : 0;
    if (!batch) return PDDE_OK;
    int64_t sA = pgd_numel(a) == batch * M * K ? M * K : 0;
    int64_t sB = pgd_numel(b) == batch * K * N ? K * N : 0;
    pgd_ptr pa = pgd_ptr_of(a), pb = pgd_ptr_of(b), pc = pgd_ptr_of(node);
    if (K == 0) return g->fill32(g->impl, g->stream, pc, 0, (size_t)(batch * M * N));
    if (batch > 1 && sB == 0 && sA != 0 && !ta) { /* a shared B under a row-major A: one GEMM over all the rows */
        M *= batch;
        batch = 1;
    }
    return pgd_gemm_run(g, a->dtype, ta, tb, M, N, K, pa, sA, pb, sB, pc, M * N, batch, pgd_null);
}

/* ------------------------------------------------------------------------------------------------
 * A matmul with an epilogue (planner/lower.c's fusions, PDDE_FUSE_EPILOGUE): a bias [N] (src 2) added to
 * every row, then a residual (PDDE_P_MATMUL_RESIDUAL: the last src), and/or a bf16 / f16 output rounded
 * once from the f32 sum. The backend's epilogue GEMM where it has one and takes the case (gemm_epi:
 * cublasLt; under a bf16 / f16 output it declines, asked again for the f32 sum into scratch, then k_cast),
 * else the GEMM into f32 (the output itself, or scratch under a bf16 / f16 output), the bias
 * and the residual added in place (k_binary) and the sum cast (k_cast): the kernels the adds and the cast
 * ran before, without their tensors. */
/* PDDE_FUSE_GELU's matmuls (PDDE_P_MATMUL_ACT): one GEMM of a shared 2-D B (the rows of every batch are
 * one M). The backend's activation epilogue where it has one and takes the case (gemm_act: cublasLt's
 * GELU_AUX_BIAS, DGELU), else the GEMM into f32 and the kernels of the nodes it replaces: GELU: k_bias_gelu
 * (gelu(h + bias) beside), the bias added (k_binary) and X cast to the node's dtype; DGELU: X widened to f32
 * where it is not, then k_bias_gelu's backward over a zero bias (x + 0 is x) with the product as dy. */
static int pgd_matmul_act(const pgd_ctx *g, pdde_tensor *node) {
    int act = pdde_op_i32(node, PDDE_P_MATMUL_ACT);
    pdde_tensor *a = node->src[0], *b = node->src[1], *x3 = node->src[2];
    int32_t tb = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_B) != 0, f32 = (int32_t)PDDE_F32, ddt = (int32_t)node->dtype;
    int64_t N = node->shape[node->ndim - 1], K = a->shape[a->ndim - 1], n = pgd_numel(node), M = N ? n / N : 0;
    if (!n) return PDDE_OK;
    pgd_ptr pa = pgd_ptr_of(a), pb = pgd_ptr_of(b), pd = pgd_ptr_of(node), px = pgd_ptr_of(x3);
    pgd_ptr beside = act == PDDE_MATMUL_GELU ? pgd_at(pd, (int64_t)pdde_lowp_copy_offset(node)) : pgd_null;
    if (g->gemm_act && K > 0) { /* GELU: D = gelu(X) beside, aux = X (the node); DGELU: D = the node, aux = X */
        int e = g->gemm_act(g->impl, g->stream, act, a->dtype, node->dtype, tb, M, N, K, pa, pb, act == PDDE_MATMUL_GELU ? beside : pd,
                            act == PDDE_MATMUL_GELU ? px : pgd_null, act == PDDE_MATMUL_GELU ? pd : px,
                            act == PDDE_MATMUL_GELU ? node->dtype : x3->dtype); /* (GELU: aux is the node, x3 the bias) */
        if (e != 1) return e;
    }
    int64_t c_bytes = (n * 4 + 255) & ~(int64_t)255, x_bytes = act == PDDE_MATMUL_DGELU && x3->dtype != PDDE_F32 ? c_bytes : 0;
    int64_t z_bytes = 256, held = c_bytes + x_bytes + z_bytes;
    int own = act == PDDE_MATMUL_GELU && node->dtype == PDDE_F32; /* (X f32: the GEMM writes the node itself) */
    pgd_ptr scr = pgd_null;
    int e = g->scratch(g->impl, g->stream, (size_t)held, &scr);
    if (!e) e = pgd_gemm_run_held(g, &scr, held, !own, a->dtype, 0, tb, M, N, K, pa, 0, pb, 0, pd, M * N, 1);
    if (e) return e;
    pgd_ptr c32 = own ? pd : scr, x32 = x_bytes ? pgd_at(scr, c_bytes) : px, zero = pgd_at(scr, c_bytes + x_bytes);
    int32_t add = PGD_B_ADD, back = act == PDDE_MATMUL_DGELU, xdt = (int32_t)x3->dtype;
    if (!back) {
        int64_t nb = N;
        pgd_ptr pnull = pgd_null;
        e = pgd_launch_1d(g, PGD_K_BIAS_GELU, n, PGD_ARGS(PGD_P(c32), PGD_P(px), PGD_P(pnull), PGD_P(beside), PGD_A(n), PGD_A(nb), PGD_A(back), PGD_A(ddt)));
        if (!e) e = pgd_launch_1d(g, PGD_K_BINARY, n, PGD_ARGS(PGD_P(c32), PGD_P(px), PGD_P(c32), PGD_A(n), PGD_A(N), PGD_A(add)));
        if (!e && !own) e = pgd_launch_1d(g, PGD_K_CAST, n, PGD_ARGS(PGD_P(c32), PGD_P(pd), PGD_A(n), PGD_A(f32), PGD_A(ddt)));
        return e;
    }
    int64_t one = 1;
    if (x_bytes) e = pgd_launch_1d(g, PGD_K_CAST, n, PGD_ARGS(PGD_P(px), PGD_P(x32), PGD_A(n), PGD_A(xdt), PGD_A(f32)));
    if (!e) e = g->fill32(g->impl, g->stream, zero, 0, 1);
    if (!e) e = pgd_launch_1d(g, PGD_K_BIAS_GELU, n, PGD_ARGS(PGD_P(x32), PGD_P(zero), PGD_P(c32), PGD_P(pd), PGD_A(n), PGD_A(one), PGD_A(back), PGD_A(ddt)));
    return e;
}

/* A weight gradient's matmul that also writes its bias gradient (planner/lower.c's PDDE_FUSE_BGRAD): D [M, N] =
 * op(A) B and, beside D, the column sums of B [K, N] (f32). The backend's GEMM with a bias-gradient epilogue
 * where it has one and takes the case (gemm_bgrad: cublasLt's BGRADA), else k_colsum (the kernel of the
 * sum_to it replaces, reading B) and the GEMM. */
static int pgd_matmul_bgrad(const pgd_ctx *g, pdde_tensor *node) {
    pdde_tensor *a = node->src[0], *b = node->src[1];
    int32_t ta = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) != 0;
    int64_t M = node->shape[0], N = node->shape[1], K = b->shape[0];
    pgd_ptr pa = pgd_ptr_of(a), pb = pgd_ptr_of(b), pd = pgd_ptr_of(node), pg = pgd_at(pd, (int64_t)pdde_lowp_copy_offset(node));
    if (!N) return PDDE_OK;
    if (g->gemm_bgrad && K > 0 && M > 0) {
        int e = g->gemm_bgrad(g->impl, g->stream, a->dtype, ta, M, N, K, pa, pb, pd, pg);
        if (e != 1) return e;
    }
    int e = K > 0 ? pgd_colsum(g, pb, pg, K, N, 1.0f, (int32_t)b->dtype) : g->fill32(g->impl, g->stream, pg, 0, (size_t)N);
    return e ? e : pgd_gemm_run(g, a->dtype, ta, 0, M, N, K, pa, 0, pb, 0, pd, M * N, 1, pgd_null);
}

static int pgd_matmul_epi(const pgd_ctx *g, pdde_tensor *node) {
    if (pdde_op_i32(node, PDDE_P_MATMUL_ACT)) return pgd_matmul_act(g, node);
    if (pdde_op_i32(node, PDDE_P_MATMUL_BGRAD)) return pgd_matmul_bgrad(g, node);
    int residual = pdde_op_i32(node, PDDE_P_MATMUL_RESIDUAL) != 0;
    pdde_tensor *a = node->src[0], *b = node->src[1], *bias = node->nsrc - residual > 2 ? node->src[2] : NULL;
    pgd_ptr pres = residual ? pgd_ptr_of(node->src[node->nsrc - 1]) : pgd_null;
    int32_t ta = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) != 0, tb = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_B) != 0;
    int64_t M = node->shape[node->ndim - 2], N = node->shape[node->ndim - 1];
    int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    int64_t batch = M && N ? pgd_numel(node) / (M * N) : 0;
    if (!batch) return PDDE_OK;
    int64_t sA = pgd_numel(a) == batch * M * K ? M * K : 0, sB = pgd_numel(b) == batch * K * N ? K * N : 0;
    if (batch > 1 && sB == 0 && sA != 0 && !ta) M *= batch, batch = 1; /* (as pgd_matmul) */
    pgd_ptr pa = pgd_ptr_of(a), pb = pgd_ptr_of(b), pd = pgd_ptr_of(node), pbias = bias ? pgd_ptr_of(bias) : pgd_null;
    if (g->gemm_epi && K > 0) {
        int e = g->gemm_epi(g->impl, g->stream, a->dtype, node->dtype, ta, tb, M, N, K, pa, sA, pb, sB, pd, M * N, batch, pbias, pres,
                            residual ? 1.0f : 0.0f);
        if (e != 1) return e;
    }
    int64_t n = batch * M * N, cbytes = node->dtype != PDDE_F32 ? (n * (int64_t)sizeof(float) + 255) & ~(int64_t)255 : 0;
    pgd_ptr scr = pgd_null;
    int e = cbytes ? g->scratch(g->impl, g->stream, (size_t)cbytes, &scr) : PDDE_OK;
    pgd_ptr c32 = cbytes ? scr : pd;
    int32_t add = PGD_B_ADD, sdt = (int32_t)PDDE_F32, ddt = (int32_t)node->dtype;
    if (!e && cbytes && g->gemm_epi && K > 0) { /* a bf16 / f16 output it declined: the f32 sum from its epilogue GEMM, then the cast */
        int f = g->gemm_epi(g->impl, g->stream, a->dtype, PDDE_F32, ta, tb, M, N, K, pa, sA, pb, sB, c32, M * N, batch, pbias, pres,
                            residual ? 1.0f : 0.0f);
        if (f != 1) return f ? f : pgd_launch_1d(g, PGD_K_CAST, n, PGD_ARGS(PGD_P(c32), PGD_P(pd), PGD_A(n), PGD_A(sdt), PGD_A(ddt)));
    }
    if (!e) e = pgd_gemm_run_held(g, &scr, cbytes, cbytes != 0, a->dtype, ta, tb, M, N, K, pa, sA, pb, sB, pd, M * N, batch);
    if (cbytes) c32 = scr;
    if (!e && bias) e = pgd_launch_1d(g, PGD_K_BINARY, n, PGD_ARGS(PGD_P(c32), PGD_P(pbias), PGD_P(c32), PGD_A(n), PGD_A(N), PGD_A(add)));
    if (!e && residual) e = pgd_launch_1d(g, PGD_K_BINARY, n, PGD_ARGS(PGD_P(pres), PGD_P(c32), PGD_P(c32), PGD_A(n), PGD_A(n), PGD_A(add)));
    if (!e && cbytes) e = pgd_launch_1d(g, PGD_K_CAST, n, PGD_ARGS(PGD_P(c32), PGD_P(pd), PGD_A(n), PGD_A(sdt), PGD_A(ddt)));
    return e;
}

/* A gradient accumulation that computes its contribution (planner/lower.c's PDDE_FUSE_GRAD): acc [M, N]
 * (src 0) += op(A) op(B) (src 1, 2), or (PDDE_P_GRAD_ACCUM_OVERWRITE: a step's first gradient) = op(A) op(B).
 * The backend's GEMM with beta 1 (0) where it has one (gemm_epi), else the GEMM into scratch and k_binary's add
 * (into acc), the kernels of the matmul and the accumulation it replaces. */
static int pgd_grad_accum_matmul(const pgd_ctx *g, pdde_tensor *node) {
    pdde_tensor *acc = node->src[0], *a = node->src[1], *b = node->src[2];
    int32_t ta = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_A) != 0, tb = pdde_op_i32(node, PDDE_P_MATMUL_TRANS_B) != 0;
    int overwrite = pdde_op_i32(node, PDDE_P_GRAD_ACCUM_OVERWRITE) != 0;
    int64_t M = node->shape[0], N = node->shape[1], K = ta ? a->shape[0] : a->shape[1], n = M * N;
    pgd_ptr pa = pgd_ptr_of(a), pb = pgd_ptr_of(b), pacc = pgd_ptr_of(acc);
    if (!n) return PDDE_OK;
    if (!K) return overwrite ? g->fill32(g->impl, g->stream, pacc, 0, (size_t)n) : PDDE_OK; /* (an empty product adds nothing) */
    if (g->gemm_epi) {
        int e = g->gemm_epi(g->impl, g->stream, a->dtype, PDDE_F32, ta, tb, M, N, K, pa, 0, pb, 0, pacc, M * N, 1, pgd_null, pgd_null,
                            overwrite ? 0.0f : 1.0f);
        if (e != 1) return e;
    }
    pgd_ptr scr = pgd_null;
    if (overwrite) return pgd_gemm_run_held(g, &scr, 0, 0, a->dtype, ta, tb, M, N, K, pa, 0, pb, 0, pacc, M * N, 1);
    int64_t cbytes = (n * (int64_t)sizeof(float) + 255) & ~(int64_t)255;
    int e = g->scratch(g->impl, g->stream, (size_t)cbytes, &scr);
    if (!e) e = pgd_gemm_run_held(g, &scr, cbytes, 1, a->dtype, ta, tb, M, N, K, pa, 0, pb, 0, pgd_null, M * N, 1);
    int32_t add = PGD_B_ADD;
    if (!e) e = pgd_launch_1d(g, PGD_K_BINARY, n, PGD_ARGS(PGD_P(pacc), PGD_P(scr), PGD_P(pacc), PGD_A(n), PGD_A(n), PGD_A(add)));
    return e;
}

static int pgd_copy2d(const pgd_ctx *g, pgd_ptr src, pgd_ptr dst, int64_t outer, int64_t rowlen, int64_t sp,
                      int64_t soff, int64_t dp, int64_t doff) {
    int64_t n = outer * rowlen;
    if (!n) return PDDE_OK;
    return pgd_launch_1d(g, PGD_K_COPY2D, n,
                         PGD_ARGS(PGD_P(src), PGD_P(dst), PGD_A(outer), PGD_A(rowlen), PGD_A(sp), PGD_A(soff),
                                  PGD_A(dp), PGD_A(doff)));
}

static void pgd_axis_split(const pdde_tensor *t, int axis, int64_t *outer, int64_t *inner) {
    int64_t o = 1, in = 1;
    for (int i = 0; i < axis; i++) o *= t->shape[i];
    for (int i = axis + 1; i < t->ndim; i++) in *= t->shape[i];
    *outer = o;
    *inner = in;
}

static int pgd_rows(const pdde_tensor *x, int64_t *rows, int64_t *C) {
    *C = x->ndim ? x->shape[x->ndim - 1] : 1;
    *rows = *C ? pgd_numel(x) / *C : 0;
    return *rows > 0 && *C > 0;
}

/* layernorm's warp-per-row kernels (PGD_MEM_LN2): rows of at most PGD_LN2_CMAX columns, a row a warp (32 items), 8
 * warps a group (fewer where the device's row groups are smaller: 2 on a CPU); elsewhere the group-per-row kernels run.
 * Each kernel is built for the row widths PGD_LN2_WIDTHS (G = width / 128 groups of 4 columns a lane: 6, 8, 13, 16 in
 * both kernel sources' LN2_INSTANCE); pgd_ln2_kernel takes the narrowest that holds the row. */
#define PGD_LN2_WIDTHS {768, 1024, 1664, 2048}
#define PGD_LN2_CMAX 2048
static int pgd_ln2_on(const pgd_ctx *g, int64_t C) { return (g->mem_kernels & PGD_MEM_LN2) && C <= PGD_LN2_CMAX && g->max_block >= 32; }
/* base (PGD_K_LAYERNORM2, PGD_K_LAYERNORM_BACK2 or PGD_K_LAYERNORM_GAMMA2)'s instance for rows of C columns (pgd_ln2_on) */
static int pgd_ln2_kernel(int base, int64_t C) {
    static const int64_t widths[] = PGD_LN2_WIDTHS;
    int i = 0;
    while (i + 1 < (int)(sizeof widths / sizeof widths[0]) && C > widths[i]) i++;
    return base + i;
}
static unsigned pgd_ln2_warps(const pgd_ctx *g) { return g->max_block >= 256 ? 8u : g->max_block / 32; }
static unsigned pgd_ln2_grid(const pgd_ctx *g, int64_t rows) {
    int64_t n = (rows + pgd_ln2_warps(g) - 1) / pgd_ln2_warps(g);
    return n > 65535 ? 65535u : (unsigned)n;
}

/* dgamma by k_layernorm_gamma2: groups of at least 8 rows a warp, up to 2 groups a compute unit (the partial sums
 * [groups, C] few, so that k_colsum, which sums them with 32 columns a group, has short columns), dgamma directly
 * from one group */
static int pgd_gamma_back_ln2(const pgd_ctx *g, pdde_tensor *node, int64_t rows, int64_t C, float eps) {
    int64_t warps = pgd_ln2_warps(g), groups = (rows + 8 * warps - 1) / (8 * warps), cap = (int64_t)(g->units ? g->units : 1) * 2;
    if (groups > cap) groups = cap;
    if (groups > 65535) groups = 65535;
    int64_t rpb = (rows + groups - 1) / groups;
    groups = (rows + rpb - 1) / rpb;
    pgd_ptr px = pgd_ptr_of(node->src[0]), pdy = pgd_ptr_of(node->src[1]), pg = pgd_ptr_of(node), part = pg;
    if (groups > 1) {
        int e = g->scratch(g->impl, g->stream, (size_t)(groups * C) * sizeof(float), &part);
        if (e) return e;
    }
    int e = pgd_launch(g, pgd_ln2_kernel(PGD_K_LAYERNORM_GAMMA2, C), (unsigned)groups, 1, 1, 32 * (unsigned)warps, 1,
                       PGD_ARGS(PGD_P(px), PGD_P(pdy), PGD_P(part), PGD_A(rows), PGD_A(C), PGD_A(eps), PGD_A(rpb)));
    if (e || groups == 1) return e;
    float one = 1.0f;
    int32_t part_dt = (int32_t)PDDE_F32;
    return pgd_launch(g, PGD_K_COLSUM, (unsigned)((C + 31) / 32), 1, 1, 32, 8,
                      PGD_ARGS(PGD_P(part), PGD_P(pg), PGD_A(groups), PGD_A(C), PGD_A(one), PGD_A(groups), PGD_A(part_dt)));
}

static int pgd_gamma_back(const pgd_ctx *g, pdde_tensor *node, int32_t rms) {
    pdde_tensor *x = node->src[0], *dy = node->src[1];
    int64_t rows, C;
    if (!pgd_rows(x, &rows, &C)) return g->fill32(g->impl, g->stream, pgd_ptr_of(node), 0, (size_t)pgd_numel(node));
    float eps = pdde_op_f32(node, PDDE_P_NORM_EPS), one = 1.0f;
    if (!rms && pgd_ln2_on(g, C)) return pgd_gamma_back_ln2(g, node, rows, C, eps);
    int64_t chunks = pgd_row_chunks(g, rows, C), rpc = (rows + chunks - 1) / chunks;
    /* scratch: the row statistics [rows][2], then the chunk sums [chunks][C] when the rows are split */
    size_t stats_bytes = ((size_t)rows * 2 * sizeof(float) + 255) & ~(size_t)255;
    pgd_ptr stats = pgd_null;
    int e = g->scratch(g->impl, g->stream, stats_bytes + (chunks > 1 ? (size_t)(chunks * C) * sizeof(float) : 0), &stats);
    if (e) return e;
    pgd_ptr px = pgd_ptr_of(x), pdy = pgd_ptr_of(dy), pg = pgd_ptr_of(node), part = chunks > 1 ? pgd_at(stats, (int64_t)stats_bytes) : pg;
    e = pgd_row_launch(g, PGD_K_ROW_STATS, rows, C,
                       PGD_ARGS(PGD_P(px), PGD_P(stats), PGD_A(rows), PGD_A(C), PGD_A(eps), PGD_A(rms)));
    if (e) return e;
    e = pgd_launch(g, PGD_K_GAMMA_BACK, (unsigned)((C + 31) / 32), (unsigned)chunks, 1, 32, 8,
                   PGD_ARGS(PGD_P(px), PGD_P(pdy), PGD_P(stats), PGD_P(part), PGD_A(rows), PGD_A(C), PGD_A(rpc)));
    if (e || chunks == 1) return e;
    int32_t f32 = (int32_t)PDDE_F32;
    return pgd_launch(g, PGD_K_COLSUM, (unsigned)((C + 31) / 32), 1, 1, 32, 8,
                      PGD_ARGS(PGD_P(part), PGD_P(pg), PGD_A(chunks), PGD_A(C), PGD_A(one), PGD_A(chunks), PGD_A(f32)));
}

/* What a cross-entropy divides by, into cnt[0]: the count of its valid targets (k_ce_count), or the step's divisor
 * (PDDE_P_CE_DIVISOR, pdde_session_set_loss_tokens) */
static int pgd_fill_f32(const pgd_ctx *g, pgd_ptr at, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return g->fill32(g->impl, g->stream, at, bits, 1);
}
static int pgd_ce_divisor(const pgd_ctx *g, const pdde_tensor *node, pgd_ptr pt, int64_t rows, int64_t V, pgd_ptr cnt) {
    float d = pdde_op_f32(node, PDDE_P_CE_DIVISOR);
    if (d > 0) return pgd_fill_f32(g, cnt, d);
    return pgd_launch(g, PGD_K_CE_COUNT, 1, 1, 1, 256, 1, PGD_ARGS(PGD_P(pt), PGD_A(rows), PGD_A(V), PGD_P(cnt)));
}

/* The loss; where the node also writes dlogits into its source 3 (lowering's PDDE_FUSE_CE), k_ce_fused reads each
 * row once for both (and again, mostly from cache, for dlogits), after the count of valid targets that scales them;
 * with PGD_MEM_CE1, k_ce_staged instead where a row fits in the group's local memory (at most 512 items a group). */
static int pgd_cross_entropy(const pgd_ctx *g, pdde_tensor *node) {
    pdde_tensor *lg = node->src[0], *tg = node->src[1];
    int64_t rows, V;
    pgd_ptr py = pgd_ptr_of(node);
    if (!pgd_rows(lg, &rows, &V)) return g->fill32(g->impl, g->stream, py, 0, 1);
    int32_t ddt = pdde_op_i32(node, PDDE_P_CE_DLOGITS) - 1; /* (-1: no dlogits) */
    size_t part_bytes = ((size_t)rows * 2 * sizeof(float) + 255) & ~(size_t)255;
    pgd_ptr part = pgd_null;
    int e = g->scratch(g->impl, g->stream, part_bytes + (ddt >= 0 ? sizeof(float) : 0), &part);
    if (e) return e;
    pgd_ptr pl = pgd_ptr_of(lg), pt = pgd_ptr_of(tg);
    int32_t ldt = (int32_t)lg->dtype; /* (f32, or bf16/f16 logits: PDDE_BF16_LOGITS) */
    if (ddt >= 0) {
        pgd_ptr cnt = pgd_at(part, (int64_t)part_bytes), pd = pgd_ptr_of(node->src[2]), px = pgd_ptr_of(node->src[3]);
        e = pgd_ce_divisor(g, node, pt, rows, V, cnt);
        size_t row_bytes = ((size_t)V * pdde_dtype_size(lg->dtype) + 15) & ~(size_t)15;
        if (!e && (g->mem_kernels & PGD_MEM_CE1) && row_bytes <= g->max_local) {
            unsigned bx = pgd_row_block(g, V);
            e = pgd_launch(g, PGD_K_CE_STAGED, pgd_rows_grid(rows), 1, 1, bx < 512 ? bx : 512, 1,
                           PGD_ARGS(PGD_P(pl), PGD_P(pt), PGD_P(pd), PGD_P(cnt), PGD_P(part), PGD_P(px), PGD_A(rows), PGD_A(V), PGD_A(ddt),
                                    PGD_A(ldt), PGD_LOCAL(row_bytes)));
        } else if (!e)
            e = pgd_row_launch(g, PGD_K_CE_FUSED, rows, V,
                               PGD_ARGS(PGD_P(pl), PGD_P(pt), PGD_P(pd), PGD_P(cnt), PGD_P(part), PGD_P(px), PGD_A(rows), PGD_A(V), PGD_A(ddt),
                                        PGD_A(ldt)));
    } else
        e = pgd_row_launch(g, PGD_K_CE_ROWS, rows, V, PGD_ARGS(PGD_P(pl), PGD_P(pt), PGD_P(part), PGD_A(rows), PGD_A(V), PGD_A(ldt)));
    float d = pdde_op_f32(node, PDDE_P_CE_DIVISOR);
    if (!e && d > 0) { /* k_ce_final divides by the sum of part[rows ..]: the divisor, then zeros */
        e = g->fill32(g->impl, g->stream, pgd_at(part, rows * (int64_t)sizeof(float)), 0, (size_t)rows);
        if (!e) e = pgd_fill_f32(g, pgd_at(part, rows * (int64_t)sizeof(float)), d);
    }
    if (e) return e;
    return pgd_launch(g, PGD_K_CE_FINAL, 1, 1, 1, 256, 1, PGD_ARGS(PGD_P(part), PGD_A(rows), PGD_P(py)));
}

static int pgd_cross_entropy_back(const pgd_ctx *g, pdde_tensor *node) {
    pdde_tensor *lg = node->src[0], *tg = node->src[1], *dl = node->src[2];
    int64_t rows, V;
    if (pdde_op_i32(node, PDDE_P_CE_DLOGITS)) return PDDE_OK; /* (its forward wrote it: lowering's PDDE_FUSE_CE) */
    if (!pgd_rows(lg, &rows, &V)) return PDDE_OK;
    pgd_ptr cnt = pgd_null;
    int e = g->scratch(g->impl, g->stream, sizeof(float), &cnt);
    if (e) return e;
    pgd_ptr pl = pgd_ptr_of(lg), pt = pgd_ptr_of(tg), pd = pgd_ptr_of(dl), px = pgd_ptr_of(node);
    int32_t ydt = (int32_t)node->dtype; /* (f32, or bf16/f16 where a cast was folded in) */
    int32_t ldt = (int32_t)lg->dtype;   /* (f32, or bf16/f16 logits: PDDE_BF16_LOGITS) */
    e = pgd_ce_divisor(g, node, pt, rows, V, cnt);
    if (e) return e;
    return pgd_row_launch(g, PGD_K_CE_BACK, rows, V,
                          PGD_ARGS(PGD_P(pl), PGD_P(pt), PGD_P(pd), PGD_P(cnt), PGD_P(px), PGD_A(rows), PGD_A(V), PGD_A(ydt), PGD_A(ldt)));
}

static int pgd_dcopy(const pgd_ctx *g, pgd_ptr dst, pgd_ptr src, size_t n) {
    if ((dst.base == src.base && dst.off == src.off) || !n) return PDDE_OK;
    return g->copy(g->impl, g->stream, dst, src, n);
}

/* src[i] where the node has it (optional operands: a layernorm's beta, an update's gnorm_sq), else null */
static pgd_ptr pgd_opt_src(const pdde_tensor *node, int i) {
    return node->nsrc > i && node->src[i] ? pgd_ptr_of(node->src[i]) : pgd_null;
}

/* An update's squared gradient norm (source i, before the parameter's copy) and that copy with its
 * dtype (0: none). */
static pgd_ptr pgd_update_norm(const pdde_tensor *u, int i) {
    return u->nsrc > i + (pdde_op_i32(u, PDDE_P_UPDATE_SHADOW) != 0) ? pgd_ptr_of(u->src[i]) : pgd_null;
}
static pgd_ptr pgd_update_shadow(const pdde_tensor *u, int32_t *sdt) {
    *sdt = pdde_op_i32(u, PDDE_P_UPDATE_SHADOW) ? (int32_t)u->src[u->nsrc - 1]->dtype : 0;
    return *sdt ? pgd_ptr_of(u->src[u->nsrc - 1]) : pgd_null;
}

/* A line of the log, once per process for each `which` (a notice, not an error: nothing failed). */
static void pgd_say_once(int which, const char *fmt, const char *a, const char *b, const char *c) {
    static atomic_int said;
    if (atomic_fetch_or(&said, 1 << which) & (1 << which)) return;
    char line[512];
    snprintf(line, sizeof line, fmt, a, b, c);
#ifdef PDDE_HAS_LOG /* (in the library; a test or benchmark including this header alone writes to stderr) */
    pdde_log(PDDE_LOG_WARN, "pdde: %s", line);
#else
    fprintf(stderr, "pdde: %s\n", line);
#endif
}

static const char *const pgd_att_names[PGD_ATT_COUNT] = {"rows", "unfused", "flash", "flash2"};

/* An attention node's geometry and buffers in either layout (pdde_attention_dims): q, k, v apart, or
 * packed in qkv (then k and v point D and 2D elements past q, and hk = H, the kernels' layout argument;
 * 0 for the other layout); y and dy are the forward's output and its gradient (backward only); starts, each
 * query's first key (pdde_attention_docs, i32 [B, T]; null: plain causal), which the kernels find at batch row
 * bh / H (their heads argument, H in both layouts). */
typedef struct {
    int64_t B, H, T, D, BH, rows, hk;
    int packed;
    size_t esz; /* q, k, v's element size */
    pgd_ptr q, k, v, y, dy, out, starts;
} pgd_att;

static pgd_att pgd_att_of(const pdde_tensor *node) {
    pgd_att a;
    pdde_attention_dims(node, &a.B, &a.H, &a.T, &a.D, &a.packed);
    const pdde_tensor *q = node->src[0];
    a.BH = a.B * a.H, a.rows = a.BH * a.T, a.hk = a.packed ? a.H : 0, a.esz = pdde_dtype_size(q->dtype);
    a.q = pgd_ptr_of(q);
    a.k = a.packed ? pgd_at(a.q, a.D * (int64_t)a.esz) : pgd_ptr_of(node->src[1]);
    a.v = a.packed ? pgd_at(a.q, 2 * a.D * (int64_t)a.esz) : pgd_ptr_of(node->src[2]);
    int back = node->op == PDDE_OP_ATTENTION_BACK, yi = a.packed ? 1 : 3;
    a.y = back ? pgd_ptr_of(node->src[yi]) : pgd_ptr_of(node);
    a.dy = back ? pgd_ptr_of(node->src[yi + 1]) : pgd_null;
    a.out = pgd_ptr_of(node);
    const pdde_tensor *starts = pdde_attention_starts(node);
    a.starts = starts ? pgd_ptr_of(starts) : pgd_null;
    return a;
}

/* Which path runs this attention node: the backend's switch, else PDDE_ATTENTION (unfused, rows, flash or flash2),
 * else the backend's default. The tiled kernels take bf16 (and, where the backend's take it, f32) q, k,
 * v of head size 64 or 128 at 16-byte aligned offsets; other nodes asked to run there take the default
 * path (the unfused one where the default is the tiled one). A node with starts (pdde_attention_docs) runs
 * on every path (flash2: its *_docs kernels, where flash2 is named: by default flash, until a GPU run has
 * measured those kernels) but the f32 kernels of PGD_FLASH_F32_NAMED: f32 with starts takes the unfused path
 * there (said once where the path was named). Read at each node, so that one process can measure every path. */
static int pgd_attention_path(const pgd_ctx *g, const pdde_tensor *node) {
    const char *var = g->attention_env, *v = var ? getenv(var) : NULL;
    if (!v || !*v) var = "PDDE_ATTENTION", v = getenv(var);
    int path = g->attention_default, named = 0;
    if (v && *v) {
        int c = -1;
        for (int i = 0; i < PGD_ATT_COUNT; i++)
            if (!strcmp(v, pgd_att_names[i])) c = i;
        if (c < 0) pgd_say_once(0, "%s=%s is not unfused, rows, flash or flash2: the attention takes the %s path", var, v, pgd_att_names[path]);
        else path = c, named = 1;
    }
    /* (backends without flash2's kernels take flash, and so do f32 q, k, v without f32 kernels of their own) */
    const pdde_tensor *q = node->src[0];
    int docs = pdde_attention_starts(node) != NULL;
    int f32_own = q->dtype == PDDE_F32 && (g->has_flash & PGD_FLASH_F32_NAMED);
    if (path == PGD_ATT_FLASH2 && (!(g->has_flash & PGD_FLASH2) || (q->dtype == PDDE_F32 && !f32_own) || (docs && !named)))
        path = PGD_ATT_FLASH;
    if (path == PGD_ATT_FLASH || path == PGD_ATT_FLASH2) {
        pgd_att at = pgd_att_of(node);
        int64_t D = at.D;
        int f32_named = named && (g->has_flash & PGD_FLASH_F32_NAMED) && !docs; /* (those kernels do not take starts) */
        int dt_ok = (q->dtype == PDDE_BF16 && (g->has_flash & PGD_FLASH_BF16)) ||
                    (q->dtype == PDDE_F32 && ((g->has_flash & PGD_FLASH_F32) || f32_named));
        /* (the CUDA kernels move 16 bytes at a time: packed rows start at multiples of D elements) */
        int aligned = at.q.off % 16 == 0 && at.k.off % 16 == 0 && at.v.off % 16 == 0 && (!at.packed || (D * (int64_t)at.esz) % 16 == 0);
        if (!(D == 64 || D == 128) || !dt_ok || !aligned) {
            int fb = g->attention_default == PGD_ATT_FLASH || g->attention_default == PGD_ATT_FLASH2 ? PGD_ATT_UNFUSED
                                                                                                    : g->attention_default;
            static const char *const why[5] = {"this device has no tiled attention kernels", "its q, k, v are of another dtype",
                                               "its head size is not 64 or 128", "its q, k or v is not 16-byte aligned",
                                               "its f32 q, k, v come with starts (pdde_attention_docs)"};
            int f32_docs = q->dtype == PDDE_F32 && docs && named && (g->has_flash & PGD_FLASH_F32_NAMED) && !(g->has_flash & PGD_FLASH_F32);
            int r = !g->has_flash ? 0 : f32_docs ? 4 : !dt_ok ? 1 : !(D == 64 || D == 128) ? 2 : 3;
            if (v && *v) /* (asked for by name: say why it does not run; the default falls back quietly) */
                pgd_say_once(1 + r, "%s: the tiled attention does not run a node where %s: those take the %s path", g->name,
                             why[r], pgd_att_names[fb]);
            path = fb;
        }
    }
    return path;
}

/* The row kernels: an item per query row (forward, dq) or key row (dk, dv), each walking the
 * keys (queries) its row meets (with starts: from the query's first key) with an online softmax
 * (probabilities recomputed from the saved logsumexp). dq's kernel also leaves rowsum(dO * O) per
 * row in scratch for the dk, dv kernel.
 * bf16 / f16 q, k, v (mixed precision) are widened to f32 in that scratch first, as a low-precision
 * matmul's operands are: the kernels' products of rounded inputs are then exact in f32 and everything
 * after them is f32, the CPU's numerics. */
static int pgd_attention_rows(const pgd_ctx *g, pdde_tensor *node) {
    const pdde_tensor *q = node->src[0];
    pgd_att at = pgd_att_of(node);
    int64_t BH = at.BH, T = at.T, D = at.D, rows = at.rows, n = rows * D, H = at.hk, heads = at.H;
    float scale = pdde_op_f32(node, PDDE_P_ATTENTION_SCALE);
    if (!rows) return PDDE_OK;
    pgd_ptr pq = at.q, pk = at.k, pv = at.v, po = at.out, ps = at.starts;
    int64_t wide = q->dtype != PDDE_F32 ? 3 * n : 0, rowdot_n = node->op == PDDE_OP_ATTENTION_BACK ? rows : 0;
    pgd_ptr w = pgd_null;
    int e = wide + rowdot_n ? g->scratch(g->impl, g->stream, (size_t)(wide + rowdot_n) * sizeof(float), &w) : PDDE_OK;
    pgd_ptr *in[3] = {&pq, &pk, &pv};
    int32_t sdt = (int32_t)q->dtype, ddt = (int32_t)PDDE_F32;
    if (!e && wide && at.packed) { /* the whole of qkv, in its layout */
        e = pgd_launch_1d(g, PGD_K_CAST, wide, PGD_ARGS(PGD_P(pq), PGD_P(w), PGD_A(wide), PGD_A(sdt), PGD_A(ddt)));
        for (int i = 0; i < 3; i++) *in[i] = pgd_at(w, i * D * (int64_t)sizeof(float));
    }
    for (int i = 0; !e && wide && !at.packed && i < 3; i++) {
        pgd_ptr wi = pgd_at(w, i * n * (int64_t)sizeof(float));
        e = pgd_launch_1d(g, PGD_K_CAST, n, PGD_ARGS(PGD_P(*in[i]), PGD_P(wi), PGD_A(n), PGD_A(sdt), PGD_A(ddt)));
        *in[i] = wi;
    }
    if (e) return e;
    if (node->op == PDDE_OP_ATTENTION)
        return pgd_launch_1d(g, PGD_K_ATTENTION, rows,
                             PGD_ARGS(PGD_P(pq), PGD_P(pk), PGD_P(pv), PGD_P(po), PGD_A(BH), PGD_A(T), PGD_A(D), PGD_A(scale), PGD_A(H),
                                      PGD_P(ps), PGD_A(heads)));
    pgd_ptr py = at.y, pdy = at.dy, rowdot = pgd_at(w, wide * (int64_t)sizeof(float));
    e = pgd_launch_1d(g, PGD_K_ATTENTION_BACK_Q, rows,
                      PGD_ARGS(PGD_P(pq), PGD_P(pk), PGD_P(pv), PGD_P(py), PGD_P(pdy), PGD_P(rowdot), PGD_P(po), PGD_A(BH),
                               PGD_A(T), PGD_A(D), PGD_A(scale), PGD_A(H), PGD_P(ps), PGD_A(heads)));
    if (e) return e;
    return pgd_launch_1d(g, PGD_K_ATTENTION_BACK_KV, rows,
                         PGD_ARGS(PGD_P(pq), PGD_P(pk), PGD_P(pv), PGD_P(py), PGD_P(pdy), PGD_P(rowdot), PGD_P(po), PGD_A(BH),
                                  PGD_A(T), PGD_A(D), PGD_A(scale), PGD_A(H), PGD_P(ps), PGD_A(heads)));
}

/* Scratch of the unfused path, at most this many bytes (heads are taken in chunks that fit). */
#define PGD_ATT_UNFUSED_SCRATCH ((int64_t)512 << 20)

static int64_t pgd_align256(int64_t bytes) { return (bytes + 255) & ~(int64_t)255; }

/* The unfused form inside the node: per chunk of heads, S = Q K^T (a batched GEMM), P = causal
 * softmax(scale S) (over each row's keys from its first: starts) with each row's logsumexp into y's last
 * column (k_att_softmax), O = P V; the backward
 * recomputes S and P from the logsumexp, dV = P^T dO, dP = dO V^T, dS = scale P (dP - rowsum(P dP))
 * (k_att_dsoftmax), dQ = dS K, dK = dS^T Q. bf16 q, k, v: the GEMMs read bf16, P, dO and dS
 * written as bf16 for them (as autocast's matmuls round theirs); f16 ones are widened to f32 first (f16
 * would flush small dS to zero). The GEMMs are the vendor's, as the unfused graph's are. */
/* Rows [r0, r0 + n) of a packed attention's tensor (which: 0, 1, 2 q, k, v or dq, dk, dv; -1 y, dy) to a
 * contiguous [n, D] block (to_flat) or back (k_att_repack) */
static int pgd_att_repack(const pgd_ctx *g, const pgd_att *at, pgd_ptr packed, pgd_ptr flat, int64_t r0, int64_t n, int32_t which,
                          int32_t esz, int32_t to_flat) {
    int64_t T = at->T, D = at->D, H = at->hk, count = n * D;
    return pgd_launch_1d(g, PGD_K_ATT_REPACK, count, PGD_ARGS(PGD_P(packed), PGD_P(flat), PGD_A(r0), PGD_A(n), PGD_A(T), PGD_A(D),
                                                               PGD_A(H), PGD_A(which), PGD_A(esz), PGD_A(to_flat)));
}

static int pgd_attention_unfused(const pgd_ctx *g, pdde_tensor *node) {
    const pdde_tensor *q = node->src[0];
    int back = node->op == PDDE_OP_ATTENTION_BACK;
    pgd_att at = pgd_att_of(node);
    int64_t BH = at.BH, T = at.T, D = at.D, tt = T * T, td = T * D, n = BH * td;
    float scale = pdde_op_f32(node, PDDE_P_ATTENTION_SCALE);
    if (!BH || !T) return PDDE_OK;
    pdde_dtype gdt = q->dtype == PDDE_BF16 ? PDDE_BF16 : PDDE_F32; /* the GEMMs' operands */
    int widen = q->dtype != PDDE_F32 && gdt == PDDE_F32, lowp = gdt != PDDE_F32;
    int64_t esz = q->dtype == PDDE_F32 ? 4 : 2, gsz = lowp ? 2 : 4;
    /* bytes a head needs: S, P (then dS) of the GEMMs' dtype, O or dO f32, [dP], [dO of the GEMMs' dtype],
     * [q, k, v widened], [the GEMM's widening room where it has no bf16 GEMM: two operands, [T, D] and
     * [T, T] or [T, D]], [packed: q, k, v unpacked, a gradient before it is packed] */
    int64_t gw_head = lowp && !g->gemm_lowp ? 4 * (td + (tt > td ? tt : td)) : 0;
    int64_t pk_head = at.packed ? 3 * esz * td + (back ? 4 * td : 0) : 0;
    int64_t head = 4 * tt + gsz * tt + 4 * td + (back ? 4 * tt : 0) + (lowp ? 2 * td : 0) + (widen ? 12 * td : 0) + gw_head + pk_head;
    int64_t c = PGD_ATT_UNFUSED_SCRATCH / (head > 0 ? head : 1);
    c = c < 1 ? 1 : c > BH ? BH : c;
    int64_t o_P = pgd_align256(4 * c * tt), o_O = o_P + pgd_align256(gsz * c * tt), o_dP = o_O + pgd_align256(4 * c * td),
            o_dOb = o_dP + (back ? pgd_align256(4 * c * tt) : 0),
            o_wide = o_dOb + (lowp ? pgd_align256(2 * c * td) : 0), o_gw = o_wide + (widen ? pgd_align256(12 * c * td) : 0),
            o_pk = o_gw + pgd_align256(c * gw_head), o_pg = o_pk + (at.packed ? pgd_align256(3 * esz * c * td) : 0),
            total = o_pg + (at.packed && back ? pgd_align256(4 * c * td) : 0);
    pgd_ptr w = pgd_null;
    int e = g->scratch(g->impl, g->stream, (size_t)total, &w);
    if (e) return e;
    pgd_ptr S = w, P = pgd_at(w, o_P), O = pgd_at(w, o_O), dP = pgd_at(w, o_dP), dOb = pgd_at(w, o_dOb),
            gw = gw_head ? pgd_at(w, o_gw) : pgd_null;
    pgd_ptr py = at.y, po = at.out, ps = at.starts;
    int32_t f32 = (int32_t)PDDE_F32, pdt = (int32_t)gdt, e32 = (int32_t)esz, four = 4;
    int64_t heads = at.H;
    int64_t Dy = D + 1, ls = at.packed ? 1 : Dy; /* the logsumexp's stride */
    for (int64_t h0 = 0; h0 < BH && !e; h0 += c) {
        int64_t ch = BH - h0 < c ? BH - h0 : c, rows = ch * T, nO = ch * td, r0 = h0 * T;
        pgd_ptr qc = pgd_at(at.q, h0 * td * esz), kc = pgd_at(at.k, h0 * td * esz), vc = pgd_at(at.v, h0 * td * esz);
        if (at.packed) { /* the chunk's heads of q, k, v contiguous, as the batched GEMMs read them */
            pgd_ptr *in[3] = {&qc, &kc, &vc};
            for (int32_t i = 0; i < 3 && !e; i++) {
                pgd_ptr pi = pgd_at(w, o_pk + i * esz * nO);
                e = pgd_att_repack(g, &at, at.q, pi, h0 * T, rows, i, e32, 1);
                *in[i] = pi;
            }
        }
        if (widen) {
            pgd_ptr *in[3] = {&qc, &kc, &vc};
            int32_t sdt = (int32_t)q->dtype;
            for (int i = 0; i < 3 && !e; i++) {
                pgd_ptr wi = pgd_at(w, o_wide + i * 4 * nO);
                e = pgd_launch_1d(g, PGD_K_CAST, nO, PGD_ARGS(PGD_P(*in[i]), PGD_P(wi), PGD_A(nO), PGD_A(sdt), PGD_A(f32)));
                *in[i] = wi;
            }
        }
        /* the chunk's rows of y (and dy): row h0 * T on, the logsumexp in column D (stride D + 1), or packed
         * after y's n elements */
        pgd_ptr lse = at.packed ? pgd_at(py, (n + h0 * T) * 4) : pgd_at(py, (h0 * T * Dy + D) * 4);
        int32_t from_lse = back;
        if (!e) e = pgd_gemm_run(g, gdt, 0, 1, T, T, D, qc, td, kc, td, S, tt, ch, gw);
        if (!e) e = pgd_row_launch(g, PGD_K_ATT_SOFTMAX, rows, T,
                                   PGD_ARGS(PGD_P(S), PGD_P(P), PGD_P(lse), PGD_A(rows), PGD_A(T), PGD_A(scale), PGD_A(ls),
                                            PGD_A(from_lse), PGD_A(pdt), PGD_P(ps), PGD_A(r0), PGD_A(heads)));
        if (!back) {
            if (!e) e = pgd_gemm_run(g, gdt, 0, 0, T, D, T, P, tt, vc, td, O, td, ch, gw);
            /* into y's first D columns of the chunk's rows */
            if (!e) e = at.packed ? pgd_att_repack(g, &at, py, O, h0 * T, rows, -1, four, 0) : pgd_copy2d(g, O, py, rows, D, D, 0, Dy, h0 * T * Dy);
            continue;
        }
        /* dO: y's gradient without its logsumexp column, contiguous (and as bf16 for the GEMMs) */
        pgd_ptr dO = O;
        if (!e) e = at.packed ? pgd_att_repack(g, &at, at.dy, O, h0 * T, rows, -1, four, 1) : pgd_copy2d(g, at.dy, O, rows, D, Dy, h0 * T * Dy, D, 0);
        if (!e && lowp) {
            int32_t bf16 = (int32_t)PDDE_BF16;
            e = pgd_launch_1d(g, PGD_K_CAST, nO, PGD_ARGS(PGD_P(O), PGD_P(dOb), PGD_A(nO), PGD_A(f32), PGD_A(bf16)));
            dO = dOb;
        }
        /* packed: each gradient through one contiguous block, then into dqkv's layout */
        pgd_ptr pg = pgd_at(w, o_pg), dq = at.packed ? pg : pgd_at(po, h0 * td * 4), dk = at.packed ? pg : pgd_at(po, (n + h0 * td) * 4),
                dv = at.packed ? pg : pgd_at(po, (2 * n + h0 * td) * 4);
        if (!e) e = pgd_gemm_run(g, gdt, 1, 0, T, D, T, P, tt, dO, td, dv, td, ch, gw);      /* dV = P^T dO */
        if (!e && at.packed) e = pgd_att_repack(g, &at, po, pg, h0 * T, rows, 2, four, 0);
        if (!e) e = pgd_gemm_run(g, gdt, 0, 1, T, T, D, dO, td, vc, td, dP, tt, ch, gw);     /* dP = dO V^T */
        if (!e) e = pgd_row_launch(g, PGD_K_ATT_DSOFTMAX, rows, T,                           /* dS, in P's place */
                                   PGD_ARGS(PGD_P(S), PGD_P(dP), PGD_P(lse), PGD_P(P), PGD_A(rows), PGD_A(T), PGD_A(scale),
                                            PGD_A(ls), PGD_A(pdt), PGD_P(ps), PGD_A(r0), PGD_A(heads)));
        if (!e) e = pgd_gemm_run(g, gdt, 0, 0, T, D, T, P, tt, kc, td, dq, td, ch, gw);      /* dQ = dS K */
        if (!e && at.packed) e = pgd_att_repack(g, &at, po, pg, h0 * T, rows, 0, four, 0);
        if (!e) e = pgd_gemm_run(g, gdt, 1, 0, T, D, T, P, tt, qc, td, dk, td, ch, gw);      /* dK = dS^T Q */
        if (!e && at.packed) e = pgd_att_repack(g, &at, po, pg, h0 * T, rows, 1, four, 0);
    }
    return e;
}

/* The tiled kernels (FlashAttention-2's schedule): the forward a group per tile of query rows, walking
 * key and value tiles in group memory with an online softmax and keeping each row's logsumexp; the
 * backward rowsum(dO * O) per row first, then dq a group per query tile (over the key tiles it sees) and
 * dk, dv a group per key tile (over the query tiles that see it): no atomics, deterministic. q, k, v are
 * read as they are (bf16 or f32), everything after in f32 (a backend's tensor-core kernels round P and
 * dS to bf16 for their products). Groups walk the heavy (late) query tiles first. With starts every pair
 * is masked and the tiles no row of a group sees are skipped. f32 on a backend with
 * its own f32 kernels (PGD_FLASH_F32_NAMED: CUDA's k_flash_f32_*) takes those, with their own rows a
 * group and threads (backends/flash_f32_tiles.h) and the same arguments; onepass (its path flash2): the
 * backward zeroes dq, then k_flash_f32_back2 a group per key tile adds dq with atomics beside dk, dv. */
static int pgd_attention_flash(const pgd_ctx *g, pdde_tensor *node, int *copied, int onepass) {
    const pdde_tensor *q = node->src[0];
    pgd_att at = pgd_att_of(node);
    int64_t BH = at.BH, T = at.T, D = at.D, rows = at.rows, H = at.hk, heads = at.H;
    float scale = pdde_op_f32(node, PDDE_P_ATTENTION_SCALE);
    if (!rows) return PDDE_OK;
    int32_t bf16 = q->dtype == PDDE_BF16;
    int f32k = q->dtype == PDDE_F32 && (g->has_flash & PGD_FLASH_F32_NAMED);
    int64_t rows_f = f32k ? PDDE_FF_FWD_ROWS(D) : g->flash_rows, rows_b = f32k ? PDDE_FF_BWD_ROWS(D) : g->flash_rows;
    int64_t rows_g = node->op == PDDE_OP_ATTENTION ? rows_f : rows_b, groups = BH * ((T + rows_g - 1) / rows_g);
    unsigned bx = f32k ? PDDE_FF_THREADS : g->flash_threads;
    if (groups > (int64_t)UINT32_MAX / bx)
        return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: attention %s: %lld tiles are more than one launch holds", g->name,
                          node->name, (long long)groups);
    pgd_ptr pq = at.q, pk = at.k, pv = at.v, po = at.out, ps = at.starts; /* (the f32 kernels take starts unread: pgd_attention_path) */
    unsigned gx = (unsigned)groups;
    int d128 = D == 128; /* (a kernel per head size: the CUDA ones then take the registers and shared memory theirs needs) */
    int k_fwd = f32k ? PGD_K_FLASH_F32_FWD : PGD_K_FLASH_FWD, k_dq = f32k ? PGD_K_FLASH_F32_BACK_DQ : PGD_K_FLASH_BACK_DQ,
        k_dkv = f32k ? PGD_K_FLASH_F32_BACK_DKV : PGD_K_FLASH_BACK_DKV;
    /* kernels that take the output's bf16 copy (PGD_FLASH_COPY) store it themselves where the node has one
     * (PDDE_P_ATTENTION_LOWP_COPY); cp NULL: none */
    int with_cp = (g->has_flash & PGD_FLASH_COPY) != 0;
    pgd_ptr cp = pgd_null;
    if (with_cp && bf16 && at.packed && pdde_op_i32(node, PDDE_P_ATTENTION_LOWP_COPY) == PDDE_BF16)
        cp = pgd_at(at.out, (int64_t)pdde_lowp_copy_offset(node)), *copied = 1;
    pgd_arg cp_arg = PGD_P(cp);
    if (node->op == PDDE_OP_ATTENTION) {
        pgd_arg args[] = {PGD_P(pq), PGD_P(pk), PGD_P(pv), PGD_P(po), PGD_A(BH), PGD_A(T), PGD_A(D), PGD_A(scale), PGD_A(bf16), PGD_A(H),
                          PGD_P(ps), PGD_A(heads), cp_arg};
        return pgd_launch(g, k_fwd + d128, gx, 1, 1, bx, 1, (int)(sizeof args / sizeof args[0]) - !with_cp, args);
    }
    pgd_ptr py = at.y, pdy = at.dy, rowdot = pgd_null;
    int e = g->scratch(g->impl, g->stream, (size_t)rows * sizeof(float), &rowdot);
    if (!e) e = pgd_launch_1d(g, PGD_K_FLASH_ROWDOT, rows, PGD_ARGS(PGD_P(py), PGD_P(pdy), PGD_P(rowdot), PGD_A(rows), PGD_A(D), PGD_A(T), PGD_A(H)));
    pgd_arg args[] = {PGD_P(pq), PGD_P(pk), PGD_P(pv), PGD_P(py), PGD_P(pdy), PGD_P(rowdot), PGD_P(po), PGD_A(BH), PGD_A(T), PGD_A(D),
                      PGD_A(scale), PGD_A(bf16), PGD_A(H), PGD_P(ps), PGD_A(heads), cp_arg};
    int nargs = (int)(sizeof args / sizeof args[0]) - !with_cp;
    if (f32k && onepass) {
        if (!e) e = pgd_launch_1d(g, PGD_K_FLASH_F32_ZERO_DQ, rows * D, PGD_ARGS(PGD_P(po), PGD_A(rows), PGD_A(D), PGD_A(T), PGD_A(H)));
        if (!e) e = pgd_launch(g, PGD_K_FLASH_F32_BACK2 + d128, gx, 1, 1, bx, 1, nargs, args);
        return e;
    }
    if (!e) e = pgd_launch(g, k_dq + d128, gx, 1, 1, bx, 1, nargs, args);
    if (!e) e = pgd_launch(g, k_dkv + d128, gx, 1, 1, bx, 1, nargs, args); /* (f32: key tiles of rows_b rows, as many as dq's) */
    return e;
}

/* flash2 (backends/cuda_flash2.cuh), q, k, v apart or packed in qkv (the kernels' layout argument H): the
 * forward flash's with K, V copies overlapping the products (at D 64; flash's own at D 128), query tiles
 * tile-major; the backward FlashAttention-2's one pass: k_flash2_prep (a warp per row) rounds dO to bf16
 * into scratch, keeps each row's base-2 logsumexp and rowsum(dO * O) and zeroes the row's dq;
 * k_flash2_back, a group per key tile (tile-major: the tiles that the most queries see start first),
 * accumulates dk, dv in registers and adds dq with atomics. The forward stores y's bf16 copy itself (the
 * node's PDDE_P_ATTENTION_LOWP_COPY); the backward's is a cast after it (dq is complete only then). A node with
 * starts runs each kernel's *_docs twin (pgd_flash2_docs; not the preprocessing's), given the starts and heads
 * after its other arguments. */
static int pgd_attention_flash2(const pgd_ctx *g, pdde_tensor *node, int *copied) {
    pgd_att at = pgd_att_of(node);
    int64_t BH = at.BH, T = at.T, D = at.D, rows = at.rows, H = at.hk, heads = at.H;
    float scale = pdde_op_f32(node, PDDE_P_ATTENTION_SCALE);
    if (node->src[0]->dtype == PDDE_F32) return pgd_attention_flash(g, node, copied, 1); /* (f32: k_flash_f32_*, one-pass backward) */
    if (node->op == PDDE_OP_ATTENTION && D != 64) return pgd_attention_flash(g, node, copied, 0);
    if (!rows) return PDDE_OK;
    int64_t groups = BH * ((T + g->flash_rows - 1) / g->flash_rows), prep_groups = (rows + g->flash_threads / 32 - 1) / (g->flash_threads / 32);
    if (groups > (int64_t)UINT32_MAX || prep_groups > (int64_t)UINT32_MAX)
        return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: attention %s: %lld tiles are more than one launch holds", g->name,
                          node->name, (long long)groups);
    pgd_ptr pq = at.q, pk = at.k, pv = at.v, po = at.out, ps = at.starts;
    int docs = pdde_attention_starts(node) != NULL, ndocs = docs ? 2 : 0; /* (the *_docs kernels' arguments starts, heads) */
    /* the variants' groups (pgd_ctx.flash2_variant): 128 rows of a head each, so at most as many as the default's */
    int64_t groups128 = BH * ((T + PGD_FLASH2_ROWS128 - 1) / PGD_FLASH2_ROWS128);
    if (node->op == PDDE_OP_ATTENTION) {
        pgd_ptr cp = pgd_null;
        if (at.packed && node->src[0]->dtype == PDDE_BF16 && pdde_op_i32(node, PDDE_P_ATTENTION_LOWP_COPY) == PDDE_BF16)
            cp = pgd_at(at.out, (int64_t)pdde_lowp_copy_offset(node)), *copied = 1;
        int q128 = (g->flash2_variant & PGD_FLASH2_Q128) != 0, kf = (q128 ? PGD_K_FLASH2_FWD_Q128 : PGD_K_FLASH2_FWD) + at.packed;
        pgd_arg args[] = {PGD_P(pq), PGD_P(pk), PGD_P(pv), PGD_P(po), PGD_A(BH), PGD_A(T), PGD_A(scale), PGD_A(H), PGD_P(cp),
                          PGD_P(ps), PGD_A(heads)};
        return pgd_launch(g, docs ? pgd_flash2_docs(kf) : kf, (unsigned)(q128 ? groups128 : groups), 1, 1, g->flash_threads, 1,
                          (int)(sizeof args / sizeof args[0]) - 2 + ndocs, args);
    }
    pgd_ptr py = at.y, pdy = at.dy, w = pgd_null;
    int64_t o_stats = pgd_align256(rows * D * 2);
    int d128 = D == 128;
    int e = g->scratch(g->impl, g->stream, (size_t)(o_stats + rows * 2 * (int64_t)sizeof(float)), &w);
    pgd_ptr dob = w, stats = pgd_at(w, o_stats);
    if (!e) e = pgd_launch(g, PGD_K_FLASH2_PREP + d128, (unsigned)prep_groups, 1, 1, g->flash_threads, 1,
                           PGD_ARGS(PGD_P(py), PGD_P(pdy), PGD_P(dob), PGD_P(stats), PGD_P(po), PGD_A(rows), PGD_A(T), PGD_A(H)));
    int k128 = (g->flash2_variant & PGD_FLASH2_K128) && !d128, dqs = !k128 && (g->flash2_variant & PGD_FLASH2_DQSMEM);
    int kb = k128 ? PGD_K_FLASH2_BACK_K128 + at.packed : (dqs ? PGD_K_FLASH2_BACK_DQS : PGD_K_FLASH2_BACK) + 2 * at.packed + d128;
    pgd_arg args[] = {PGD_P(pq), PGD_P(pk), PGD_P(pv), PGD_P(dob), PGD_P(stats), PGD_P(po), PGD_A(BH), PGD_A(T), PGD_A(scale), PGD_A(H),
                      PGD_P(ps), PGD_A(heads)};
    if (!e) e = pgd_launch(g, docs ? pgd_flash2_docs(kb) : kb, (unsigned)(k128 ? groups128 : groups), 1, 1,
                           k128 ? PGD_FLASH2_K128_THREADS : g->flash_threads, 1, (int)(sizeof args / sizeof args[0]) - 2 + ndocs, args);
    return e;
}

/* The output's rounded copy beside it (PDDE_P_ATTENTION_LOWP_COPY: lowering's PDDE_ATT_LOWP), where the
 * path's kernels did not store it themselves: one cast of the f32 output (as the cast node it replaces) */
static int pgd_attention_copy(const pgd_ctx *g, pdde_tensor *node) {
    int32_t cdt = pdde_op_i32(node, PDDE_P_ATTENTION_LOWP_COPY), f32 = (int32_t)PDDE_F32;
    int64_t n = pgd_numel(node);
    pgd_ptr po = pgd_ptr_of(node), pc = pgd_at(po, (int64_t)pdde_lowp_copy_offset(node));
    return !cdt || !n ? PDDE_OK : pgd_launch_1d(g, PGD_K_CAST, n, PGD_ARGS(PGD_P(po), PGD_P(pc), PGD_A(n), PGD_A(f32), PGD_A(cdt)));
}

static int pgd_attention(const pgd_ctx *g, pdde_tensor *node) {
    int e, copied = 0;
    switch (pgd_attention_path(g, node)) {
    case PGD_ATT_UNFUSED: e = pgd_attention_unfused(g, node); break;
    case PGD_ATT_FLASH: e = pgd_attention_flash(g, node, &copied, 0); break;
    case PGD_ATT_FLASH2: e = pgd_attention_flash2(g, node, &copied); break;
    default: e = pgd_attention_rows(g, node); break;
    }
    return e || copied ? e : pgd_attention_copy(g, node);
}

/* AdamW's bias corrections of the node's step. */
static void pgd_adamw_bias_corrections(const pdde_tensor *node, float *bc1, float *bc2) {
    int t = pdde_op_i32(node, PDDE_P_UPDATE_STEP) > 0 ? pdde_op_i32(node, PDDE_P_UPDATE_STEP) : 1;
    *bc1 = 1.0f - powf(pdde_op_f32(node, PDDE_P_UPDATE_BETA1), (float)t), *bc2 = 1.0f - powf(pdde_op_f32(node, PDDE_P_UPDATE_BETA2), (float)t);
}

/* The radix sort's shape (RADIX_* in both kernel sources): RADIX_BITS of the row a pass, groups of at most
 * PGD_EMB_RADIX_GROUP items, each item PGD_EMB_RADIX_CHUNK consecutive keys (its counters: 16 per 32 keys). */
#define PGD_EMB_RADIX_BITS 4
#define PGD_EMB_RADIX_GROUP 256
#define PGD_EMB_RADIX_CHUNK 32
/* ids from which the radix sort takes over from one group's network: a PoCL number (a CPU device, both sorts
 * forced; bench_embedding_back --sorts, [50304, 16], device time): even up to 1024 ids, the radix sort 0.73x
 * the network's time at 2048, 0.37x at 32768; unmeasured on a GPU */
#define PGD_EMB_RADIX_MIN 2048

/* keys [nid] (id << 32 | position, ids outside [0, V) as 0xffffffff) sorted by a stable LSD radix sort over the
 * row's bits, through tmp [nid] and cnt (2^PGD_EMB_RADIX_BITS counters an item): the keys start in position
 * order, so positions stay ascending within a row. */
static int pgd_embedding_radix_sort(const pgd_ctx *g, pgd_ptr ids, pgd_ptr keys, pgd_ptr tmp, pgd_ptr cnt, int64_t nid, int64_t V,
                                    unsigned groups, unsigned block) {
    int bits = 0, passes, e;
    while (bits < 63 && (V >> bits) > 0) bits++; /* (rows outside the table sort as V) */
    passes = (bits + PGD_EMB_RADIX_BITS - 1) / PGD_EMB_RADIX_BITS;
    pgd_ptr src = passes % 2 ? tmp : keys, dst = passes % 2 ? keys : tmp; /* (the last pass lands in keys) */
    e = pgd_launch_1d(g, PGD_K_EMBEDDING_KEYS, nid, PGD_ARGS(PGD_P(ids), PGD_P(src), PGD_A(nid), PGD_A(V)));
    int64_t chunk = PGD_EMB_RADIX_CHUNK, m = (int64_t)groups * block * (1 << PGD_EMB_RADIX_BITS);
    unsigned scan_block = g->max_block < PGD_EMB_RADIX_GROUP ? g->max_block : PGD_EMB_RADIX_GROUP;
    for (int32_t shift = 0; !e && shift < bits; shift += PGD_EMB_RADIX_BITS) {
        e = pgd_launch(g, PGD_K_EMBEDDING_RADIX_COUNT, groups, 1, 1, block, 1,
                       PGD_ARGS(PGD_P(src), PGD_P(cnt), PGD_A(nid), PGD_A(chunk), PGD_A(V), PGD_A(shift)));
        if (!e) e = pgd_launch(g, PGD_K_EMBEDDING_RADIX_SCAN, 1, 1, 1, scan_block, 1, PGD_ARGS(PGD_P(cnt), PGD_A(m)));
        if (!e)
            e = pgd_launch(g, PGD_K_EMBEDDING_RADIX_SCATTER, groups, 1, 1, block, 1,
                           PGD_ARGS(PGD_P(src), PGD_P(dst), PGD_P(cnt), PGD_A(nid), PGD_A(chunk), PGD_A(V), PGD_A(shift)));
        pgd_ptr t = src;
        src = dst, dst = t;
    }
    return e;
}

/* out [V, C] += the dy rows [nid, C] of each id, in the order of the ids (PGD_EMB_SORTED): the keys id << 32 |
 * position sorted in scratch (pgd_ctx.embedding_sort: one item's counting sort, one group's bitonic network or
 * the radix sort over many groups), then a group per run of one id. */
static int pgd_embedding_back_sorted(const pgd_ctx *g, pgd_ptr ids, pgd_ptr dy, pgd_ptr out, int64_t nid, int64_t C, int64_t V) {
    if (nid > INT32_MAX || V > INT32_MAX)
        return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: embedding backward of %lld ids into %lld rows: the sorted keys hold 32-bit positions and rows",
                          g->name, (long long)nid, (long long)V);
    int sort = g->embedding_sort;
    if (sort == PGD_EMB_SORT_AUTO)
        sort = g->item_per_element && V <= 64 * nid ? PGD_EMB_SORT_COUNT : nid >= PGD_EMB_RADIX_MIN ? PGD_EMB_SORT_RADIX : PGD_EMB_SORT_NETWORK;
    int64_t n_pow2 = 1;
    while (n_pow2 < nid) n_pow2 *= 2;
    unsigned block = g->max_block < 1024 ? g->max_block : 1024;
    unsigned radix_block = g->max_block < PGD_EMB_RADIX_GROUP ? g->max_block : PGD_EMB_RADIX_GROUP;
    int64_t radix_items = (nid + PGD_EMB_RADIX_CHUNK - 1) / PGD_EMB_RADIX_CHUNK;
    unsigned radix_groups = (unsigned)((radix_items + radix_block - 1) / radix_block);
    if (!radix_groups) radix_groups = 1;
    size_t key_bytes = (size_t)(sort == PGD_EMB_SORT_NETWORK ? n_pow2 : nid) * sizeof(uint64_t), extra = 0;
    if (sort == PGD_EMB_SORT_COUNT) extra = (size_t)(V + 1) * sizeof(int32_t);
    if (sort == PGD_EMB_SORT_RADIX) extra = key_bytes + (size_t)radix_groups * radix_block * (1u << PGD_EMB_RADIX_BITS) * sizeof(int32_t);
    pgd_ptr keys;
    int e = g->scratch(g->impl, g->stream, key_bytes + extra, &keys);
    pgd_ptr more = pgd_at(keys, (int64_t)key_bytes);
    if (e) return e;
    if (sort == PGD_EMB_SORT_COUNT)
        e = pgd_launch(g, PGD_K_EMBEDDING_COUNT_SORT, 1, 1, 1, 1, 1, PGD_ARGS(PGD_P(ids), PGD_P(keys), PGD_P(more), PGD_A(nid), PGD_A(V)));
    else if (sort == PGD_EMB_SORT_RADIX)
        e = pgd_embedding_radix_sort(g, ids, keys, more, pgd_at(more, (int64_t)key_bytes), nid, V, radix_groups, radix_block);
    else
        e = pgd_launch(g, PGD_K_EMBEDDING_SORT, 1, 1, 1, block, 1, PGD_ARGS(PGD_P(ids), PGD_P(keys), PGD_A(nid), PGD_A(n_pow2), PGD_A(V)));
    int64_t cap = (int64_t)(g->units ? g->units : 1) * 32; /* (groups stride over the positions: most start no run) */
    unsigned groups = (unsigned)(nid < cap ? nid : cap), row_block = pgd_row_block(g, C);
    while (row_block > 1 && row_block / 2 >= C) row_block /= 2; /* (narrow rows: every item walks the positions) */
    if (!e) e = pgd_launch(g, PGD_K_EMBEDDING_BACK_ROWS, groups, 1, 1, row_block, 1,
                           PGD_ARGS(PGD_P(dy), PGD_P(keys), PGD_P(out), PGD_A(nid), PGD_A(C), PGD_A(V)));
    return e;
}

/* rope of x [B, T, H, D] (pgd_supports_rope): an item per pair (i, i + D/2) of a row of D, consecutive items consecutive
 * i; PDDE_P_ROPE_INVERSE rotates by minus the angle (the backward) */
static int pgd_rope(const pgd_ctx *g, const pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int64_t T = x->shape[1], H = x->shape[2], half_d = x->shape[3] / 2, pairs = pgd_numel(x) / 2;
    if (!pairs) return PDDE_OK;
    pgd_rope_freqs f;
    memset(&f, 0, sizeof f);
    float sign = pdde_op_i32(node, PDDE_P_ROPE_INVERSE) ? -1.0f : 1.0f;
    for (int64_t i = 0; i < half_d; i++) f.inv[i] = pdde_rope_inv_freq(node, i, x->shape[3]); /* (backends/cpu.c's) */
    int32_t dt = (int32_t)x->dtype;
    pgd_ptr px = pgd_ptr_of(x), py = pgd_ptr_of(node);
    return pgd_launch_1d(g, PGD_K_ROPE, pairs,
                         PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(pairs), PGD_A(T), PGD_A(H), PGD_A(half_d), PGD_A(f), PGD_A(sign), PGD_A(dt)));
}

static inline int pgd_compute_group(const pgd_ctx *g, pdde_tensor *const *nodes, int n);
static int pgd_compute(const pgd_ctx *g, pdde_tensor *node) {
    if (node->op == PDDE_OP_ROPE) /* (offered per backend: not in pgd_supports_op) */
        return node->flags & PDDE_TENSOR_SUPPORTED || pgd_supports_rope(node)
                   ? pgd_rope(g, node)
                   : pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: rope %s (%s) is not supported", g->name, node->name, pdde_dtype_name(node->dtype));
    if (!(node->flags & PDDE_TENSOR_SUPPORTED) && !pgd_supports_op(node)) /* (a session's nodes were asked when it compiled) */
        return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: op %s on %s (%s) is not supported", g->name,
                          pdde_op_name(node->op), node->name, pdde_dtype_name(node->dtype));
    int64_t n = pgd_numel(node);
    pdde_tensor *x = node->nsrc > 0 ? node->src[0] : NULL;
    int e;
    switch (node->op) {
    case PDDE_OP_MATMUL: return pgd_matmul(g, node);
    case PDDE_OP_ADD: return pgd_binary(g, node, PGD_B_ADD);
    case PDDE_OP_SUB: return pgd_binary(g, node, PGD_B_SUB);
    case PDDE_OP_MUL: return pgd_binary(g, node, PGD_B_MUL);
    case PDDE_OP_GRAD_ACCUM: { /* acc (src0) += g, in place */
        if (node->nsrc == 3) return pgd_grad_accum_matmul(g, node);
        if (!n) return PDDE_OK;
        pgd_ptr pa = pgd_ptr_of(x), pb = pgd_ptr_of(node->src[1]);
        int32_t opi = PGD_B_ADD;
        return pgd_launch_1d(g, PGD_K_BINARY, n, PGD_ARGS(PGD_P(pa), PGD_P(pb), PGD_P(pa), PGD_A(n), PGD_A(n), PGD_A(opi)));
    }
    case PDDE_OP_SCALE: return pgd_unary(g, pgd_ptr_of(x), pgd_ptr_of(node), n, PGD_U_SCALE, pdde_op_f32(node, PDDE_P_SCALE));
    case PDDE_OP_GELU: return pgd_unary(g, pgd_ptr_of(x), pgd_ptr_of(node), n, PGD_U_GELU, 0.0f);
    case PDDE_OP_RELU: return pgd_unary(g, pgd_ptr_of(x), pgd_ptr_of(node), n, PGD_U_RELU, 0.0f);
    case PDDE_OP_SILU: return pgd_unary(g, pgd_ptr_of(x), pgd_ptr_of(node), n, PGD_U_SILU, 0.0f);
    case PDDE_OP_GELU_BACK: return pgd_unary_back(g, node, PGD_U_GELU);
    case PDDE_OP_RELU_BACK: return pgd_unary_back(g, node, PGD_U_RELU);
    case PDDE_OP_SILU_BACK: return pgd_unary_back(g, node, PGD_U_SILU);
    case PDDE_OP_RESHAPE: return pgd_dcopy(g, pgd_ptr_of(node), pgd_ptr_of(x), pdde_tensor_nbytes(node));
    case PDDE_OP_BIAS_GELU: case PDDE_OP_BIAS_GELU_BACK: {
        int64_t nb = pgd_numel(node->src[1]);
        int32_t back = node->op == PDDE_OP_BIAS_GELU_BACK;
        if (!n) return PDDE_OK;
        pgd_ptr px = pgd_ptr_of(x), pb = pgd_ptr_of(node->src[1]), py = pgd_ptr_of(node);
        pgd_ptr pdy = back ? pgd_ptr_of(node->src[2]) : pgd_null;
        int32_t ydt = (int32_t)node->dtype; /* (f32, or bf16/f16 where a cast was folded in) */
        if ((g->mem_kernels & PGD_MEM_GELU2) && nb % 4 == 0 && n % nb == 0 && (pgd_addr(px) | pgd_addr(pb) | pgd_addr(pdy)) % 16 == 0 &&
            pgd_addr(py) % (ydt ? 8 : 16) == 0) { /* (a block of 256 threads: 1024 columns; rows split for 4 blocks a compute
                                                   * unit, as many as fit at its 64 registers a thread) */
            int64_t rows = n / nb, gx = (nb / 4 + 255) / 256, gy = (int64_t)(g->units ? g->units : 1) * 4 / gx;
            gy = gy < 1 ? 1 : gy > rows ? rows : gy > 65535 ? 65535 : gy;
            return pgd_launch(g, PGD_K_BIAS_GELU2, (unsigned)gx, (unsigned)gy, 1, 256, 1,
                              PGD_ARGS(PGD_P(px), PGD_P(pb), PGD_P(pdy), PGD_P(py), PGD_A(n), PGD_A(nb), PGD_A(back), PGD_A(ydt)));
        }
        return pgd_launch_1d(g, PGD_K_BIAS_GELU, n,
                             PGD_ARGS(PGD_P(px), PGD_P(pb), PGD_P(pdy), PGD_P(py), PGD_A(n), PGD_A(nb), PGD_A(back), PGD_A(ydt)));
    }
    case PDDE_OP_LAYERNORM:
    case PDDE_OP_RMSNORM: {
        int64_t rows, C;
        if (!pgd_rows(x, &rows, &C)) return PDDE_OK;
        float eps = pdde_op_f32(node, PDDE_P_NORM_EPS);
        pgd_ptr px = pgd_ptr_of(x), pg = pgd_ptr_of(node->src[1]), py = pgd_ptr_of(node);
        if (node->op == PDDE_OP_RMSNORM)
            return pgd_row_launch(g, PGD_K_RMSNORM, rows, C,
                                  PGD_ARGS(PGD_P(px), PGD_P(pg), PGD_P(py), PGD_A(rows), PGD_A(C), PGD_A(eps)));
        pgd_ptr pb = pgd_opt_src(node, 2);
        int32_t ydt = (int32_t)node->dtype; /* (f32, or bf16/f16 where a cast was folded in) */
        int add_in = pdde_op_i32(node, PDDE_P_NORM_ADD_IN) != 0; /* (x + src 3, the sum beside y: PDDE_FUSE_ADD_LN) */
        pgd_ptr pres = add_in ? pgd_ptr_of(node->src[3]) : pgd_null, psum = add_in ? pgd_at(py, (int64_t)pdde_lowp_copy_offset(node)) : pgd_null;
        if (pgd_ln2_on(g, C))
            return pgd_launch(g, pgd_ln2_kernel(PGD_K_LAYERNORM2, C), pgd_ln2_grid(g, rows), 1, 1, 32 * pgd_ln2_warps(g), 1,
                              PGD_ARGS(PGD_P(px), PGD_P(pg), PGD_P(pb), PGD_P(py), PGD_A(rows), PGD_A(C), PGD_A(eps), PGD_A(ydt),
                                       PGD_P(pres), PGD_P(psum)));
        return pgd_row_launch(g, PGD_K_LAYERNORM, rows, C,
                              PGD_ARGS(PGD_P(px), PGD_P(pg), PGD_P(pb), PGD_P(py), PGD_A(rows), PGD_A(C), PGD_A(eps), PGD_A(ydt),
                                       PGD_P(pres), PGD_P(psum)));
    }
    case PDDE_OP_LAYERNORM_BACK:
    case PDDE_OP_RMSNORM_BACK: {
        int64_t rows, C;
        if (!pgd_rows(x, &rows, &C)) return PDDE_OK;
        float eps = pdde_op_f32(node, PDDE_P_NORM_EPS);
        pgd_ptr px = pgd_ptr_of(x), pg = pgd_ptr_of(node->src[1]), pdy = pgd_ptr_of(node->src[2]), pdx = pgd_ptr_of(node);
        pgd_ptr pres = pgd_opt_src(node, 3); /* (layernorm: the other gradient of x, added: PDDE_FUSE_ADD_LN) */
        int32_t cdt = node->op == PDDE_OP_LAYERNORM_BACK ? pdde_op_i32(node, PDDE_P_NORM_LOWP_COPY) : 0; /* (PDDE_BF16_GRADS) */
        pgd_ptr pcp = cdt ? pgd_at(pdx, (int64_t)pdde_lowp_copy_offset(node)) : pgd_null;
        if (node->op == PDDE_OP_LAYERNORM_BACK && pgd_ln2_on(g, C))
            return pgd_launch(g, pgd_ln2_kernel(PGD_K_LAYERNORM_BACK2, C), pgd_ln2_grid(g, rows), 1, 1, 32 * pgd_ln2_warps(g), 1,
                              PGD_ARGS(PGD_P(px), PGD_P(pg), PGD_P(pdy), PGD_P(pdx), PGD_A(rows), PGD_A(C), PGD_A(eps), PGD_P(pres),
                                       PGD_P(pcp), PGD_A(cdt)));
        if (node->op == PDDE_OP_LAYERNORM_BACK)
            return pgd_row_launch(g, PGD_K_LAYERNORM_BACK, rows, C,
                                  PGD_ARGS(PGD_P(px), PGD_P(pg), PGD_P(pdy), PGD_P(pdx), PGD_A(rows), PGD_A(C), PGD_A(eps), PGD_P(pres),
                                           PGD_P(pcp), PGD_A(cdt)));
        return pgd_row_launch(g, PGD_K_RMSNORM_BACK, rows, C,
                              PGD_ARGS(PGD_P(px), PGD_P(pg), PGD_P(pdy), PGD_P(pdx), PGD_A(rows), PGD_A(C), PGD_A(eps)));
    }
    case PDDE_OP_LAYERNORM_BACK_GAMMA: return pgd_gamma_back(g, node, 0);
    case PDDE_OP_RMSNORM_BACK_GAMMA: return pgd_gamma_back(g, node, 1);
    case PDDE_OP_SOFTMAX: {
        int64_t rows, C;
        if (!pgd_rows(x, &rows, &C)) return PDDE_OK;
        int64_t T = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1;
        int32_t causal = pdde_op_i32(node, PDDE_P_SOFTMAX_CAUSAL) != 0;
        pgd_ptr px = pgd_ptr_of(x), py = pgd_ptr_of(node);
        return pgd_row_launch(g, PGD_K_SOFTMAX, rows, C,
                              PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(rows), PGD_A(C), PGD_A(T), PGD_A(causal)));
    }
    case PDDE_OP_SOFTMAX_BACK: {
        int64_t rows, C;
        if (!pgd_rows(x, &rows, &C)) return PDDE_OK;
        pgd_ptr py = pgd_ptr_of(x), pdy = pgd_ptr_of(node->src[1]), pdx = pgd_ptr_of(node);
        return pgd_row_launch(g, PGD_K_SOFTMAX_BACK, rows, C,
                              PGD_ARGS(PGD_P(py), PGD_P(pdy), PGD_P(pdx), PGD_A(rows), PGD_A(C)));
    }
    case PDDE_OP_ATTENTION: case PDDE_OP_ATTENTION_BACK: return pgd_attention(g, node);
    case PDDE_OP_CROSS_ENTROPY: return pgd_cross_entropy(g, node);
    case PDDE_OP_CROSS_ENTROPY_BACK: return pgd_cross_entropy_back(g, node);
    case PDDE_OP_EMBEDDING: {
        pdde_tensor *ids = node->src[1];
        int64_t C = x->shape[x->ndim - 1], V = x->shape[0], nid = pgd_numel(ids);
        if (!nid || !C) return PDDE_OK;
        pgd_ptr pt = pgd_ptr_of(x), pi = pgd_ptr_of(ids), py = pgd_ptr_of(node);
        return pgd_launch_1d(g, PGD_K_EMBEDDING, nid * C,
                             PGD_ARGS(PGD_P(pt), PGD_P(pi), PGD_P(py), PGD_A(nid), PGD_A(C), PGD_A(V)));
    }
    case PDDE_OP_EMBEDDING_BACK: { /* src: [base,] ids, dy */
        int has_base = node->nsrc == 3;
        pdde_tensor *ids = node->src[has_base ? 1 : 0], *dy = node->src[has_base ? 2 : 1];
        int64_t C = node->shape[node->ndim - 1], V = node->shape[0], nid = pgd_numel(ids);
        pgd_ptr py = pgd_ptr_of(node);
        if (has_base) e = pgd_dcopy(g, py, pgd_ptr_of(x), pdde_tensor_nbytes(node));
        else e = n ? g->fill32(g->impl, g->stream, py, 0, (size_t)n) : PDDE_OK;
        if (e || !nid || !C) return e;
        pgd_ptr pi = pgd_ptr_of(ids), pdy = pgd_ptr_of(dy);
        if (g->embedding_back == PGD_EMB_SORTED) return pgd_embedding_back_sorted(g, pi, pdy, py, nid, C, V);
        return pgd_launch_1d(g, PGD_K_EMBEDDING_BACK, nid * C,
                             PGD_ARGS(PGD_P(pdy), PGD_P(pi), PGD_P(py), PGD_A(nid), PGD_A(C), PGD_A(V)));
    }
    case PDDE_OP_PERMUTE:
    case PDDE_OP_EXPAND: {
        if (!n) return PDDE_OK;
        pgd_shape sh;
        memset(&sh, 0, sizeof sh);
        sh.ndim = node->ndim;
        for (int i = 0; i < node->ndim; i++) sh.shape[i] = node->shape[i];
        float scale = 1.0f;
        if (node->op == PDDE_OP_PERMUTE) {
            int64_t st[PGD_MAX_DIMS], acc = 1;
            for (int i = x->ndim - 1; i >= 0; i--) {
                st[i] = acc;
                acc *= x->shape[i];
            }
            for (int i = 0; i < node->ndim; i++) {
                int p = pdde_op_i32(node, PDDE_P_PERMUTE_DIM0 + i);
                if (p < 0 || p >= x->ndim)
                    return pdde_error(g->ctx, PDDE_ERR_INVALID_ARG, "%s: permute %s: bad axis %d", g->name, node->name, p);
                sh.sa[i] = st[p];
            }
        } else {
            pgd_bcast_strides(x, node->ndim, node->shape, sh.sa);
            scale = pdde_op_f32(node, PDDE_P_SCALE);
        }
        pgd_ptr px = pgd_ptr_of(x), py = pgd_ptr_of(node);
        return pgd_launch_1d(g, PGD_K_GATHER, n, PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(n), PGD_A(sh), PGD_A(scale)));
    }
    case PDDE_OP_CONCAT: {
        int axis = pdde_op_i32(node, PDDE_P_CONCAT_AXIS);
        int64_t outer, inner, total = node->shape[axis], off = 0;
        pgd_axis_split(node, axis, &outer, &inner);
        for (int i = 0; i < node->nsrc; i++) {
            int64_t len = node->src[i]->shape[axis];
            e = pgd_copy2d(g, pgd_ptr_of(node->src[i]), pgd_ptr_of(node), outer, len * inner, len * inner, 0,
                           total * inner, off * inner);
            if (e) return e;
            off += len;
        }
        return PDDE_OK;
    }
    case PDDE_OP_SLICE: {
        int axis = pdde_op_i32(node, PDDE_P_SLICE_AXIS);
        int64_t start = pdde_op_i32(node, PDDE_P_SLICE_START), outer, inner, len = node->shape[axis], full = x->shape[axis];
        pgd_axis_split(node, axis, &outer, &inner);
        return pgd_copy2d(g, pgd_ptr_of(x), pgd_ptr_of(node), outer, len * inner, full * inner, start * inner,
                          len * inner, 0);
    }
    case PDDE_OP_SLICE_BACK: {
        int axis = pdde_op_i32(node, PDDE_P_SLICE_AXIS);
        int64_t start = pdde_op_i32(node, PDDE_P_SLICE_START), outer, inner, len = x->shape[axis], full = node->shape[axis];
        pgd_axis_split(node, axis, &outer, &inner);
        if (n && (e = g->fill32(g->impl, g->stream, pgd_ptr_of(node), 0, (size_t)n))) return e;
        return pgd_copy2d(g, pgd_ptr_of(x), pgd_ptr_of(node), outer, len * inner, len * inner, 0, full * inner,
                          start * inner);
    }
    case PDDE_OP_SUM:
    case PDDE_OP_MEAN: {
        int axis = pdde_op_i32(node, PDDE_P_REDUCE_AXIS), red[PGD_MAX_DIMS];
        int64_t nred = 1;
        for (int i = 0; i < x->ndim; i++) {
            red[i] = axis < 0 || i == axis;
            if (red[i]) nred *= x->shape[i];
        }
        float scale = node->op == PDDE_OP_MEAN ? (nred ? 1.0f / (float)nred : 0.0f) : 1.0f;
        if (pgd_numel(x) == 0) return n ? g->fill32(g->impl, g->stream, pgd_ptr_of(node), 0, (size_t)n) : PDDE_OK;
        return pgd_reduce(g, pgd_ptr_of(x), x->shape, x->ndim, red, pgd_ptr_of(node), scale);
    }
    case PDDE_OP_SUM_TO: {
        if (x->dtype != PDDE_F32) /* (bf16 rows: pgd_supports_op) */
            return pgd_colsum(g, pgd_ptr_of(x), pgd_ptr_of(node), pgd_sum_to_rows(node), n, 1.0f, (int32_t)x->dtype);
        int red[PGD_MAX_DIMS], off = x->ndim - node->ndim;
        for (int i = 0; i < x->ndim; i++) {
            int64_t o = i < off ? 1 : node->shape[i - off];
            red[i] = o != x->shape[i];
        }
        if (pgd_numel(x) == 0) return n ? g->fill32(g->impl, g->stream, pgd_ptr_of(node), 0, (size_t)n) : PDDE_OK;
        return pgd_reduce(g, pgd_ptr_of(x), x->shape, x->ndim, red, pgd_ptr_of(node), 1.0f);
    }
    case PDDE_OP_DROPOUT:
    case PDDE_OP_DROPOUT_BACK: {
        if (!n) return PDDE_OK;
        /* the CPU backend's threshold and scale, computed the same way */
        float p = pdde_op_f32(node, PDDE_P_DROPOUT_P), scale = 1.0f / (1.0f - p);
        double th = (double)p * 4294967296.0;
        uint32_t thr = (uint32_t)(th > 4294967295.0 ? 4294967295.0 : th);
        uint32_t lo = (uint32_t)pdde_op_i32(node, PDDE_P_DROPOUT_SEED_LO), hi = (uint32_t)pdde_op_i32(node, PDDE_P_DROPOUT_SEED_HI);
        uint32_t ctr = (uint32_t)pdde_op_i32(node, PDDE_P_DROPOUT_COUNTER);
        pgd_ptr px = pgd_ptr_of(x), py = pgd_ptr_of(node);
        return pgd_launch_1d(g, PGD_K_DROPOUT, n,
                             PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(n), PGD_A(thr), PGD_A(scale), PGD_A(lo), PGD_A(hi),
                                      PGD_A(ctr)));
    }
    case PDDE_OP_CAST: {
        if (!n) return PDDE_OK;
        if (x->dtype == node->dtype) return pgd_dcopy(g, pgd_ptr_of(node), pgd_ptr_of(x), pdde_tensor_nbytes(node));
        int32_t sdt = (int32_t)x->dtype, ddt = (int32_t)node->dtype;
        pgd_ptr px = pgd_ptr_of(x), py = pgd_ptr_of(node);
        return pgd_launch_1d(g, PGD_K_CAST, n, PGD_ARGS(PGD_P(px), PGD_P(py), PGD_A(n), PGD_A(sdt), PGD_A(ddt)));
    }
    case PDDE_OP_GRAD_NORM_SQ: {
        float gs = pdde_op_f32(node, PDDE_P_UPDATE_GRAD_SCALE);
        return pgd_sum_all(g, pgd_ptr_of(x), pgd_numel(x), 1, pgd_opt_src(node, 1), gs * gs, pgd_ptr_of(node));
    }
    case PDDE_OP_SGD_UPDATE:
    case PDDE_OP_ADAMW_UPDATE: { /* src: param, grad, state(s) [, gnorm_sq]; param and state updated in place */
        int64_t np = pgd_numel(x);
        if (!np) return PDDE_OK;
        int32_t sdt;
        pgd_ptr pp = pgd_ptr_of(x), pg = pgd_ptr_of(node->src[1]), pm = pgd_opt_src(node, 2), sh = pgd_update_shadow(node, &sdt);
        float lr = pdde_op_f32(node, PDDE_P_UPDATE_LR), wd = pdde_op_f32(node, PDDE_P_UPDATE_WEIGHT_DECAY),
              clip = pdde_op_f32(node, PDDE_P_UPDATE_CLIP), gs = pdde_op_f32(node, PDDE_P_UPDATE_GRAD_SCALE);
        if (node->op == PDDE_OP_SGD_UPDATE) {
            pgd_ptr gn = pgd_update_norm(node, 3);
            float mom = pdde_op_f32(node, PDDE_P_SGD_MOMENTUM);
            return pgd_launch_1d(g, PGD_K_SGD, np,
                                 PGD_ARGS(PGD_P(pp), PGD_P(pg), PGD_P(pm), PGD_P(gn), PGD_A(np), PGD_A(lr), PGD_A(mom),
                                          PGD_A(wd), PGD_A(clip), PGD_A(gs), PGD_P(sh), PGD_A(sdt)));
        }
        if (g->mem_kernels & PGD_MEM_ADAMW_CHUNKS) { /* (as a group of one; declined where its buffers differ) */
            int e = pgd_compute_group(g, &node, 1);
            if (e != PDDE_ERR_UNSUPPORTED) return e;
        }
        pgd_ptr pv = pgd_ptr_of(node->src[3]), gn = pgd_update_norm(node, 4);
        float b1 = pdde_op_f32(node, PDDE_P_UPDATE_BETA1), b2 = pdde_op_f32(node, PDDE_P_UPDATE_BETA2), eps = pdde_op_f32(node, PDDE_P_UPDATE_EPS);
        float bc1, bc2;
        pgd_adamw_bias_corrections(node, &bc1, &bc2);
        return pgd_launch_1d(g, PGD_K_ADAMW, np,
                             PGD_ARGS(PGD_P(pp), PGD_P(pg), PGD_P(pm), PGD_P(pv), PGD_P(gn), PGD_A(np), PGD_A(lr),
                                      PGD_A(b1), PGD_A(b2), PGD_A(eps), PGD_A(wd), PGD_A(clip), PGD_A(gs), PGD_A(bc1),
                                      PGD_A(bc2), PGD_P(sh), PGD_A(sdt)));
    }
    default:
        return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: op %s is not supported", g->name, pdde_op_name(node->op));
    }
}

/* n AdamW update nodes (pdde_backend_iface.compute_group: parameters equal but for weight decay, one
 * gnorm_sq) as k_adamw_multi launches of up to PGD_MULTI_MAX tensors each. PDDE_ERR_UNSUPPORTED, with
 * nothing enqueued, for another op, or parameters and moments outside one buffer (gradients another). */
static inline int pgd_compute_group(const pgd_ctx *g, pdde_tensor *const *nodes, int n) {
    if (n < 1 || nodes[0]->op != PDDE_OP_ADAMW_UPDATE) return PDDE_ERR_UNSUPPORTED;
    const pdde_tensor *u = nodes[0];
    pgd_ptr base = {(uintptr_t)u->src[0]->data, 0}, gbase = {(uintptr_t)u->src[1]->data, 0}, gn = pgd_update_norm(u, 4);
    int32_t sdt = 0; /* the copies' dtype (one for all; tensors without one: s = -1) */
    int64_t widest = 0;
    for (int k = 0; k < n; k++) {
        int32_t sdt_k;
        pgd_update_shadow(nodes[k], &sdt_k);
        if (nodes[k]->op != PDDE_OP_ADAMW_UPDATE || (sdt_k && sdt && sdt_k != sdt)) return PDDE_ERR_UNSUPPORTED;
        if (sdt_k) sdt = sdt_k;
        for (int s = 0; s < 4; s++)
            if ((uintptr_t)nodes[k]->src[s]->data != (s == 1 ? gbase : base).base || nodes[k]->src[s]->offset % sizeof(float))
                return PDDE_ERR_UNSUPPORTED;
        const pdde_tensor *c = sdt_k ? nodes[k]->src[nodes[k]->nsrc - 1] : NULL; /* (the copies in the parameters' buffer too) */
        if (c && ((uintptr_t)c->data != base.base || c->offset % 2)) return PDDE_ERR_UNSUPPORTED;
        widest = pgd_numel(nodes[k]) > widest ? pgd_numel(nodes[k]) : widest;
    }
    if (pgd_too_many(g, PGD_K_ADAMW_MULTI, widest)) return PDDE_ERR_UNSUPPORTED;
    float lr = pdde_op_f32(u, PDDE_P_UPDATE_LR), b1 = pdde_op_f32(u, PDDE_P_UPDATE_BETA1), b2 = pdde_op_f32(u, PDDE_P_UPDATE_BETA2),
          eps = pdde_op_f32(u, PDDE_P_UPDATE_EPS), clip = pdde_op_f32(u, PDDE_P_UPDATE_CLIP), gs = pdde_op_f32(u, PDDE_P_UPDATE_GRAD_SCALE), bc1, bc2;
    pgd_adamw_bias_corrections(u, &bc1, &bc2);
    pgd_multi t;
    memset(&t, 0, sizeof t);
    int count = 0, e = PDDE_OK;
    int64_t chunks = 0;
    widest = 0;
    for (int k = 0; k < n && !e; k++) {
        const pdde_tensor *x = nodes[k];
        int64_t np = pgd_numel(x->src[0]);
        if (np) {
            t.n[count] = np, t.wd[count] = pdde_op_f32(x, PDDE_P_UPDATE_WEIGHT_DECAY);
            t.p[count] = (int64_t)(x->src[0]->offset / sizeof(float)), t.g[count] = (int64_t)(x->src[1]->offset / sizeof(float));
            t.m[count] = (int64_t)(x->src[2]->offset / sizeof(float)), t.v[count] = (int64_t)(x->src[3]->offset / sizeof(float));
            t.s[count] = pdde_op_i32(x, PDDE_P_UPDATE_SHADOW) ? (int64_t)(x->src[x->nsrc - 1]->offset / 2) : -1;
            widest = np > widest ? np : widest;
            chunks += (np + PGD_ADAMW_CHUNK - 1) / PGD_ADAMW_CHUNK;
            count++;
        }
        if (count && (count == PGD_MULTI_MAX || k == n - 1)) {
            int32_t cnt = count;
            if (g->mem_kernels & PGD_MEM_ADAMW_VEC) /* (3 groups a compute unit, as many as fit: or one a chunk where fewer) */
                e = pgd_launch(g, PGD_K_ADAMW_VEC, (unsigned)(chunks < (int64_t)g->units * 3 ? chunks : (int64_t)g->units * 3), 1, 1, 256, 1,
                               PGD_ARGS(PGD_P(base), PGD_P(gbase), PGD_P(gn), PGD_A(t), PGD_A(cnt), PGD_A(lr), PGD_A(b1), PGD_A(b2),
                                        PGD_A(eps), PGD_A(clip), PGD_A(gs), PGD_A(bc1), PGD_A(bc2), PGD_A(sdt)));
            else if (g->mem_kernels & PGD_MEM_ADAMW_CHUNKS) /* (a group per chunk of PGD_ADAMW_CHUNK elements of a tensor) */
                e = pgd_launch(g, PGD_K_ADAMW_CHUNKS, (unsigned)chunks, 1, 1, 256, 1,
                               PGD_ARGS(PGD_P(base), PGD_P(gbase), PGD_P(gn), PGD_A(t), PGD_A(cnt), PGD_A(lr), PGD_A(b1), PGD_A(b2),
                                        PGD_A(eps), PGD_A(clip), PGD_A(gs), PGD_A(bc1), PGD_A(bc2), PGD_A(sdt)));
            else
                e = pgd_launch(g, PGD_K_ADAMW_MULTI, pgd_grid(g, widest, 256), (unsigned)count, 1, 256, 1,
                               PGD_ARGS(PGD_P(base), PGD_P(gbase), PGD_P(gn), PGD_A(t), PGD_A(lr), PGD_A(b1), PGD_A(b2),
                                        PGD_A(eps), PGD_A(clip), PGD_A(gs), PGD_A(bc1), PGD_A(bc2), PGD_A(sdt)));
            count = 0, widest = 0, chunks = 0;
        }
    }
    return e;
}

#endif /* PDDE_GPU_DISPATCH_H */
