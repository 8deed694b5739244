/* backends/gemm_plan.h — the key a vendor GEMM plan (its descriptors and chosen algorithm: cublasLt's) is kept
 * under, and which slot of a device's plan cache a key takes, without a device.
 *
 * A plan is valid for every call of the same problem: operand and output dtypes, transposes, M, N, K, batch and
 * strides, which epilogue (none, bias, beta 1, GELU_AUX_BIAS, DGELU, BGRADA; with or without a bias), and the
 * alignment of each operand (the library picks kernels by it: an algorithm chosen for 256-byte aligned operands
 * may not run on 64-byte aligned ones). The addresses themselves are not in the key: they are arguments of each
 * call. The cache keeps PGD_GEMM_PLANS plans and replaces the least recently used one when full (a model with
 * more problems than that re-plans only those it uses least). */
#ifndef PDDE_GEMM_PLAN_H
#define PDDE_GEMM_PLAN_H

#include <stdint.h>
#include <string.h>

#include "../pdde_extension.h"

#define PGD_GEMM_PLANS 256

/* One GEMM problem as the backend sees it (row-major: D [M, N] = op(A) op(B), batch of them at the strides) */
typedef struct {
    pdde_dtype dtype, out_dtype;
    int ta, tb;
    int64_t M, N, K, sA, sB, sD, batch;
    int epilogue;   /* the backend's epilogue code (0: none) */
    int has_bias;   /* a bias (or bias-gradient) vector */
    int beta;       /* D += (beta 1) */
    int family;     /* which entry point makes the plan (its plans differ in what they set) */
    uint64_t a, b, d, c, bias; /* the call's addresses: only their alignment enters the key (0: none) */
} pgd_gemm_problem;

typedef struct { int64_t v[16]; } pgd_gemm_key;

/* the largest power of 2 up to 256 that divides addr (256 for none) */
static inline uint32_t pgd_gemm_align(uint64_t addr) {
    uint32_t a = 256;
    while (addr && a > 1 && addr % a) a >>= 1;
    return a;
}

static inline pgd_gemm_key pgd_gemm_key_of(const pgd_gemm_problem *p) {
    pgd_gemm_key k;
    uint32_t ad = pgd_gemm_align(p->d), ac = p->c ? pgd_gemm_align(p->c) : ad;
    int64_t v[16] = {p->dtype,
                     p->out_dtype,
                     p->ta,
                     p->tb,
                     p->M,
                     p->N,
                     p->K,
                     p->sA,
                     p->sB,
                     p->sD,
                     p->batch,
                     p->has_bias | (int64_t)p->beta << 1 | (int64_t)p->family << 2,
                     p->epilogue,
                     pgd_gemm_align(p->a) | (int64_t)pgd_gemm_align(p->b) << 16,
                     (ad < ac ? ad : ac) | (int64_t)(p->bias ? pgd_gemm_align(p->bias) : 256) << 16,
                     0};
    memcpy(k.v, v, sizeof v);
    return k;
}

typedef struct {
    pgd_gemm_key key[PGD_GEMM_PLANS];
    uint64_t used[PGD_GEMM_PLANS];
    int n;
    uint64_t clock;
    long long made, replaced; /* plans made; of them, made in place of another (the cache was full) */
} pgd_gemm_cache;

/* The slot of key k: an existing plan (*fresh 0), or a slot for a new one (*fresh 1; *replace 1: it holds
 * another plan, which the caller frees first). */
static inline int pgd_gemm_cache_slot(pgd_gemm_cache *c, const pgd_gemm_key *k, int *fresh, int *replace) {
    int lru = 0;
    c->clock++;
    *fresh = 0, *replace = 0;
    for (int i = 0; i < c->n; i++) {
        if (!memcmp(&c->key[i], k, sizeof *k)) {
            c->used[i] = c->clock;
            return i;
        }
        if (c->used[i] < c->used[lru]) lru = i;
    }
    int full = c->n == PGD_GEMM_PLANS, i = full ? lru : c->n++;
    *fresh = 1, *replace = full;
    c->key[i] = *k, c->used[i] = c->clock;
    c->made++, c->replaced += *replace;
    return i;
}

#endif /* PDDE_GEMM_PLAN_H */
