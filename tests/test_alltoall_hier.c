/* test_alltoall_hier.c — the hierarchical all-to-all across hosts, on forked ranks presented as several
 * hosts by their host ids (pdde_comm_params.host_id, as PDDE_HOST_ID sets it): 4 ranks as 2 hosts x 2
 * (host by host, and interleaved: ranks 0 and 2 on one host, so the received blocks are not laid out
 * host by host), 6 as 3 x 2 and 6 as 2 x 3, over UCX on 127.0.0.1 across "hosts" and shared memory
 * within. alltoallv with uneven counts, zero counts and a rank that sends nothing, f32 and bf16, and
 * alltoall: the hierarchical exchange (PDDE_COMM_A2A_HIER=1) equals the flat one (=0) bit for bit,
 * gaps between the blocks untouched, and the flat one equals the values sent. Unset, small messages go
 * hierarchically and large ones flat, and ranks whose own messages differ in size agree on the
 * choice. A rank killed before a hierarchical exchange: the others get an error within the peer
 * timeout, no hang. */
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

typedef struct {
    const char *addr, *prefix;
    int local;       /* ranks a host */
    int interleaved; /* host = rank % hosts (else rank / local) */
    int die;         /* the last rank is killed before the second exchange */
} hier_arg;

/* Elements rank r sends rank j in pattern p: uneven, some pairs 0, one larger pair; pattern 1: the
 * last rank sends nothing at all. */
static size_t sendn(int r, int j, int n, int p) {
    if (p == 1 && r == n - 1) return 0;
    size_t k = (size_t)((r * 5 + j * 3 + p) % 4) * 37;
    return k + (r == 1 && j == n - 1 ? 3001 : 0);
}
/* the bits of element i from r to j (16 or 32 of them) */
static uint32_t val(int r, int j, size_t i) { return (uint32_t)(r * 1000003u + j * 7919u + (uint32_t)i * 2654435761u); }

static void fill(void *buf, size_t at, size_t count, int esz, int r, int j) {
    for (size_t i = 0; i < count; i++) {
        if (esz == 4) ((uint32_t *)buf)[at + i] = val(r, j, i);
        else ((uint16_t *)buf)[at + i] = (uint16_t)val(r, j, i);
    }
}
static int same(const void *buf, size_t at, int esz, int r, int j, size_t i) {
    return esz == 4 ? ((const uint32_t *)buf)[at + i] == val(r, j, i) : ((const uint16_t *)buf)[at + i] == (uint16_t)val(r, j, i);
}

/* One alltoallv on comm of pattern p (dtype t), into recv (gaps of 0xff between blocks); returns
 * the status. rc/rd out. */
static pdde_status exchange(pdde_comm *comm, int p, pdde_dtype t, void **recv, size_t *bytes, size_t *rc, size_t *rd) {
    int n = pdde_comm_size(comm), me = pdde_comm_rank(comm), esz = (int)pdde_dtype_size(t);
    size_t sc[8], sd[8], so = 0, ro = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = sendn(me, j, n, p), sd[j] = so + 2, so += sc[j] + 2; /* gaps on both sides */
        rc[j] = sendn(j, me, n, p), rd[j] = ro + 1, ro += rc[j] + 1;
    }
    /* received host by host in reverse rank order: never laid out as the hierarchical form sends */
    if (p == 1) {
        size_t o = 0;
        for (int j = n - 1; j >= 0; j--) rd[j] = o + 1, o += rc[j] + 1;
    }
    void *a = malloc((so + 1) * (size_t)esz);
    *bytes = (ro + 1) * (size_t)esz;
    *recv = malloc(*bytes);
    memset(*recv, 0xff, *bytes);
    for (int j = 0; j < n; j++) fill(a, sd[j], sc[j], esz, me, j);
    pdde_status st = pdde_comm_alltoallv(comm, a, sc, sd, *recv, rc, rd, t);
    free(a);
    return st;
}

static pdde_comm *make_comm(pdde_context *ctx, const hier_arg *ha, int n, pdde_store **store) {
    int hosts = n / ha->local, me = test_rank_me;
    char host[32];
    snprintf(host, sizeof host, "host%d", ha->interleaved ? me % hosts : me / ha->local);
    pdde_comm *comm = NULL;
    pdde_status st = pdde_store_connect(ctx, ha->addr, 10, store);
    pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
    p.store = *store, p.rank = me, p.world_size = n, p.prefix = ha->prefix, p.host_id = host;
    p.timeout_s = 20, p.peer_timeout_s = 2;
    if (!st) st = pdde_comm_init(ctx, &p, &comm);
    CHECK(st == PDDE_OK, "rank %d: comm init: %s", me, pdde_last_error(ctx));
    return comm;
}

