/* backends/gpu_moe.h — the Mixture-of-Experts ops on the device backends, above gpu_dispatch.h:
 * which nodes the device kernels take and their launches. The kernels (k_moe_*, a "Mixture-of-Experts"
 * section of gpu_kernels.cl and cuda_kernels.cu) mirror backends/cpu_moe.c, the reference.
 *
 * Every op that needs the expert-ordered layout computes it on the device from the expert ids
 * (k_moe_layout, one group), as the CPU does per op, so no host round trip is needed; the layout lives
 * in the stream's scratch for the node. Ids are f32/i32 as the graph builds them; an expert id out of
 * range, which the CPU reports as an error, routes its choice nowhere on the device. Under a bf16
 * compute dtype the permutation's rows are bf16 (moved as they are, or computed in f32 and rounded as
 * k_cast rounds) and the grouped GEMM's bf16 operands are widened to f32 in scratch (exact) for the f32
 * kernel; a bf16 GEMM result (a cast lowering folded in) is its f32 result cast. */
#ifndef PDDE_GPU_MOE_H
#define PDDE_GPU_MOE_H
#include "gpu_dispatch.h"

static int pgd_is_moe(pdde_op op) { return op >= PDDE_OP_MOE_TOPK && op <= PDDE_OP_MOE_AUX_LOSS_BACK; }

/* Whether src i of a MoE op may be bf16: the rows the permutation moves and the grouped GEMM's operands */
static inline int pgd_moe_bf16_src(pdde_op op, int i) {
    switch (op) {
    case PDDE_OP_MOE_DISPATCH: case PDDE_OP_MOE_COMBINE: return i == 0;
    case PDDE_OP_MOE_COMBINE_BACK_W: return i == 0 || i == 2;
    case PDDE_OP_MOE_GROUPED_MATMUL: case PDDE_OP_MOE_GROUPED_MATMUL_BACK_W: return i < 2;
    default: return 0;
    }
}

/* 1 if the device kernels take this MoE node: f32 data (or bf16 where pgd_moe_bf16_src says, and a bf16
 * dispatch or grouped GEMM result), i32 ids and counts, sizes a 32-bit index holds and a grouped GEMM's
 * grid within 65535 row tiles. */
static inline int pgd_supports_moe(const pdde_tensor *node) { /* (inline: a backend may not offer them) */
    if (!node || !pgd_is_moe(node->op) || node->ndim > 3 || node->nsrc < 1) return 0;
    for (int i = 0; i < node->nsrc; i++) {
        const pdde_tensor *s = node->src[i];
        if (!s || s->ndim > 3 || pgd_numel(s) > INT32_MAX) return 0;
        if (s->dtype != PDDE_F32 && s->dtype != PDDE_I32 && !(s->dtype == PDDE_BF16 && pgd_moe_bf16_src(node->op, i))) return 0;
    }
    if (pgd_numel(node) > INT32_MAX) return 0;
    int want_i32 = node->op == PDDE_OP_MOE_TOPK || node->op == PDDE_OP_MOE_COUNTS;
    int bf16_out = node->dtype == PDDE_BF16 && (node->op == PDDE_OP_MOE_DISPATCH || node->op == PDDE_OP_MOE_GROUPED_MATMUL);
    if (node->dtype != (want_i32 ? PDDE_I32 : PDDE_F32) && !bf16_out) return 0;
    if (node->op == PDDE_OP_MOE_GROUPED_MATMUL || node->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W) {
        const pdde_tensor *x = node->src[0];
        if (x->dtype != node->src[1]->dtype) return 0;
        int64_t E = node->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W ? node->shape[0] : node->src[1]->shape[0];
        int64_t R = x->ndim == 3 ? x->shape[0] * x->shape[1] : x->shape[0];
        if (E > 65535 || (R + 63) / 64 + E > 65535) return 0;
    }
    return 1;
}

/* The layout of ids idx (nk choices) in a buffer of R rows, into the stream's scratch: counts (when
 * counts is null, scratch), rows and offsets [E] and, with want_row, the row of each choice; with
 * extra > 0, *more gets that many bytes of the scratch after it (the scratch is one buffer a stream). */
