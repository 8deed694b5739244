/* test_alltoall.c — all-to-all(v) on one host, each way it can run: shared memory with cross-memory
 * reads (the default), shared memory in chunks (PDDE_COMM_CMA=0) and UCX alone (PDDE_COMM_SHM=0), on
 * 2 and 3 forked ranks around a store server on 127.0.0.1. Skewed messages (a rank that sends nothing,
 * one pair of several MiB, odd sizes) arrive exactly; the non-blocking form works after the caller's
 * count arrays are gone; counts that disagree give every rank the same clear error at once, and the
 * communicator works afterwards. "refused": the kernel refuses the others' reads of rank 0 (it is not
 * dumpable and they lack CAP_SYS_PTRACE, as under a container's rules): every rank notices after the
 * first operation's reads and all go on in chunks, the results exact. Messages at, just over and just
 * under the size that goes with the counts table, back to back, arrive exact; so does a rank's own block,
 * large and small, to an unaligned place, among small and large messages. Ranks waiting in a large
 * exchange for a rank that comes 0.4 s late spend little CPU (they sleep). Send buffers from
 * pdde_comm_buffer_alloc (registered; see registers() for the ways): every case above arrives exact, a
 * large exchange is read through the peers' mappings ("shm_registered"; with PDDE_COMM_CMA=0 too), a
 * buffer freed and another allocated in its place delivers the new data, and where the kernel refuses
 * the mapping every rank goes on in chunks. (A rank killed during an all-to-all: test_comm_fail.) */
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
#include <linux/capability.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

/* Makes the others' cross-memory reads of rank 0 fail: rank 0 not dumpable, the others without
 * CAP_SYS_PTRACE (which overrides that for root). */
static int refuse_reads(int me) {
    if (me == 0) return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data)) return -1;
    data[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
    return (int)syscall(SYS_capset, &hdr, data);
}

/* Elements rank r sends rank j: 0 for some pairs, one large pair (several chunks), odd sizes. */
static size_t sendn(int r, int j) {
    if (r == 1 && j == 0) return 1500007; /* 6 MiB of i32 */
    return (size_t)((r * 5 + j * 3) % 4) * 40003;
}
static int32_t val(int r, int j, size_t i) { return (int32_t)(r * 1000003 + j * 7919 + (int)(i % 100003)); }

typedef struct { const char *way; } a2a_arg;

/* Ways whose send buffers come from pdde_comm_buffer_alloc: every rank's ("registered"; "reg_nocma" with
 * PDDE_COMM_CMA=0; "reg_refused" where the kernel refuses the others' access to rank 0, and
 * "reg_nocma_refused" with PDDE_COMM_CMA=0 too; "reg_off" with PDDE_COMM_REGISTER=0: plain memory), or
 * rank 0's alone ("mixed"). */
static int registers(const char *way, int me) { return !strncmp(way, "reg", 3) || (!strcmp(way, "mixed") && me == 0); }
static void *send_alloc(pdde_comm *c, const char *way, size_t bytes) {
    void *p = NULL;
    if (!registers(way, pdde_comm_rank(c))) return malloc(bytes);
    CHECK(pdde_comm_buffer_alloc(c, bytes, &p) == PDDE_OK && p, "%s rank %d: pdde_comm_buffer_alloc: %s", way, pdde_comm_rank(c),
          pdde_last_error(pdde_comm_context(c)));
    return p;
}
static void send_free(pdde_comm *c, const char *way, void *p) {
    if (registers(way, pdde_comm_rank(c))) pdde_comm_buffer_free(p);
    else free(p);
}
/* What a large exchange's reads must have taken: a mapping of a peer's registered buffer wherever a
 * peer this rank reads from registered its sends and the kernel lets it map them. */
static const char *large_algo(const char *way, int me) {
    if (!strcmp(way, "registered") || !strcmp(way, "reg_nocma")) return "shm_registered";
    if (!strcmp(way, "mixed")) return me == 0 ? "shm" : "shm_registered";
    return strcmp(way, "ucx") ? "shm" : NULL;
}

