/* embedding_emu.cpp — the CUDA backend's reproducible embedding backward (backends/cuda_embedding.cuh:
 * k_embedding_sort, k_embedding_back_rows) run on the CPU, launched as backends/gpu_dispatch.h launches them
 * (one block sorts; blocks stride over the sorted positions), against the CPU backend's loop
 * (backends/cpu.c: out[id] += dy[r] for r in order), bit for bit, and k_embedding_count_sort's keys equal to the
 * network's and to the radix sort's over many blocks (k_embedding_keys, k_embedding_radix_*: 40k to 300k ids
 * among the cases): repeated ids out of order, one id many
 * times, ids outside the table (skipped), a table few ids touch, a single id, a base gradient, block
 * sizes that do not divide the ids or the columns. The device code is compiled for the host: a block's
 * threads are cooperative fibers (tests/cuda_emu.h) that yield at each __syncthreads, each round in the
 * other order of threads, so a read missing its barrier sees the write late. It cannot see what only a
 * GPU shows (timing, races between real warps).
 *
 * Built and run by tests/test_embedding_emu.sh; prints "N passed, N failed" last. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define EMU_MAX_THREADS 256
#define EMU_STACK (1 << 15)
#include "cuda_emu.h"

#include "../backends/cuda_embedding.cuh"

static int n_pass, n_fail;
static void check(bool ok, const char *what) {
    ok ? n_pass++ : n_fail++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static uint64_t rng = 88172645463325252ull;
static double uniform() { /* [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

/* the kernels' arguments (the launches read these) */
static struct {
    const int *ids; const float *dy; float *out; unsigned long long *keys; long long n, n_pow2, C, V; int *cnt;
} A;
static void run_sort() { k_embedding_sort(A.ids, A.keys, A.n, A.n_pow2, A.V); }
static void run_count_sort() { k_embedding_count_sort(A.ids, A.keys, A.cnt, A.n, A.V); }
static void run_rows() { k_embedding_back_rows(A.dy, A.keys, A.out, A.n, A.C, A.V); }
static struct { const unsigned long long *src; unsigned long long *dst; int *cnt; long long m, chunk; int shift; } R;
static void run_keys() { k_embedding_keys(A.ids, A.keys, A.n, A.V); }
static void run_radix_count() { k_embedding_radix_count(R.src, R.cnt, A.n, R.chunk, A.V, R.shift); }
static void run_radix_scan() { k_embedding_radix_scan(R.cnt, R.m); }
static void run_radix_scatter() { k_embedding_radix_scatter(R.src, R.dst, R.cnt, A.n, R.chunk, A.V, R.shift); }

/* the radix sort as backends/gpu_dispatch.h launches it (pgd_embedding_radix_sort: 32 keys a thread, blocks
 * of `block`, one block of `block` scans), into keys [n] through a second buffer */
static void radix_sort(unsigned long long *keys, unsigned block) {
    const long long chunk = 32;
    long long items = (A.n + chunk - 1) / chunk;
    unsigned groups = (unsigned)((items + block - 1) / block);
    int bits = 0;
    while (bits < 63 && (A.V >> bits) > 0) bits++;
    int passes = (bits + RADIX_BITS - 1) / RADIX_BITS;
    unsigned long long *tmp = (unsigned long long *)malloc((size_t)A.n * sizeof *tmp);
    int *cnt = (int *)malloc((size_t)groups * block * RADIX_DIGITS * sizeof *cnt);
    unsigned long long *src = passes % 2 ? tmp : keys, *dst = passes % 2 ? keys : tmp;
    A.keys = src;
    emu_launch(emu_dim{(unsigned)((A.n + 255) / 256), 1, 1}, 256, run_keys);
    for (int shift = 0; shift < bits; shift += RADIX_BITS) {
        R = {src, dst, cnt, (long long)groups * block * RADIX_DIGITS, chunk, shift};
        emu_launch(emu_dim{groups, 1, 1}, block, run_radix_count);
        emu_launch(emu_dim{1, 1, 1}, block, run_radix_scan);
        emu_launch(emu_dim{groups, 1, 1}, block, run_radix_scatter);
        unsigned long long *t = src;
        src = dst, dst = t;
    }
    free(tmp), free(cnt);
}

struct emb_case { const char *name; long long V, C, n; int skew, one, bad; unsigned sort_block, row_block, groups; };