static int pgd_moe_layout(const pgd_ctx *g, pgd_ptr idx, int64_t nk, int32_t E, int32_t cap, int64_t R, int want_row, pgd_ptr counts,
                          pgd_ptr *off, pgd_ptr *rows, pgd_ptr *row, int64_t extra, pgd_ptr *more) {
    int64_t eb = pgd_align256((int64_t)E * 4), rb = pgd_align256((nk ? nk : 1) * 4);
    pgd_ptr base;
    int e = g->scratch(g->impl, g->stream, (size_t)(3 * eb + (want_row ? rb : 0) + extra), &base);
    if (e) return e;
    *off = base, *rows = pgd_at(base, eb), *row = want_row ? pgd_at(base, 3 * eb) : pgd_null;
    if (more) *more = pgd_at(base, 3 * eb + (want_row ? rb : 0));
    pgd_ptr cnt = counts.base ? counts : pgd_at(base, 2 * eb);
    return pgd_launch(g, PGD_K_MOE_LAYOUT, 1, 1, 1, 256, 1,
                      PGD_ARGS(PGD_P(idx), PGD_P(cnt), PGD_P(*off), PGD_P(*rows), PGD_P(*row), PGD_A(nk), PGD_A(E), PGD_A(cap), PGD_A(R)));
}

/* (a bf16 tensor's odd last element: the word past it is in its 64-byte aligned slot) */
static int pgd_moe_zero(const pgd_ctx *g, const pdde_tensor *t) {
    int64_t n = (pgd_numel(t) * (int64_t)pdde_dtype_size(t->dtype) + 3) / 4;
    return n ? g->fill32(g->impl, g->stream, pgd_ptr_of(t), 0u, (size_t)n) : PDDE_OK;
}

