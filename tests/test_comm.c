/* test_comm.c — every collective x dtype x op x size on 2, 3 and 4 ranks (forked processes around a
 * store server on 127.0.0.1), against references computed locally; also on split sub-communicators
 * and non-blocking. Inputs are small integers, so every sum is exact in every dtype and results can
 * be compared bit for bit. */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    printf("SKIP ucx: pdde was built without comm (no UCX)\n0 passed, 0 failed, 1 skipped\n");
    return 0;
}
#else
#include "test_util.h"
#include "comm_test_util.h"
#include <stdint.h>

static const pdde_dtype DTYPES[] = {PDDE_F32, PDDE_F16, PDDE_BF16, PDDE_I32, PDDE_I64};
static const pdde_reduce_op OPS[] = {PDDE_REDUCE_SUM, PDDE_REDUCE_AVG, PDDE_REDUCE_MAX, PDDE_REDUCE_MIN};
static const char *OP_NAMES[] = {"sum", "avg", "max", "min"};
/* 0, 1, primes, unaligned, above the small-message threshold, and large (1-4 MiB by dtype) */
static const size_t SIZES[] = {0, 1, 2, 7, 13, 97, 1001, 4099, 65537, 1u << 19};
#define NSIZES (sizeof SIZES / sizeof *SIZES)

/* The input of element i on "rank" r: an integer in [-9, 9]. */
static int val(int r, size_t i) { return (int)((r * 31 + i * 7) % 19) - 9; }

static void put(void *buf, pdde_dtype t, size_t i, double v) {
    switch (t) {
    case PDDE_F32: ((float *)buf)[i] = (float)v; break;
    case PDDE_F16: ((uint16_t *)buf)[i] = pdde_f32_to_f16((float)v); break;
    case PDDE_BF16: ((uint16_t *)buf)[i] = pdde_f32_to_bf16((float)v); break;
    case PDDE_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case PDDE_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
    }
}

static double get(const void *buf, pdde_dtype t, size_t i) {
    switch (t) {
    case PDDE_F32: return ((const float *)buf)[i];
    case PDDE_F16: return pdde_f16_to_f32(((const uint16_t *)buf)[i]);
    case PDDE_BF16: return pdde_bf16_to_f32(((const uint16_t *)buf)[i]);
    case PDDE_I32: return ((const int32_t *)buf)[i];
    case PDDE_I64: return (double)((const int64_t *)buf)[i];
    default: return 0;
    }
}

/* The expected reduction of element i over ranks ids[0..n), computed the way pdde rounds: the sum is
 * exact, an average is the sum (stored in t) divided by n in t's arithmetic. */
static double expect(pdde_dtype t, pdde_reduce_op op, const int *ids, int n, size_t i) {
    long acc = val(ids[0], i);
    for (int k = 1; k < n; k++) {
        long v = val(ids[k], i);
        if (op == PDDE_REDUCE_MAX) acc = v > acc ? v : acc;
        else if (op == PDDE_REDUCE_MIN) acc = v < acc ? v : acc;
        else acc += v;
    }
    if (op != PDDE_REDUCE_AVG) return (double)acc;
    unsigned char tmp[8];
    switch (t) {
    case PDDE_I32: case PDDE_I64: return (double)(acc / n);
    case PDDE_F32: return (double)((float)acc / (float)n);
    default: put(tmp, t, 0, (double)((float)acc / (float)n)); return get(tmp, t, 0);
    }
}

/* Counts mismatches of buf[0..count) against f(i); reports the first. */
#define VERIFY(buf, t, count, expr, ...)                                                         \
    do {                                                                                         \
        size_t bad_ = 0, first_ = 0;                                                             \
        double got_ = 0, want_ = 0;                                                              \
        for (size_t i = 0; i < (count); i++) {                                                   \
            double w_ = (expr), g_ = get(buf, t, i);                                             \
            if (g_ != w_ && !bad_++) { first_ = i; got_ = g_; want_ = w_; }                      \
        }                                                                                        \
        CHECK(bad_ == 0, __VA_ARGS__);                                                           \
        if (bad_) fprintf(stderr, "  %zu bad, first at %zu: got %g want %g\n", bad_, first_, got_, want_); \
    } while (0)