static void rank_main(pdde_context *ctx, pdde_comm *comm, void *arg) {
    const char *way = ((a2a_arg *)arg)->way;
    int n = pdde_comm_size(comm), me = pdde_comm_rank(comm);
    if (strstr(way, "refused")) CHECK(refuse_reads(me) == 0, "rank %d: cannot refuse reads", me);
    size_t sc[8], sd[8], rc[8], rd[8], so = 0, ro = 0;
    for (int j = 0; j < n; j++) {
        sc[j] = sendn(me, j), sd[j] = so, so += sc[j] + 5;  /* gaps between blocks, both sides */
        rc[j] = sendn(j, me), rd[j] = ro + 3, ro += rc[j] + 3;
    }
    int32_t *a = send_alloc(comm, way, (so + 1) * 4), *b = malloc((ro + 1) * 4);
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < sc[j]; i++) a[sd[j] + i] = val(me, j, i);
    for (int pass = 0; pass < 2; pass++) { /* twice: the second reuses the channel's other buffer set */
        memset(b, 0xff, (ro + 1) * 4);
        pdde_status st = pdde_comm_alltoallv(comm, a, sc, sd, b, rc, rd, PDDE_I32);
        CHECK(st == PDDE_OK, "%s rank %d: alltoallv: %s", way, me, pdde_last_error(ctx));
        size_t bad = 0;
        for (int j = 0; j < n; j++) {
            for (size_t i = 0; i < rc[j]; i++) bad += b[rd[j] + i] != val(j, me, i);
            bad += b[rd[j] - 1] != -1; /* the gaps stay untouched */
        }
        CHECK(bad == 0, "%s rank %d pass %d: %zu elements wrong", way, me, pass, bad);
    }
    const char *want_algo = large_algo(way, me);
    CHECK(want_algo ? !strcmp(pdde_comm_last_algo(comm), want_algo) : strncmp(pdde_comm_last_algo(comm), "shm", 3) != 0,
          "%s rank %d: took %s, not %s", way, me, pdde_comm_last_algo(comm), want_algo ? want_algo : "the transport");
    if (registers(way, me)) { /* a new buffer where the last was (its descriptor, likely its address): the new data arrives */
        send_free(comm, way, a);
        a = send_alloc(comm, way, (so + 1) * 4);
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < sc[j]; i++) a[sd[j] + i] = val(me, j, i) ^ 0x3c3c;
    }
    pdde_comm_barrier(comm);
    memset(b, 0xff, (ro + 1) * 4);
    pdde_status rst = pdde_comm_alltoallv(comm, a, sc, sd, b, rc, rd, PDDE_I32);
    size_t rbad = 0;
    for (int j = 0; j < n && !rst; j++)
        for (size_t i = 0; i < rc[j]; i++) rbad += b[rd[j] + i] != (val(j, me, i) ^ (registers(way, j) ? 0x3c3c : 0));
    CHECK(rst == PDDE_OK && rbad == 0, "%s rank %d: after a buffer was freed and another allocated: %s, %zu wrong", way, me,
          pdde_last_error(ctx), rbad);
    for (int j = 0; j < n; j++) /* the original data again, for the rest */
        for (size_t i = 0; i < sc[j]; i++) a[sd[j] + i] = val(me, j, i);

    /* non-blocking, the count arrays freed (and their memory scribbled on) before the wait */
    size_t *cnt = malloc(4 * (size_t)n * sizeof *cnt);
    for (int j = 0; j < n; j++) cnt[j] = sc[j], cnt[n + j] = sd[j], cnt[2 * n + j] = rc[j], cnt[3 * n + j] = rd[j];
    memset(b, 0xff, (ro + 1) * 4);
    pdde_comm_request *rq = NULL;
    pdde_status st = pdde_comm_ialltoallv(comm, a, cnt, cnt + n, b, cnt + 2 * n, cnt + 3 * n, PDDE_I32, &rq);
    CHECK(st == PDDE_OK, "%s rank %d: ialltoallv: %s", way, me, pdde_last_error(ctx));
    memset(cnt, 0x5a, 4 * (size_t)n * sizeof *cnt);
    free(cnt);
    if (!st) {
        st = pdde_comm_wait(rq, -1);
        CHECK(st == PDDE_OK, "%s rank %d: ialltoallv wait: %s", way, me, pdde_last_error(ctx));
        pdde_comm_request_free(rq);
        size_t bad = 0;
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < rc[j]; i++) bad += b[rd[j] + i] != val(j, me, i);
        CHECK(bad == 0, "%s rank %d: non-blocking: %zu elements wrong", way, me, bad);
    }

    /* equal counts (pdde_comm_alltoall), a small message */
    int32_t x[8 * 3], y[8 * 3];
    for (int i = 0; i < 3 * n; i++) x[i] = me * 100 + i;
    st = pdde_comm_alltoall(comm, x, y, 3, PDDE_I32);
    size_t bad = 0;
    for (int j = 0; j < n && !st; j++)
        for (int i = 0; i < 3; i++) bad += y[3 * j + i] != j * 100 + 3 * me + i;
    CHECK(st == PDDE_OK && bad == 0, "%s rank %d: alltoall: %s, %zu wrong", way, me, pdde_last_error(ctx), bad);

    /* in place (sendbuf == recvbuf), equal counts of 300000 (several chunks) */
    size_t big = 300000;
    int32_t *io = send_alloc(comm, way, big * (size_t)n * 4);
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < big; i++) io[(size_t)j * big + i] = val(me, j, i);
    st = pdde_comm_alltoall(comm, io, io, big, PDDE_I32);
    bad = 0;
    for (int j = 0; j < n && !st; j++)
        for (size_t i = 0; i < big; i++) bad += io[(size_t)j * big + i] != val(j, me, i);
    if (strcmp(way, "ucx"))
        CHECK(st == PDDE_OK && bad == 0, "%s rank %d: alltoall in place: %s, %zu wrong", way, me, pdde_last_error(ctx), bad);
    else /* (across hosts in place is refused, not answered with wrong data) */
        CHECK(st == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "in place"), "%s rank %d: alltoall in place: %s (%s)", way, me,
              pdde_status_str(st), pdde_last_error(ctx));
    send_free(comm, way, io);

    /* back to back around the size up to which messages go with the counts table (a chunk slot:
     * 512 KiB / n rounded down to 64 bytes, at most 16 KiB, 64 KiB where the ranks outnumber the cores;
     * where a rank's sends are registered 4 KiB, 16 KiB where the ranks outnumber the cores):
     * exactly at it, one element over (the way switches), one under, with zero counts and the last rank
     * sending nothing; each way after each other way */
    int shared = n > sysconf(_SC_NPROCESSORS_ONLN), reg_limit = !strcmp(way, "registered") || !strcmp(way, "reg_nocma") || !strcmp(way, "mixed");
    size_t slot = ((512u << 10) / (size_t)n & ~(size_t)63), most = reg_limit ? (shared ? 16u << 10 : 4u << 10) : shared ? 64u << 10 : 16u << 10;
    slot = (slot < most ? slot : most) / 4;
    static const int ladder[] = {0, 1, 2, 0, 2, 1, 3, 3, 0};
    int32_t *ls = send_alloc(comm, way, ((slot + 1) * (size_t)n + 1) * 4), *lr = malloc(((slot + 1) * (size_t)n + 1) * 4);
    for (int step = 0; step < (int)(sizeof ladder / sizeof *ladder); step++) {
        /* pair (r, j) sends base - (r + j + 1) % 2 elements (rank 0 to 1: base), the last rank none; 3: small */
        size_t base = ladder[step] == 0 ? slot : ladder[step] == 1 ? slot + 1 : ladder[step] == 2 ? slot - 1 : 7, lsc[8], lsd[8], lrc[8], lrd[8];
        size_t at = 0, rat = 0;
        for (int j = 0; j < n; j++) {
            lsc[j] = me == n - 1 ? 0 : base - (size_t)((me + j + 1) % 2), lsd[j] = at, at += lsc[j];
            lrc[j] = j == n - 1 ? 0 : base - (size_t)((j + me + 1) % 2), lrd[j] = rat, rat += lrc[j];
            for (size_t i = 0; i < lsc[j]; i++) ls[lsd[j] + i] = val(me, j, i) + step;
        }
        memset(lr, 0xff, (rat + 1) * 4);
        st = pdde_comm_alltoallv(comm, ls, lsc, lsd, lr, lrc, lrd, PDDE_I32);
        bad = 0;
        for (int j = 0; j < n && !st; j++)
            for (size_t i = 0; i < lrc[j]; i++) bad += lr[lrd[j] + i] != val(j, me, i) + step;
        bad += lr[rat] != -1;
        CHECK(st == PDDE_OK && bad == 0, "%s rank %d: boundary step %d (%zu elements a pair): %s, %zu wrong", way, me, step, base,
              pdde_last_error(ctx), bad);
    }
    send_free(comm, way, ls), free(lr);

    /* a rank's own block, copied while it waits for the others: large (from 256 KiB it bypasses the
     * caches; where the ranks outnumber the cores, from 2 MiB after the table's barrier) and small, odd lengths, the destination off any 16-byte boundary, back to back with the
     * messages to the others small (with the table) or large (read) */
    static const size_t own[] = {65536 + 3, 1001, 262147, 65536, 7, 0, 524288 + 3};
    static const size_t other[] = {5, 0, 20000, 7, 65536 + 1, 3, 1};
    size_t cap = 524288 + 3 + 8 * (65536 + 1) + 64;
    int32_t *os = send_alloc(comm, way, cap * 4), *orv = malloc(cap * 4);
    for (int step = 0; step < (int)(sizeof own / sizeof *own); step++) {
        size_t osc[8], osd[8], orc[8], ord[8], at = 1, rat = 1 + (size_t)step % 4; /* odd starts */
        for (int j = 0; j < n; j++) {
            osc[j] = orc[j] = j == me ? own[step] : other[step];
            osd[j] = at, at += osc[j] + 1;
            ord[j] = rat, rat += orc[j] + 2;
            for (size_t i = 0; i < osc[j]; i++) os[osd[j] + i] = val(me, j, i) - step;
        }
        memset(orv, 0xff, cap * 4);
        st = pdde_comm_alltoallv(comm, os, osc, osd, orv, orc, ord, PDDE_I32);
        bad = 0;
        for (int j = 0; j < n && !st; j++) {
            for (size_t i = 0; i < orc[j]; i++) bad += orv[ord[j] + i] != val(j, me, i) - step;
            bad += orv[ord[j] - 1] != -1 || orv[ord[j] + orc[j]] != -1; /* nothing written beside a block */
        }
        CHECK(st == PDDE_OK && bad == 0, "%s rank %d: own block step %d (%zu elements, %zu to the others): %s, %zu wrong", way, me, step,
              own[step], other[step], pdde_last_error(ctx), bad);
    }
    send_free(comm, way, os), free(orv);

    /* a large exchange (several hundred KiB a pair) that the last rank joins 0.4 s late: the others
     * wait without keeping a core busy (where the ranks outnumber the cores they sleep at once: a
     * spinning or yielding rank would hold a core the late one, or another rank with work, needs) */
    {
        size_t per = 75000, lc[8], ld[8];
        int32_t *ws = send_alloc(comm, way, per * (size_t)n * 4), *wr = malloc(per * (size_t)n * 4);
        for (int j = 0; j < n; j++) {
            lc[j] = per, ld[j] = (size_t)j * per;
            for (size_t i = 0; i < per; i++) ws[ld[j] + i] = val(me, j, i) ^ 0x55;
        }
        st = pdde_comm_barrier(comm);
        if (me == n - 1) usleep(400 * 1000);
        struct timespec c0, c1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
        double t0 = test_now();
        if (!st) st = pdde_comm_alltoallv(comm, ws, lc, ld, wr, lc, ld, PDDE_I32);
        double wall = test_now() - t0;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
        double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        bad = 0;
        for (int j = 0; j < n && !st; j++)
            for (size_t i = 0; i < per; i++) bad += wr[ld[j] + i] != (val(j, me, i) ^ 0x55);
        CHECK(st == PDDE_OK && bad == 0, "%s rank %d: late joiner: %s, %zu wrong", way, me, pdde_last_error(ctx), bad);
        if (me != n - 1)
            CHECK(cpu < 0.04 + 0.1 * (wall - 0.4 > 0 ? wall - 0.4 : 0), "%s rank %d: waiting %.3f s for a late rank took %.3f s of CPU", way,
                  me, wall, cpu);
        send_free(comm, way, ws), free(wr);
    }

    /* counts that disagree: rank 0 expects one element more from the last rank than it sends. On
     * shared memory every rank gets the same error at once; the communicator goes on working. */
    if (strcmp(way, "ucx")) {
        if (me == 0) rc[n - 1]++;
        double t0 = test_now();
        st = pdde_comm_alltoallv(comm, a, sc, sd, b, rc, rd, PDDE_I32);
        const char *msg = pdde_last_error(ctx);
        char want[128];
        snprintf(want, sizeof want, "rank %d sends %zu elements to rank 0, which expects %zu", n - 1, sendn(n - 1, 0), sendn(n - 1, 0) + 1);
        CHECK(st == PDDE_ERR_INVALID_ARG && strstr(msg, want), "%s rank %d: disagreeing counts gave %s (%s), not '%s'", way, me,
              pdde_status_str(st), msg, want);
        CHECK(test_now() - t0 < 5, "%s rank %d: the error took %.1f s", way, me, test_now() - t0);
        int32_t one = 1, sum = 0;
        st = pdde_comm_allreduce(comm, &one, &sum, 1, PDDE_I32, PDDE_REDUCE_SUM);
        CHECK(st == PDDE_OK && sum == n, "%s rank %d: allreduce after the error: %s, %d", way, me, pdde_last_error(ctx), sum);
    }
    send_free(comm, way, a), free(b);
}