static int n_ranks;

static void rank_main(pdde_context *ctx, pdde_comm *unused, void *arg) {
    (void)unused;
    const hier_arg *ha = arg;
    int n = n_ranks, me = test_rank_me;
    pdde_store *store = NULL;
    setenv("PDDE_COMM_A2A_HIER", "0", 1); /* read at a communicator's first all-to-all */
    pdde_comm *flat = make_comm(ctx, ha, n, &store), *hier = NULL, *automatic = NULL;
    if (!flat) { pdde_store_close(store); return; }
    CHECK(pdde_comm_host_count(flat) == n / ha->local, "rank %d: %d hosts", me, pdde_comm_host_count(flat));
    int32_t warm = me, back[8];
    CHECK(pdde_comm_alltoall(flat, &warm, back, 0, PDDE_I32) == PDDE_OK, "rank %d: flat alltoall", me);
    setenv("PDDE_COMM_A2A_HIER", "1", 1);
    pdde_status st = pdde_comm_split(flat, 0, me, &hier);
    CHECK(st == PDDE_OK, "rank %d: split: %s", me, pdde_last_error(ctx));
    if (ha->die) {
        void *r = NULL;
        size_t bytes, rc[8], rd[8];
        st = exchange(hier, 0, PDDE_F32, &r, &bytes, rc, rd);
        CHECK(st == PDDE_OK && !strcmp(pdde_comm_last_algo(hier), "hierarchical"), "rank %d: first exchange: %s (%s)", me,
              pdde_last_error(ctx), pdde_comm_last_algo(hier));
        free(r);
        if (me == n - 1) raise(SIGKILL);
        double t0 = test_now();
        st = exchange(hier, 0, PDDE_F32, &r, &bytes, rc, rd);
        double took = test_now() - t0;
        free(r);
        CHECK(st != PDDE_OK && *pdde_last_error(ctx), "rank %d: exchange with a dead rank: %s (%s)", me, pdde_status_str(st), pdde_last_error(ctx));
        CHECK(took < 2 * 2 + 3, "rank %d: the error took %.1f s", me, took);
        printf("rank %d: %s after %.2f s: %s\n", me, pdde_status_str(st), took, pdde_last_error(ctx));
        pdde_comm_free(hier), pdde_comm_free(flat), pdde_store_close(store);
        return;
    }
    for (int ti = 0; ti < 2; ti++)
        for (int p = 0; p < 2; p++) {
            pdde_dtype t = ti ? PDDE_BF16 : PDDE_F32;
            int esz = (int)pdde_dtype_size(t);
            void *rf = NULL, *rh = NULL;
            size_t bf, bh, rc[8], rd[8];
            pdde_status sf = exchange(flat, p, t, &rf, &bf, rc, rd), sh = exchange(hier, p, t, &rh, &bh, rc, rd);
            CHECK(sf == PDDE_OK && sh == PDDE_OK, "rank %d %s pattern %d: flat %s, hierarchical %s: %s", me, pdde_dtype_name(t), p,
                  pdde_status_str(sf), pdde_status_str(sh), pdde_last_error(ctx));
            CHECK(!strcmp(pdde_comm_last_algo(flat), "pairwise") && !strcmp(pdde_comm_last_algo(hier), "hierarchical"),
                  "rank %d: took %s and %s", me, pdde_comm_last_algo(flat), pdde_comm_last_algo(hier));
            size_t bad = 0;
            for (int j = 0; j < n && !sf; j++) {
                for (size_t i = 0; i < rc[j]; i++) bad += !same(rf, rd[j], esz, j, me, i);
                bad += ((unsigned char *)rf)[(rd[j] - 1) * (size_t)esz] != 0xff; /* the gap before each block */
            }
            CHECK(bad == 0, "rank %d %s pattern %d: the flat exchange has %zu elements wrong", me, pdde_dtype_name(t), p, bad);
            CHECK(bf == bh && !memcmp(rf, rh, bf), "rank %d %s pattern %d: the hierarchical exchange differs from the flat one", me,
                  pdde_dtype_name(t), p);
            free(rf), free(rh);
        }
    /* alltoall, equal counts */
    {
        size_t count = 333;
        uint32_t *a = malloc(count * (size_t)n * 4), *bf = malloc(count * (size_t)n * 4), *bh = malloc(count * (size_t)n * 4);
        for (int j = 0; j < n; j++) fill(a, (size_t)j * count, count, 4, me, j);
        pdde_status sf = pdde_comm_alltoall(flat, a, bf, count, PDDE_F32), sh = pdde_comm_alltoall(hier, a, bh, count, PDDE_F32);
        CHECK(sf == PDDE_OK && sh == PDDE_OK && !strcmp(pdde_comm_last_algo(hier), "hierarchical") &&
                  !memcmp(bf, bh, count * (size_t)n * 4),
              "rank %d: alltoall: %s %s (%s): hierarchical differs from flat", me, pdde_status_str(sf), pdde_status_str(sh),
              pdde_comm_last_algo(hier));
        free(a), free(bf), free(bh);
    }
    /* unset: by the size rule. Small equal messages hierarchical, large ones flat; alltoallv where rank
     * 0's own messages are above the rule's size and the mean of all is below: every rank hierarchical */
    unsetenv("PDDE_COMM_A2A_HIER");
    st = pdde_comm_split(flat, 0, me, &automatic);
    CHECK(st == PDDE_OK, "rank %d: split: %s", me, pdde_last_error(ctx));
    double rule = PDDE_COMM_A2A_HIER_BYTES(n / ha->local, ha->local);
    size_t small = (size_t)(rule / 4 / 2), large = (size_t)(rule / 4 * 2) + 1;
    const char *want[2] = {"hierarchical", "pairwise"};
    for (int k = 0; k < 2 && automatic; k++) {
        size_t count = k ? large : small;
        uint32_t *a = malloc(count * (size_t)n * 4), *b = malloc(count * (size_t)n * 4);
        for (int j = 0; j < n; j++) fill(a, (size_t)j * count, count, 4, me, j);
        st = pdde_comm_alltoall(automatic, a, b, count, PDDE_F32);
        size_t bad = 0;
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < count; i++) bad += !same(b, (size_t)j * count, 4, j, me, i);
        CHECK(st == PDDE_OK && bad == 0 && !strcmp(pdde_comm_last_algo(automatic), want[k]), "rank %d: alltoall of %zu B a pair: %s, took %s, %zu wrong", me,
              count * 4, pdde_last_error(ctx), pdde_comm_last_algo(automatic), bad);
        free(a), free(b);
    }
    if (automatic) {
        size_t big = (size_t)(rule / 4 * 1.5) + 1, few = 10, sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
        for (int j = 0; j < n; j++) {
            sc[j] = me == 0 ? big : few, sd[j] = so, so += sc[j];
            rc[j] = j == 0 ? big : few, rd[j] = ro, ro += rc[j];
        }
        CHECK(few * 4.0 * n * (n - 1) + big * 4.0 * n <= rule * n * n && big * 4.0 > rule, "the case is not as meant");
        uint32_t *a = malloc(so * 4), *b = malloc(ro * 4);
        for (int j = 0; j < n; j++) fill(a, sd[j], sc[j], 4, me, j);
        st = pdde_comm_alltoallv(automatic, a, sc, sd, b, rc, rd, PDDE_F32);
        size_t bad = 0;
        for (int j = 0; j < n && !st; j++)
            for (size_t i = 0; i < rc[j]; i++) bad += !same(b, rd[j], 4, j, me, i);
        CHECK(st == PDDE_OK && bad == 0 && !strcmp(pdde_comm_last_algo(automatic), "hierarchical"),
              "rank %d: alltoallv, rank 0's messages large: %s, took %s, %zu wrong", me, pdde_last_error(ctx), pdde_comm_last_algo(automatic), bad);
        free(a), free(b);
    }
    pdde_comm_free(automatic), pdde_comm_free(hier), pdde_comm_free(flat);
    pdde_store_close(store);
}