typedef struct {
    int algo;
    int full;   /* every size and op; else a reduced set (sub-communicators) */
    int float_sums_only;
} coll_arg;

/* Non-integer values summed and averaged in f32, f16 and bf16 (allreduce and reduce-scatter), against
 * a reference in double from the same rounded inputs: each of the n - 1 additions, and the division
 * of an average, rounds once in the dtype, so |got - want| <= (n + 1) u sum|x| with u the dtype's
 * unit roundoff. Integers (run_collectives) are exact in every dtype and cannot show this. */
static void run_float_sums(pdde_comm *comm, const char *path) {
    int n = pdde_comm_size(comm), me = pdde_comm_rank(comm);
    static const pdde_dtype ft[] = {PDDE_F32, PDDE_F16, PDDE_BF16};
    static const double unit[] = {0x1p-24, 0x1p-11, 0x1p-8};
    static const size_t counts[] = {7, 1001, 65537}; /* the small blocking path, one chunk, several */
    size_t maxc = 65537 * 2;
    unsigned char *a = malloc(maxc * 4), *b = malloc(maxc * 4);
    for (int di = 0; di < 3; di++)
        for (int ci = 0; ci < 3; ci++)
            for (int avg = 0; avg < 2; avg++) {
                size_t count = counts[ci];
                pdde_reduce_op op = avg ? PDDE_REDUCE_AVG : PDDE_REDUCE_SUM;
                for (int rs = 0; rs < 2; rs++) { /* allreduce; reduce-scatter of count each */
                    size_t total = rs ? count * (size_t)n : count;
                    if (total > maxc) continue;
                    for (size_t i = 0; i < total; i++) put(a, ft[di], i, 3.7 * sin(1.3 * me + 0.71 * (double)i) + 0.01 * me);
                    pdde_status st = rs ? pdde_comm_reduce_scatter(comm, a, b, count, ft[di], op) : pdde_comm_allreduce(comm, a, b, count, ft[di], op);
                    double worst = 0;
                    size_t worst_i = 0;
                    unsigned char one[8];
                    for (size_t k = 0; k < count && !st; k++) {
                        size_t i = rs ? (size_t)me * count + k : k;
                        double want = 0, mag = 0;
                        for (int r = 0; r < n; r++) {
                            put(one, ft[di], 0, 3.7 * sin(1.3 * r + 0.71 * (double)i) + 0.01 * r);
                            double x = get(one, ft[di], 0);
                            want += x, mag += fabs(x);
                        }
                        if (avg) want /= n, mag /= n;
                        double got = get(b, ft[di], k), e = fabs(got - want) / ((n + 1) * unit[di] * mag + 1e-30);
                        if (!(e <= worst)) worst = e, worst_i = k; /* (NaN counts) */
                    }
                    CHECK(st == PDDE_OK && worst <= 1, "%s %s %s n=%d count=%zu over %s: element %zu off by %.3g of the bound (n+1) u sum|x| (%s)",
                          rs ? "reduce_scatter" : "allreduce", pdde_dtype_name(ft[di]), avg ? "avg" : "sum", n, count, path, worst_i, worst,
                          pdde_last_error(pdde_comm_context(comm)));
                }
            }
    free(a), free(b);
}

/* Every rank of a test forks from one process on one host: with the channel on (PDDE_COMM_SHM unset)
 * and the algorithm left to pdde, a communicator of 2+ ranks runs these on shared memory. */
static int g_expect_shm;

static int took_shm(pdde_comm *comm, size_t count) {
    return !g_expect_shm || pdde_comm_size(comm) < 2 || !count || !strcmp(pdde_comm_last_algo(comm), "shm");
}