int main(void) {
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    setenv("PDDE_BACKENDS", "cpu", 0);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    if (!srv) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    static const char *ways[] = {"cma", "chunks", "ucx", "refused", "registered", "mixed", "reg_nocma", "reg_refused", "reg_nocma_refused", "reg_off"};
    for (int w = 0; w < (int)(sizeof ways / sizeof *ways); w++)
        for (int n = 2; n <= 3; n++) {
            if (w == 1 || !strncmp(ways[w], "reg_nocma", 9)) setenv("PDDE_COMM_CMA", "0", 1);
            if (w == 2) setenv("PDDE_COMM_SHM", "0", 1);
            if (!strcmp(ways[w], "reg_off")) setenv("PDDE_COMM_REGISTER", "0", 1);
            char prefix[64];
            snprintf(prefix, sizeof prefix, "a2a_%s_%d", ways[w], n);
            test_ranks_params tp = {.addr = addr, .prefix = prefix, .timeout_s = 30, .peer_timeout_s = 5, .server = srv};
            a2a_arg aa = {ways[w]};
            int before = test_failed;
            double t0 = test_now();
            test_run_ranks(n, &tp, rank_main, &aa, 60);
            printf("%d ranks, %-6s %s (%.1f s)\n", n, ways[w], test_failed == before ? "ok" : "FAILED", test_now() - t0);
            fflush(stdout);
            unsetenv("PDDE_COMM_CMA"), unsetenv("PDDE_COMM_SHM"), unsetenv("PDDE_COMM_REGISTER");
        }
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
#endif