int main(void) {
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    setenv("PDDE_BACKENDS", "cpu", 0);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    if (!srv) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    static const struct { int n, local, interleaved, die; const char *name; } runs[] = {
        {4, 2, 0, 0, "2 hosts x 2"}, {4, 2, 1, 0, "2 hosts x 2, interleaved"}, {6, 2, 0, 0, "3 hosts x 2"},
        {6, 3, 0, 0, "2 hosts x 3"}, {4, 2, 0, 1, "2 hosts x 2, a rank killed"}};
    for (int i = 0; i < (int)(sizeof runs / sizeof runs[0]); i++) {
        char prefix[64];
        snprintf(prefix, sizeof prefix, "a2ah_%d", i);
        hier_arg ha = {addr, prefix, runs[i].local, runs[i].interleaved, runs[i].die};
        test_ranks_params tp = {.addr = addr, .prefix = prefix, .no_comm = 1, .server = srv,
                                .killed_ok = runs[i].die ? 1u << (runs[i].n - 1) : 0};
        n_ranks = runs[i].n;
        int before = test_failed;
        double t0 = test_now();
        test_run_ranks(runs[i].n, &tp, rank_main, &ha, 60);
        printf("%d ranks, %s: %s (%.1f s)\n", runs[i].n, runs[i].name, test_failed == before ? "ok" : "FAILED", test_now() - t0);
        fflush(stdout);
    }
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
#endif