/* The shared-memory reduce-scatter, allgather and broadcast, non-blocking and in flight together with a
 * blocking allreduce (as the executor issues them), against the transport's (forced ring, then forced
 * recursive/tree) bit for bit: copies are exact, and a sum of integers, or of two ranks' floats (each
 * pair added once, in either order), has one answer. Float sums of 3+ ranks are run_float_sums' job.
 * Non-integer inputs, every dtype, odd counts, one chunk and several (512 KiB chunks). */
static void run_shm_vs_ucx(pdde_comm *comm) {
    pdde_context *ctx = pdde_comm_context(comm);
    int n = pdde_comm_size(comm), me = pdde_comm_rank(comm), root = n - 1;
    static const size_t counts[] = {1, 7, 4099, 65537, 300001};
    size_t maxc = 300001, big = maxc * 8 * (size_t)n;
    unsigned char *in = malloc(big), *ucx = malloc(3 * big), *shm = malloc(3 * big);
    for (size_t di = 0; di < sizeof DTYPES / sizeof *DTYPES; di++)
        for (size_t ci = 0; ci < sizeof counts / sizeof *counts; ci++) {
            pdde_dtype t = DTYPES[di];
            size_t count = counts[ci], esz = pdde_dtype_size(t), block = count * esz;
            int exact_rs = n == 2 || t == PDDE_I32 || t == PDDE_I64;
            for (size_t i = 0; i < count * (size_t)n; i++) put(in, t, i, 3.7 * sin(1.3 * me + 0.71 * (double)i) + 0.01 * me);
            for (int algo = PDDE_ALGO_RING; algo <= PDDE_ALGO_RECURSIVE; algo++) {
                unsigned char *rs_u = ucx, *ag_u = ucx + big, *bc_u = ucx + 2 * big, *rs_s = shm, *ag_s = shm + big, *bc_s = shm + 2 * big;
                pdde_comm_set_algo(comm, (pdde_comm_algo)algo);
                memcpy(bc_u, in, block);
                pdde_status st = pdde_comm_reduce_scatter(comm, in, rs_u, count, t, PDDE_REDUCE_SUM);
                if (!st) st = pdde_comm_allgather(comm, in, ag_u, count, t);
                if (!st) st = pdde_comm_broadcast(comm, bc_u, count, t, root);
                CHECK(st == PDDE_OK, "transport reference %s count=%zu: %s", pdde_dtype_name(t), count, pdde_last_error(ctx));
                pdde_comm_set_algo(comm, PDDE_ALGO_AUTO);
                memcpy(bc_s, in, block);
                memset(rs_s, 0x55, block), memset(ag_s, 0x55, block * (size_t)n);
                pdde_comm_request *rq[3] = {0};
                int32_t one = 1, ranks = 0;
                const char *algos[3] = {0};
                st = pdde_comm_ireduce_scatter(comm, in, rs_s, count, t, PDDE_REDUCE_SUM, &rq[0]);
                algos[0] = pdde_comm_last_algo(comm);
                if (!st) st = pdde_comm_allreduce(comm, &one, &ranks, 1, PDDE_I32, PDDE_REDUCE_SUM);
                if (!st) st = pdde_comm_iallgather(comm, in, ag_s, count, t, &rq[1]);
                algos[1] = pdde_comm_last_algo(comm);
                if (!st) st = pdde_comm_ibroadcast(comm, bc_s, count, t, root, &rq[2]);
                algos[2] = pdde_comm_last_algo(comm);
                for (int k = 0; k < 3; k++) {
                    if (!st && rq[k]) st = pdde_comm_wait(rq[k], 30);
                    pdde_comm_request_free(rq[k]);
                }
                CHECK(st == PDDE_OK && ranks == n, "non-blocking %s count=%zu: %s", pdde_dtype_name(t), count, pdde_last_error(ctx));
                CHECK(!g_expect_shm || n < 2 || (!strcmp(algos[0], "shm") && !strcmp(algos[1], "shm") && !strcmp(algos[2], "shm")),
                      "n=%d: the non-blocking forms took %s, %s, %s, not shm", n, algos[0], algos[1], algos[2]);
                CHECK(!exact_rs || !memcmp(rs_s, rs_u, block), "reduce_scatter %s n=%d count=%zu: shm != %s", pdde_dtype_name(t), n,
                      count, algo == PDDE_ALGO_RING ? "ring" : "recursive");
                CHECK(!memcmp(ag_s, ag_u, block * (size_t)n), "allgather %s n=%d count=%zu: shm != %s", pdde_dtype_name(t), n, count,
                      algo == PDDE_ALGO_RING ? "ring" : "recursive");
                CHECK(!memcmp(bc_s, bc_u, block), "broadcast %s n=%d count=%zu root=%d: shm != %s", pdde_dtype_name(t), n, count,
                      root, algo == PDDE_ALGO_RING ? "chain" : "tree");
            }
        }
    free(in), free(ucx), free(shm);
}

