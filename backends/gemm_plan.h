/* backends/gemm_plan.h — the key a vendor GEMM plan (its descriptors and chosen algorithm: cublasLt's) is kept
 * under, and which slot of a device's plan cache a key takes, without a device.
 *
 * A plan is valid for every call of the same problem: operand and output dtypes, transposes, M, N, K, batch and
 * strides, which epilogue (none, bias, beta 1, GELU_AUX_BIAS, DGELU, BGRADA; with or without a bias), and the
 * alignment of each operand (the library picks kernels by it: an algorithm chosen for 256-byte aligned operands
 * may not run on 64-byte aligned ones). The addresses themselves are not in the key: they are arguments of each
 * call. The cache keeps PGD_GEMM_PLANS plans and replaces the least recently used one when full (a model with
 * more problems than that re-plans only those it uses least). A key is found through a hash index, so a call
 * costs the same whatever the count of plans (a GEMM of every step looks its plan up). */
#ifndef PDDE_GEMM_PLAN_H
#define PDDE_GEMM_PLAN_H

#include <stdint.h>
#include <string.h>

#include "../pdde_extension.h"

#define PGD_GEMM_PLANS 256
#define PGD_GEMM_INDEX 512 /* hash index slots: a power of 2, twice the plans (short probes) */

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
    int16_t index[PGD_GEMM_INDEX]; /* 1 + the slot of a key at its hash's probe sequence (0: empty); zeroed = empty cache */
} pgd_gemm_cache;

static inline uint32_t pgd_gemm_key_hash(const pgd_gemm_key *k) {
    uint64_t h = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < 16; i++) h = (h ^ (uint64_t)k->v[i]) * 0xff51afd7ed558ccdu, h ^= h >> 32;
    return (uint32_t)h & (PGD_GEMM_INDEX - 1);
}

/* The index position of key k: where it is, or the empty one where it would go (linear probing). */
static inline int pgd_gemm_index_find(const pgd_gemm_cache *c, const pgd_gemm_key *k) {
    uint32_t h = pgd_gemm_key_hash(k);
    while (c->index[h] && memcmp(&c->key[c->index[h] - 1], k, sizeof *k)) h = (h + 1) & (PGD_GEMM_INDEX - 1);
    return (int)h;
}

/* The slot of key k: an existing plan (*fresh 0), or a slot for a new one (*fresh 1; *replace 1: it holds
 * another plan, which the caller frees first). */
static inline int pgd_gemm_cache_slot(pgd_gemm_cache *c, const pgd_gemm_key *k, int *fresh, int *replace) {
    int lru = 0;
    c->clock++;
    *fresh = 0, *replace = 0;
    int at = pgd_gemm_index_find(c, k);
    if (c->index[at]) {
        int i = c->index[at] - 1;
        c->used[i] = c->clock;
        return i;
    }
    for (int i = 0; i < c->n; i++)
        if (c->used[i] < c->used[lru]) lru = i;
    int full = c->n == PGD_GEMM_PLANS, i = full ? lru : c->n++;
    *fresh = 1, *replace = full;
    c->key[i] = *k, c->used[i] = c->clock;
    c->made++, c->replaced += *replace;
    if (*replace) { /* (the replaced key leaves the index: built anew, rarely) */
        memset(c->index, 0, sizeof c->index);
        for (int j = 0; j < c->n; j++) c->index[pgd_gemm_index_find(c, &c->key[j])] = (int16_t)(j + 1);
    } else {
        c->index[at] = (int16_t)(i + 1);
    }
    return i;
}

#endif /* PDDE_GEMM_PLAN_H */
