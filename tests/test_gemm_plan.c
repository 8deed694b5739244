/* test_gemm_plan — the cache of vendor GEMM plans (cublasLt's descriptors and chosen algorithm,
 * backends/gemm_plan.h), without a GPU: a plan is found again for the same problem at other addresses of the
 * same alignment, never for a problem that differs in anything the plan fixes (dtypes, transposes, shape,
 * strides, batch, epilogue, bias, beta, entry point, any operand's alignment); a full cache replaces its least
 * recently used plan, not the plans in use; every kept plan is found in its own slot after replacements (the
 * hash index). */
#include "pdde.h"
#include "backends/gemm_plan.h"
#include "tests/test_util.h"

static int same(const pgd_gemm_problem *a, const pgd_gemm_problem *b) {
    pgd_gemm_key ka = pgd_gemm_key_of(a), kb = pgd_gemm_key_of(b);
    return !memcmp(&ka, &kb, sizeof ka);
}

int main(void) {
    const uint64_t base = 0x7f0000000000ull;
    pgd_gemm_problem p = {PDDE_BF16, PDDE_BF16, 0, 1, 8192, 2304, 768, 0, 0, 0, 1, 0, 1, 0, 1,
                          base, base + 0x100000, base + 0x200000, 0, base + 0x300000};
    pgd_gemm_problem q = p;
    q.a += 0x4000, q.b += 0x100, q.d += 0x10000, q.bias += 0x200;
    CHECK(same(&p, &q), "the same problem at other 256-byte aligned addresses: another key");
    q = p, q.a += 512;
    CHECK(same(&p, &q), "512-byte aligned is 256-byte aligned: another key");
    /* every field a plan fixes */
    struct { const char *what; pgd_gemm_problem q; } v[24];
    int n = 0;
#define VARY(name, stmt) (v[n].what = name, v[n].q = p, (void)(stmt), n++)
    VARY("dtype", v[n].q.dtype = PDDE_F16);
    VARY("output dtype", v[n].q.out_dtype = PDDE_F32);
    VARY("ta", v[n].q.ta = 1);
    VARY("tb", v[n].q.tb = 0);
    VARY("M", v[n].q.M = 8191);
    VARY("N", v[n].q.N = 2305);
    VARY("K", v[n].q.K = 769);
    VARY("sA", v[n].q.sA = 7);
    VARY("sB", v[n].q.sB = 7);
    VARY("sD", v[n].q.sD = 7);
    VARY("batch", v[n].q.batch = 2);
    VARY("epilogue", v[n].q.epilogue = 4);
    VARY("bias", v[n].q.has_bias = 0);
    VARY("beta", v[n].q.beta = 1);
    VARY("entry point", v[n].q.family = 2);
    VARY("A aligned to 64", v[n].q.a += 64);
    VARY("B aligned to 16", v[n].q.b += 16);
    VARY("D aligned to 128", v[n].q.d += 128);
    VARY("C aligned to 32", v[n].q.c = base + 32);
    VARY("bias aligned to 64", v[n].q.bias += 64);
    for (int i = 0; i < n; i++) {
        CHECK(!same(&p, &v[i].q), "%s changed: the same key", v[i].what);
        for (int j = 0; j < i; j++) CHECK(!same(&v[j].q, &v[i].q), "%s and %s: one key", v[j].what, v[i].what);
    }
    /* the cache */
    pgd_gemm_cache *c = calloc(1, sizeof *c);
    int fresh, replace, bad = 0;
    pgd_gemm_key k0 = pgd_gemm_key_of(&p);
    int s0 = pgd_gemm_cache_slot(c, &k0, &fresh, &replace);
    CHECK(fresh && !replace, "a first problem: fresh %d, replace %d", fresh, replace);
    int again = pgd_gemm_cache_slot(c, &k0, &fresh, &replace);
    CHECK(again == s0 && !fresh && !replace, "found again: slot %d (%d), fresh %d", again, s0, fresh);
    for (int i = 1; i < PGD_GEMM_PLANS; i++) {
        pgd_gemm_problem r = p;
        r.M = 1000 + i;
        pgd_gemm_key k = pgd_gemm_key_of(&r);
        pgd_gemm_cache_slot(c, &k, &fresh, &replace);
        bad += !fresh || replace;
    }
    CHECK(bad == 0 && c->n == PGD_GEMM_PLANS, "%d of %d new problems not fresh or replacing while there was room", bad, PGD_GEMM_PLANS - 1);
    pgd_gemm_cache_slot(c, &k0, &fresh, &replace); /* (the first is in use: M 1001's is now the least recently used) */
    CHECK(!fresh, "the first problem kept");
    pgd_gemm_problem r = p;
    r.M = 5;
    pgd_gemm_key k5 = pgd_gemm_key_of(&r);
    pgd_gemm_cache_slot(c, &k5, &fresh, &replace);
    CHECK(fresh && replace && c->made == PGD_GEMM_PLANS + 1 && c->replaced == 1, "a problem past the cache: fresh %d, replace %d, made %lld, replaced %lld",
          fresh, replace, c->made, c->replaced);
    again = pgd_gemm_cache_slot(c, &k0, &fresh, &replace);
    CHECK(again == s0 && !fresh, "the plan in use survived a full cache: fresh %d", fresh);
    r.M = 1002;
    pgd_gemm_key k2 = pgd_gemm_key_of(&r);
    pgd_gemm_cache_slot(c, &k2, &fresh, &replace);
    CHECK(!fresh, "another recently used plan survived: fresh %d", fresh);
    r.M = 1001;
    pgd_gemm_key k1 = pgd_gemm_key_of(&r);
    pgd_gemm_cache_slot(c, &k1, &fresh, &replace);
    CHECK(fresh, "the least recently used plan was the one replaced: fresh %d", fresh);
    /* (through the hash index, after replacements too): every kept plan is found in its own slot */
    bad = 0;
    for (int i = 0; i < c->n; i++) {
        pgd_gemm_key k = c->key[i];
        bad += pgd_gemm_cache_slot(c, &k, &fresh, &replace) != i || fresh;
    }
    int s5 = pgd_gemm_cache_slot(c, &k5, &fresh, &replace);
    CHECK(bad == 0 && !fresh && !memcmp(&c->key[s5], &k5, sizeof k5) && c->made == PGD_GEMM_PLANS + 2,
          "%d kept plans not found in their slots; the replacing problem: fresh %d; made %lld", bad, fresh, c->made);
    free(c);
    return test_finish();
}