/* A dp x tp mesh of 4 ranks (rank = 2 dp + tp): the tp groups {0,1}, {2,3} and the dp groups {0,2},
 * {1,3} each get their own segment; a reduce-scatter over tp and an allgather over dp in flight at
 * once, then a broadcast over tp (as a ZeRO x Megatron step issues them), every result exact. */
static void run_mesh_axes(pdde_comm *world) {
    pdde_context *ctx = pdde_comm_context(world);
    int me = pdde_comm_rank(world), dp = me / 2, tp = me % 2;
    pdde_comm *tpc = NULL, *dpc = NULL;
    CHECK(pdde_comm_split(world, dp, tp, &tpc) == PDDE_OK && pdde_comm_split(world, tp, dp, &dpc) == PDDE_OK,
          "mesh split: %s", pdde_last_error(ctx));
    if (!tpc || !dpc) { pdde_comm_free(tpc), pdde_comm_free(dpc); return; }
    enum { N = 200003 }; /* odd, several chunks */
    int32_t *rs_in = malloc(2 * N * sizeof *rs_in), *rs_out = malloc(N * sizeof *rs_out), *ag_in = malloc(N * sizeof *ag_in),
            *ag_out = malloc(2 * N * sizeof *ag_out), *bc = malloc(N * sizeof *bc);
    for (size_t i = 0; i < 2 * (size_t)N; i++) rs_in[i] = val(me, i);
    for (size_t i = 0; i < N; i++) ag_in[i] = val(me + 7, i), bc[i] = tp == 1 ? val(me + 3, i) : -1;
    pdde_comm_request *rq[2] = {0};
    pdde_status st = pdde_comm_ireduce_scatter(tpc, rs_in, rs_out, N, PDDE_I32, PDDE_REDUCE_SUM, &rq[0]);
    if (!st) st = pdde_comm_iallgather(dpc, ag_in, ag_out, N, PDDE_I32, &rq[1]);
    for (int k = 0; k < 2; k++) {
        if (!st && rq[k]) st = pdde_comm_wait(rq[k], 30);
        pdde_comm_request_free(rq[k]);
    }
    if (!st) st = pdde_comm_broadcast(tpc, bc, N, PDDE_I32, 1);
    CHECK(st == PDDE_OK && !strcmp(pdde_comm_last_algo(tpc), "shm") && !strcmp(pdde_comm_last_algo(dpc), "shm"),
          "mesh axes: %s (tp took %s, dp %s)", pdde_last_error(ctx), pdde_comm_last_algo(tpc), pdde_comm_last_algo(dpc));
    int tp0 = 2 * dp; /* the tp group's first rank; block b of the dp allgather comes from rank 2 b + tp */
    VERIFY(rs_out, PDDE_I32, N, val(tp0, (size_t)tp * N + i) + val(tp0 + 1, (size_t)tp * N + i), "mesh: tp reduce_scatter (rank %d)", me);
    VERIFY(ag_out, PDDE_I32, 2 * (size_t)N, val(2 * (int)(i / N) + tp + 7, i % N), "mesh: dp allgather (rank %d)", me);
    VERIFY(bc, PDDE_I32, N, val(tp0 + 1 + 3, i), "mesh: tp broadcast (rank %d)", me);
    free(rs_in), free(rs_out), free(ag_in), free(ag_out), free(bc);
    pdde_comm_free(tpc), pdde_comm_free(dpc);
}