static int pgd_moe(const pgd_ctx *g, pdde_tensor *node) {
    if (!(node->flags & PDDE_TENSOR_SUPPORTED) && !pgd_supports_moe(node))
        return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: MoE op %s on %s is not supported", g->name, pdde_op_name(node->op), node->name);
    int32_t E = pdde_op_i32(node, PDDE_P_MOE_EXPERTS), cap = pdde_op_i32(node, PDDE_P_MOE_CAPACITY);
    int32_t flags = pdde_op_i32(node, PDDE_P_MOE_FLAGS);
    pgd_ptr off, rows, row, y = pgd_ptr_of(node);
    int e;
    switch (node->op) {
    case PDDE_OP_MOE_TOPK: {
        const pdde_tensor *l = node->src[0];
        int64_t N = l->shape[0];
        int32_t Ex = (int32_t)l->shape[1], k = (int32_t)node->shape[1];
        pgd_ptr pl = pgd_ptr_of(l), pb = node->nsrc > 1 ? pgd_ptr_of(node->src[1]) : pgd_null;
        return N ? pgd_launch_1d(g, PGD_K_MOE_TOPK, N, PGD_ARGS(PGD_P(pl), PGD_P(pb), PGD_P(y), PGD_A(N), PGD_A(Ex), PGD_A(k), PGD_A(flags)))
                 : PDDE_OK;
    }
    case PDDE_OP_MOE_GATE: case PDDE_OP_MOE_GATE_BACK: {
        const pdde_tensor *l = node->src[0];
        int64_t N = l->shape[0];
        int32_t Ex = (int32_t)l->shape[1], k = (int32_t)node->src[1]->shape[1], back = node->op == PDDE_OP_MOE_GATE_BACK;
        pgd_ptr pl = pgd_ptr_of(l), pi = pgd_ptr_of(node->src[1]), pd = back ? pgd_ptr_of(node->src[2]) : pgd_null;
        return N ? pgd_launch_1d(g, PGD_K_MOE_GATE, N,
                                 PGD_ARGS(PGD_P(pl), PGD_P(pi), PGD_P(pd), PGD_P(y), PGD_A(N), PGD_A(Ex), PGD_A(k), PGD_A(flags), PGD_A(back)))
                 : PDDE_OK;
    }
    case PDDE_OP_MOE_COUNTS: {
        if (!E) return PDDE_OK;
        return pgd_moe_layout(g, pgd_ptr_of(node->src[0]), pgd_numel(node->src[0]), E, 0, INT64_MAX, 0, y, &off, &rows, &row, 0, NULL);
    }
    case PDDE_OP_MOE_DISPATCH: case PDDE_OP_MOE_COMBINE: case PDDE_OP_MOE_COMBINE_BACK_W: {
        /* the expert-ordered buffer as rows of C ([R, C], or [E, S, C]: R = E S) */
        const pdde_tensor *idx = node->src[1], *buf = node->op == PDDE_OP_MOE_DISPATCH ? node : node->src[0];
        int64_t C = buf->shape[buf->ndim - 1], R = C ? pgd_numel(buf) / C : 0, nk = pgd_numel(idx), N = idx->shape[0];
        int32_t k = (int32_t)idx->shape[1];
        if (buf->ndim == 3) R = buf->shape[0] * buf->shape[1];
        if (cap > 0 && E > 0) cap = (int32_t)(R / E); /* a rank's share of the capacity (its buffer: E x share) */
        if (node->op == PDDE_OP_MOE_DISPATCH && (cap > 0 || nk < R) && (e = pgd_moe_zero(g, node))) return e; /* the unused rows */
        if (!pgd_numel(node)) return PDDE_OK;
        if ((e = pgd_moe_layout(g, pgd_ptr_of(idx), nk, E, cap, R, 1, pgd_null, &off, &rows, &row, 0, NULL))) return e;
        pgd_ptr p0 = pgd_ptr_of(node->src[0]), p2 = node->nsrc > 2 ? pgd_ptr_of(node->src[2]) : pgd_null;
        int32_t dt0 = (int32_t)node->src[0]->dtype, dt2 = node->nsrc > 2 ? (int32_t)node->src[2]->dtype : 0, ydt = (int32_t)node->dtype;
        if (node->op == PDDE_OP_MOE_DISPATCH)
            return pgd_launch_1d(g, PGD_K_MOE_DISPATCH, nk * C,
                                 PGD_ARGS(PGD_P(p0), PGD_P(p2), PGD_P(row), PGD_P(y), PGD_A(nk), PGD_A(k), PGD_A(C), PGD_A(dt0), PGD_A(ydt)));
        if (node->op == PDDE_OP_MOE_COMBINE)
            return pgd_launch_1d(g, PGD_K_MOE_COMBINE, N * C,
                                 PGD_ARGS(PGD_P(p0), PGD_P(row), PGD_P(p2), PGD_P(y), PGD_A(N), PGD_A(k), PGD_A(C), PGD_A(dt0)));
        return pgd_launch_1d(g, PGD_K_MOE_COMBINE_BACK_W, nk,
                             PGD_ARGS(PGD_P(p0), PGD_P(row), PGD_P(p2), PGD_P(y), PGD_A(nk), PGD_A(k), PGD_A(C), PGD_A(dt0), PGD_A(dt2)));
    }
    case PDDE_OP_MOE_GROUPED_MATMUL: case PDDE_OP_MOE_GROUPED_MATMUL_BACK_W: {
        int back_w = node->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W;
        const pdde_tensor *x = node->src[0];
        int by_expert = x->ndim == 3;
        int64_t R = by_expert ? x->shape[0] * x->shape[1] : x->shape[0];
        int32_t Ex = back_w ? (int32_t)node->shape[0] : (int32_t)node->src[1]->shape[0];
        int32_t S = by_expert ? (int32_t)x->shape[1] : 0, K = (int32_t)(back_w ? node->shape[1] : x->shape[x->ndim - 1]);
        int32_t M = (int32_t)node->shape[node->ndim - 1], tb = back_w ? 0 : pdde_op_i32(node, PDDE_P_MOE_TRANS_B);
        off = rows = pgd_null;
        /* bf16 operands widened into scratch, a bf16 result summed there in f32 first */
        const pdde_tensor *b = node->src[1];
        int64_t na = x->dtype != PDDE_F32 ? pgd_numel(x) : 0, nb = x->dtype != PDDE_F32 ? pgd_numel(b) : 0;
        int64_t nc = node->dtype != PDDE_F32 ? pgd_numel(node) : 0, ab = pgd_align256(na * 4), bb = pgd_align256(nb * 4);
        int64_t extra = ab + bb + pgd_align256(nc * 4);
        pgd_ptr more = pgd_null;
        int zero = 0;
        if (!by_expert) {
            const pdde_tensor *idx = node->src[2];
            if (cap > 0 && Ex > 0) cap = (int32_t)(R / Ex);
            zero = !back_w && (cap > 0 || pgd_numel(idx) < R); /* rows no expert uses */
            if (!Ex || !pgd_numel(node)) return zero ? pgd_moe_zero(g, node) : PDDE_OK;
            if ((e = pgd_moe_layout(g, pgd_ptr_of(idx), pgd_numel(idx), Ex, cap, R, 0, pgd_null, &off, &rows, &row, extra, &more))) return e;
        } else if (Ex && pgd_numel(node) && extra && (e = g->scratch(g->impl, g->stream, (size_t)extra, &more))) {
            return e;
        }
        if (!Ex || !pgd_numel(node)) return PDDE_OK;
        pgd_ptr pa = pgd_ptr_of(x), pb = pgd_ptr_of(b), pc = nc ? pgd_at(more, ab + bb) : y;
        int32_t f32 = (int32_t)PDDE_F32, ydt = (int32_t)node->dtype;
        if (na) {
            pgd_ptr wa = more, wb = pgd_at(more, ab);
            int32_t xdt = (int32_t)x->dtype;
            if ((e = pgd_launch_1d(g, PGD_K_CAST, na, PGD_ARGS(PGD_P(pa), PGD_P(wa), PGD_A(na), PGD_A(xdt), PGD_A(f32))))) return e;
            if ((e = pgd_launch_1d(g, PGD_K_CAST, nb, PGD_ARGS(PGD_P(pb), PGD_P(wb), PGD_A(nb), PGD_A(xdt), PGD_A(f32))))) return e;
            pa = wa, pb = wb;
        }
        if (zero && (e = g->fill32(g->impl, g->stream, pc, 0u, (size_t)pgd_numel(node)))) return e;
        unsigned gx = (unsigned)((M + 63) / 64);
        if (back_w)
            e = pgd_launch(g, PGD_K_MOE_GEMM_BACK_W, gx, (unsigned)((K + 63) / 64), (unsigned)Ex, 256, 1,
                           PGD_ARGS(PGD_P(pa), PGD_P(pb), PGD_P(pc), PGD_P(off), PGD_P(rows), PGD_A(S), PGD_A(K), PGD_A(M)));
        else {
            unsigned gy = (unsigned)(by_expert ? (int64_t)Ex * ((S + 63) / 64) : (R + 63) / 64 + Ex);
            e = pgd_launch(g, PGD_K_MOE_GEMM, gx, gy ? gy : 1, 1, 256, 1,
                           PGD_ARGS(PGD_P(pa), PGD_P(pb), PGD_P(pc), PGD_P(off), PGD_P(rows), PGD_A(Ex), PGD_A(S), PGD_A(K), PGD_A(M), PGD_A(tb)));
        }
        if (!e && nc) e = pgd_launch_1d(g, PGD_K_CAST, nc, PGD_ARGS(PGD_P(pc), PGD_P(y), PGD_A(nc), PGD_A(f32), PGD_A(ydt)));
        return e;
    }
    case PDDE_OP_MOE_AUX_LOSS: case PDDE_OP_MOE_AUX_LOSS_BACK: {
        const pdde_tensor *l = node->src[0];
        int64_t N = l->shape[0];
        int32_t Ex = (int32_t)l->shape[1];
        pgd_ptr pl = pgd_ptr_of(l), pc = pgd_ptr_of(node->src[1]);
        if (node->op == PDDE_OP_MOE_AUX_LOSS)
            return pgd_launch(g, PGD_K_MOE_AUX_LOSS, 1, 1, 1, 256, 1, PGD_ARGS(PGD_P(pl), PGD_P(pc), PGD_P(y), PGD_A(N), PGD_A(Ex)));
        pgd_ptr pd = pgd_ptr_of(node->src[2]);
        return N ? pgd_launch_1d(g, PGD_K_MOE_AUX_LOSS_BACK, N, PGD_ARGS(PGD_P(pl), PGD_P(pc), PGD_P(pd), PGD_P(y), PGD_A(N), PGD_A(Ex)))
                 : PDDE_OK;
    }
    default: return pdde_error(g->ctx, PDDE_ERR_UNSUPPORTED, "%s: op %s (%s) is not a MoE op", g->name, pdde_op_name(node->op), node->name);
    }
}

/* A node on the device: the MoE ops here (where the backend offers them: its supports_op), the others
 * gpu_dispatch.h's */
static int pgd_compute_any(const pgd_ctx *g, pdde_tensor *node) {
    return pgd_is_moe(node->op) ? pgd_moe(g, node) : pgd_compute(g, node);
}

#endif /* PDDE_GPU_MOE_H */