/* one case: ids (skewed draws, or all `one`; `bad` of them outside [0, V)), dy random, a random base */
static void run_case(const emb_case &c) {
    int *ids = (int *)malloc((size_t)c.n * sizeof *ids);
    float *dy = (float *)malloc((size_t)(c.n * c.C) * sizeof *dy);
    float *want = (float *)malloc((size_t)(c.V * c.C) * sizeof *want), *got = (float *)malloc((size_t)(c.V * c.C) * sizeof *got);
    long long n_pow2 = 1;
    while (n_pow2 < c.n) n_pow2 *= 2;
    unsigned long long *keys = (unsigned long long *)malloc((size_t)n_pow2 * sizeof *keys);
    for (long long i = 0; i < c.n; i++) {
        double u = uniform(), p = u;
        for (int k = 1; k < c.skew; k++) p *= u;
        ids[i] = c.one >= 0 ? c.one : (int)(p * (double)c.V);
    }
    for (int k = 0; k < c.bad && k < c.n; k++) ids[(k * 7919) % c.n] = k % 2 ? (int)c.V + k : -1 - k;
    for (long long i = 0; i < c.n * c.C; i++) dy[i] = (float)(uniform() * 2.0 - 1.0);
    for (long long i = 0; i < c.V * c.C; i++) want[i] = got[i] = (float)(uniform() - 0.5);
    for (long long r = 0; r < c.n; r++) /* backends/cpu.c's order */
        if (ids[r] >= 0 && ids[r] < c.V)
            for (long long j = 0; j < c.C; j++) want[ids[r] * c.C + j] += dy[r * c.C + j];
    /* the counting sort (a CPU device's) first: the network's keys must equal its */
    unsigned long long *counted = (unsigned long long *)malloc((size_t)c.n * sizeof *counted);
    int *cnt = (int *)malloc((size_t)(c.V + 1) * sizeof *cnt);
    A = {ids, dy, got, counted, c.n, n_pow2, c.C, c.V, cnt};
    emu_launch(emu_dim{1, 1, 1}, 1, run_count_sort);
    A.keys = keys;
    emu_launch(emu_dim{1, 1, 1}, c.sort_block, run_sort);
    int sorted = 1;
    for (long long i = 1; i < n_pow2; i++) sorted &= keys[i - 1] < keys[i] || (keys[i] == ~0ULL && i >= c.n);
    char what[160];
    snprintf(what, sizeof what, "%s: the keys sorted by id, then position (%u threads)", c.name, c.sort_block);
    check(sorted, what);
    snprintf(what, sizeof what, "%s: the counting sort's keys are the network's", c.name);
    check(!memcmp(counted, keys, (size_t)c.n * sizeof *keys), what);
    /* the radix sort over many blocks (large n on a GPU): the same keys */
    unsigned long long *radixed = (unsigned long long *)malloc((size_t)c.n * sizeof *radixed);
    radix_sort(radixed, c.sort_block);
    snprintf(what, sizeof what, "%s: the radix sort's keys are the counting sort's (blocks of %u)", c.name, c.sort_block);
    check(!memcmp(counted, radixed, (size_t)c.n * sizeof *radixed), what);
    free(radixed);
    A.keys = keys;
    free(counted), free(cnt);
    emu_launch(emu_dim{c.groups, 1, 1}, c.row_block, run_rows);
    long long at = -1;
    for (long long i = 0; i < c.V * c.C && at < 0; i++)
        if (memcmp(&got[i], &want[i], sizeof *got)) at = i;
    snprintf(what, sizeof what, "%s: the gradient equals the CPU's bit for bit (%u blocks of %u; element %lld)", c.name, c.groups,
             c.row_block, at);
    check(at < 0, what);
    free(ids), free(dy), free(want), free(got), free(keys);
}

int main() {
    /* a check of the check: one id's dy summed in another order gives other bits */
    float fwd = 0.0f, back = 0.0f, v[3000];
    for (int i = 0; i < 3000; i++) v[i] = (float)(uniform() * 2.0 - 1.0);
    for (int i = 0; i < 3000; i++) fwd += v[i], back += v[2999 - i];
    check(memcmp(&fwd, &back, sizeof fwd) != 0, "a sum's order shows in its bits");
    static const emb_case cases[] = {
        {"gpt vocabulary", 50304, 8, 2048, 3, -1, 0, 256, 32, 64},
        {"one id many times", 10, 33, 3000, 1, 7, 0, 128, 32, 5},
        {"ids outside the table", 40, 6, 500, 2, -1, 9, 64, 32, 7},
        {"few rows touched", 1000, 5, 37, 1, -1, 0, 32, 32, 3},
        {"a single id", 3, 1, 1, 1, -1, 0, 32, 32, 1},
        {"columns past the block", 17, 70, 129, 1, -1, 0, 256, 32, 16},
        {"40k ids, a large table", 1000003, 2, 40000, 3, -1, 5, 256, 32, 64},
        {"100k ids uniform", 50304, 1, 100000, 1, -1, 0, 128, 32, 64},
        {"300k ids skewed, blocks of 64", 100000, 1, 300001, 4, -1, 3, 64, 32, 64},
    };
    for (const emb_case &c : cases) run_case(c);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