/* Runs every collective on comm; ids[r] is the "input rank" of comm rank r (its world rank). */
static void run_collectives(pdde_comm *comm, const int *ids, int full) {
    pdde_context *ctx = pdde_comm_context(comm);
    int n = pdde_comm_size(comm), me = pdde_comm_rank(comm), my = ids[me];
    size_t maxc = SIZES[NSIZES - 1];
    unsigned char *a = malloc(maxc * 8 * (size_t)n), *b = malloc(maxc * 8 * (size_t)n);
    for (size_t di = 0; di < sizeof DTYPES / sizeof *DTYPES; di++) {
        pdde_dtype t = DTYPES[di];
        const char *tn = pdde_dtype_name(t);
        for (size_t si = 0; si < NSIZES; si++) {
            size_t count = SIZES[si];
            if (!full && si % 3 != 0 && si != NSIZES - 1) continue;
            for (int oi = 0; oi < 4; oi++) {
                pdde_reduce_op op = OPS[oi];
                /* allreduce, out of place and in place */
                for (size_t i = 0; i < count; i++) put(a, t, i, val(my, i));
                pdde_status st = pdde_comm_allreduce(comm, a, b, count, t, op);
                CHECK(st == PDDE_OK, "allreduce %s %s %zu: %s", tn, OP_NAMES[oi], count, pdde_last_error(ctx));
                VERIFY(b, t, count, expect(t, op, ids, n, i), "allreduce %s %s n=%d count=%zu algo=%s", tn,
                       OP_NAMES[oi], n, count, pdde_comm_last_algo(comm));
                st = pdde_comm_allreduce(comm, a, a, count, t, op);
                VERIFY(a, t, count, expect(t, op, ids, n, i), "allreduce in place %s %s n=%d count=%zu", tn,
                       OP_NAMES[oi], n, count);
                /* reduce_scatter: rank r gets block r of the reduction of n blocks */
                size_t rc = count / 4 + (count & 1);
                for (size_t i = 0; i < rc * (size_t)n; i++) put(a, t, i, val(my, i));
                st = pdde_comm_reduce_scatter(comm, a, b, rc, t, op);
                CHECK(st == PDDE_OK, "reduce_scatter: %s", pdde_last_error(ctx));
                VERIFY(b, t, rc, expect(t, op, ids, n, (size_t)me * rc + i), "reduce_scatter %s %s n=%d recvcount=%zu",
                       tn, OP_NAMES[oi], n, rc);
                CHECK(took_shm(comm, rc), "reduce_scatter n=%d recvcount=%zu took %s", n, rc, pdde_comm_last_algo(comm));
                /* reduce to the last rank */
                int root = (oi + (int)si) % n;
                for (size_t i = 0; i < count; i++) put(a, t, i, val(my, i));
                memset(b, 0x7f, count * 8);
                st = pdde_comm_reduce(comm, a, b, count, t, op, root);
                CHECK(st == PDDE_OK, "reduce: %s", pdde_last_error(ctx));
                if (me == root)
                    VERIFY(b, t, count, expect(t, op, ids, n, i), "reduce %s %s n=%d count=%zu root=%d", tn, OP_NAMES[oi],
                           n, count, root);
                if (!full && oi) break; /* sub-communicators: one op is enough for the rest */
            }
            /* allgather */
            for (size_t i = 0; i < count; i++) put(a, t, i, val(my, i));
            pdde_status st = pdde_comm_allgather(comm, a, b, count, t);
            CHECK(st == PDDE_OK, "allgather: %s", pdde_last_error(ctx));
            VERIFY(b, t, count * (size_t)n, val(ids[i / count], i % count), "allgather %s n=%d count=%zu", tn, n, count);
            CHECK(took_shm(comm, count), "allgather n=%d count=%zu took %s", n, count, pdde_comm_last_algo(comm));
            /* broadcast from each end */
            for (int root = 0; root < n; root += n - 1) {
                for (size_t i = 0; i < count; i++) put(a, t, i, me == root ? val(my, i) : 99);
                st = pdde_comm_broadcast(comm, a, count, t, root);
                CHECK(st == PDDE_OK, "broadcast: %s", pdde_last_error(ctx));
                VERIFY(a, t, count, val(ids[root], i), "broadcast %s n=%d count=%zu root=%d algo=%s", tn, n, count, root,
                       pdde_comm_last_algo(comm));
                CHECK(took_shm(comm, count), "broadcast n=%d count=%zu took %s", n, count, pdde_comm_last_algo(comm));
                if (n == 1) break;
            }
            /* alltoall: block j of rank r holds val(r*n + j, i); I get block j = val(ids[j]*n + me, i) */
            size_t c2 = count / 2 + 1;
            for (int j = 0; j < n; j++)
                for (size_t i = 0; i < c2; i++) put(a, t, (size_t)j * c2 + i, val(my * n + j, i));
            st = pdde_comm_alltoall(comm, a, b, c2, t);
            CHECK(st == PDDE_OK, "alltoall: %s", pdde_last_error(ctx));
            VERIFY(b, t, c2 * (size_t)n, val(ids[i / c2] * n + me, i % c2), "alltoall %s n=%d count=%zu", tn, n, c2);
        }
    }
    /* alltoallv: rank r sends (r + 2j) % 5 * k elements to j, packed in order */
    size_t k = 333, sc[64], sd[64], rcn[64], rd[64], so = 0, ro = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = (size_t)((me + 2 * j) % 5) * k; sd[j] = so; so += sc[j];
        rcn[j] = (size_t)((j + 2 * me) % 5) * k; rd[j] = ro + 3; ro += rcn[j] + 3; /* gaps between blocks */
    }
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < sc[j]; i++) put(a, PDDE_I32, sd[j] + i, val(my * n + j, i));
    pdde_status st = pdde_comm_alltoallv(comm, a, sc, sd, b, rcn, rd, PDDE_I32);
    CHECK(st == PDDE_OK, "alltoallv: %s", pdde_last_error(ctx));
    for (int j = 0; j < n; j++)
        VERIFY(b + rd[j] * 4, PDDE_I32, rcn[j], val(ids[j] * n + me, i), "alltoallv from %d (%zu elements)", j, rcn[j]);
    /* barrier, and point to point around the ring */
    CHECK(pdde_comm_barrier(comm) == PDDE_OK, "barrier: %s", pdde_last_error(ctx));
    if (n > 1) {
        pdde_comm_request *rq;
        int32_t out[100], in[100];
        for (int i = 0; i < 100; i++) out[i] = my * 1000 + i;
        st = pdde_comm_irecv(comm, in, 100, PDDE_I32, (me + n - 1) % n, 77, &rq);
        CHECK(st == PDDE_OK, "irecv: %s", pdde_last_error(ctx));
        CHECK(pdde_comm_send(comm, out, 100, PDDE_I32, (me + 1) % n, 77) == PDDE_OK, "send: %s", pdde_last_error(ctx));
        CHECK(pdde_comm_wait(rq, 10) == PDDE_OK, "recv wait: %s", pdde_last_error(ctx));
        pdde_comm_request_free(rq);
        VERIFY(in, PDDE_I32, 100, ids[(me + n - 1) % n] * 1000 + (int)i, "send/recv ring");
    }
    free(a); free(b);
}

static void rank_main(pdde_context *ctx, pdde_comm *comm, void *arg) {
    coll_arg *ca = arg;
    (void)ctx;
    int n = pdde_comm_size(comm), me = pdde_comm_rank(comm);
    int ids[64];
    for (int i = 0; i < n; i++) ids[i] = i;
    pdde_comm_set_algo(comm, (pdde_comm_algo)ca->algo);
    g_expect_shm = ca->algo == PDDE_ALGO_AUTO && !getenv("PDDE_COMM_SHM");
    if (ca->float_sums_only || ca->algo == PDDE_ALGO_AUTO) run_float_sums(comm, getenv("PDDE_COMM_SHM") ? "UCX" : "the default path");
    if (ca->float_sums_only) return;
    run_collectives(comm, ids, ca->full);
    if (ca->algo != PDDE_ALGO_AUTO) return;
    run_shm_vs_ucx(comm);
    if (n == 4 && g_expect_shm) run_mesh_axes(comm);

    /* non-blocking: several operations in flight, overlapping "compute" */
    enum { NOPS = 6, CNT = 300000 };
    float *bufs[NOPS];
    pdde_comm_request *reqs[NOPS];
    for (int k = 0; k < NOPS; k++) {
        bufs[k] = malloc(CNT * sizeof(float));
        for (int i = 0; i < CNT; i++) bufs[k][i] = (float)val(me + k, (size_t)i);
        pdde_status st = pdde_comm_iallreduce(comm, bufs[k], bufs[k], CNT, PDDE_F32, PDDE_REDUCE_SUM, &reqs[k]);
        CHECK(st == PDDE_OK, "iallreduce: %s", pdde_last_error(ctx));
    }
    volatile double x = 0;
    for (int i = 0; i < 2000000; i++) x += i * 0.5; /* compute while the background progresses */
    (void)x;
    for (int k = NOPS - 1; k >= 0; k--) {
        int done = 0;
        CHECK(pdde_comm_test(reqs[k], &done) == PDDE_OK, "test: %s", pdde_last_error(ctx));
        CHECK(pdde_comm_wait(reqs[k], 30) == PDDE_OK, "wait: %s", pdde_last_error(ctx));
        pdde_comm_request_free(reqs[k]);
        int ok = 1;
        for (int i = 0; i < CNT && ok; i++) {
            long s = 0;
            for (int r = 0; r < n; r++) s += val(r + k, (size_t)i);
            ok = bufs[k][i] == (float)s;
        }
        CHECK(ok, "iallreduce %d wrong", k);
        free(bufs[k]);
    }

    /* blocking calls while non-blocking ones are in flight (the executor mixes them): every result
     * right, small ones (one round on a host's shared segment) and large ones (chunked) alike */
    for (int size = 2; size <= CNT; size *= 300) {
        float *a = malloc((size_t)size * sizeof(float)), *b = malloc((size_t)size * sizeof(float));
        for (int i = 0; i < size; i++) a[i] = (float)val(me, (size_t)i), b[i] = (float)val(me + 1, (size_t)i);
        pdde_comm_request *req = NULL;
        CHECK(pdde_comm_iallreduce(comm, a, a, (size_t)size, PDDE_F32, PDDE_REDUCE_SUM, &req) == PDDE_OK &&
              pdde_comm_allreduce(comm, b, b, (size_t)size, PDDE_F32, PDDE_REDUCE_MAX) == PDDE_OK &&
              pdde_comm_wait(req, 30) == PDDE_OK, "mixed blocking and non-blocking, %d floats: %s", size, pdde_last_error(ctx));
        pdde_comm_request_free(req);
        int ok = 1;
        for (int i = 0; i < size && ok; i++) {
            long sum = 0, max = -1000;
            for (int r = 0; r < n; r++) sum += val(r, (size_t)i), max = val(r + 1, (size_t)i) > max ? val(r + 1, (size_t)i) : max;
            ok = a[i] == (float)sum && b[i] == (float)max;
        }
        CHECK(ok, "mixed blocking and non-blocking, %d floats: wrong values", size);
        free(a), free(b);
    }

    /* split: two "mesh axes" of the ranks; keys reverse the order in one of them */
    if (n >= 2) {
        pdde_comm *sub = NULL;
        pdde_status st = pdde_comm_split(comm, me % 2, n - me, &sub);
        CHECK(st == PDDE_OK && sub, "split: %s", pdde_last_error(ctx));
        if (sub) {
            int sn = pdde_comm_size(sub), sids[64], k = 0;
            CHECK(sn == (n - me % 2 + 1) / 2, "split size %d", sn);
            for (int r = n - 1; r >= 0; r--) if (r % 2 == me % 2) sids[k++] = r; /* key n-r: descending */
            CHECK(sids[pdde_comm_rank(sub)] == me, "split rank %d of world rank %d", pdde_comm_rank(sub), me);
            run_collectives(sub, sids, 0);
            run_shm_vs_ucx(sub);
            /* a sub-communicator and the world used alternately */
            int32_t one = 1, sum = 0;
            CHECK(pdde_comm_allreduce(comm, &one, &sum, 1, PDDE_I32, PDDE_REDUCE_SUM) == PDDE_OK && sum == n, "world after split");
            CHECK(pdde_comm_allreduce(sub, &one, &sum, 1, PDDE_I32, PDDE_REDUCE_SUM) == PDDE_OK && sum == sn, "sub again");
            pdde_comm_free(sub);
        }
        st = pdde_comm_split(comm, me == 0 ? 0 : PDDE_COMM_NO_COLOR, 0, &sub);
        CHECK(st == PDDE_OK && (me == 0) == (sub != NULL), "split with no color: %s", pdde_last_error(ctx));
        pdde_comm_free(sub);
    }
}

int main(void) {
    /* ranks are fork()ed from this process: device runtimes (PoCL's threads) do not survive a fork */
    setenv("PDDE_BACKENDS", "cpu", 0);
    /* the UCX options the transport needs are in the environment once the context exists (before any of
     * pdde's threads start: a setenv later races their getenv), and the user's own are kept */
    unsetenv("UCX_POSIX_ERROR_HANDLING");
    setenv("UCX_MEM_EVENTS", "user", 1);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    const char *posix = getenv("UCX_POSIX_ERROR_HANDLING"), *events = getenv("UCX_MEM_EVENTS");
    CHECK(posix && !strcmp(posix, "y"), "UCX_POSIX_ERROR_HANDLING after pdde_context_init: %s", posix ? posix : "(unset)");
    CHECK(events && !strcmp(events, "user"), "UCX_MEM_EVENTS after pdde_context_init: %s (the user's was 'user')", events ? events : "(unset)");
    setenv("UCX_MEM_EVENTS", "n", 1);
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    if (!srv) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    const char *only = getenv("TEST_COMM_N");
    static const int algos[] = {PDDE_ALGO_AUTO, PDDE_ALGO_RING, PDDE_ALGO_RECURSIVE};
    static const char *algo_names[] = {"auto", "ring", "recursive"};
    for (int n = 2; n <= 4; n++) {
        if (only && atoi(only) != n) continue;
        for (int ai = 0; ai < 3; ai++) {
            char prefix[64];
            snprintf(prefix, sizeof prefix, "test%d%s", n, algo_names[ai]);
            test_ranks_params tp = {.addr = addr, .prefix = prefix, .timeout_s = 60, .peer_timeout_s = 5, .server = srv};
            coll_arg ca = {algos[ai], 1, 0};
            double t0 = test_now();
            int before = test_failed;
            test_run_ranks(n, &tp, rank_main, &ca, 100);
            printf("%d ranks, %-9s %s (%.1f s)\n", n, algo_names[ai], test_failed == before ? "ok" : "FAILED", test_now() - t0);
            fflush(stdout);
        }
    }
    /* the sums in f16/bf16 again on UCX alone (the default path on one host is shared memory) */
    setenv("PDDE_COMM_SHM", "0", 1);
    for (int n = 2; n <= 4; n++) {
        if (only && atoi(only) != n) continue;
        char prefix[64];
        snprintf(prefix, sizeof prefix, "floats%d", n);
        test_ranks_params tp = {.addr = addr, .prefix = prefix, .timeout_s = 60, .peer_timeout_s = 5, .server = srv};
        coll_arg ca = {PDDE_ALGO_AUTO, 0, 1};
        int before = test_failed;
        test_run_ranks(n, &tp, rank_main, &ca, 100);
        printf("%d ranks, f32/f16/bf16 sums over UCX %s\n", n, test_failed == before ? "ok" : "FAILED");
    }
    unsetenv("PDDE_COMM_SHM");
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
#endif
