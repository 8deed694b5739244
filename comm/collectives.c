/* comm/collectives.c — the collective algorithms and the public collective calls. Each algorithm only
 * appends steps to programs (schedule.c runs them). Algorithms work on a "group": a list of world
 * ranks and my index in it, so they compose: two-level allreduce is ring reduce-scatter on the host's
 * group, allreduce on the cross-host group, ring allgather on the host's group, in one program.
 * Large messages are cut into segments, one program each, several in flight (pipelining). */

#ifndef PDDE_COMM_COLLECTIVES_C
#define PDDE_COMM_COLLECTIVES_C

#include "util.c"
#include "world.c"
#include "schedule.c"
#include "progress.c"
#include "shm.c"

#define COMM_SMALL_BYTES (64u << 10)   /* at or below: latency-bound algorithms (recursive, tree) */
#define COMM_SEGMENT_BYTES (1u << 20)  /* pipelining unit of large messages */
#define COMM_MAX_SEGMENTS 255          /* program index is 8 bits of the tag */
#define COMM_PIPELINE_DEPTH 4          /* programs (segments) of one operation in flight at once */

typedef struct {
    const int *g; /* world ranks */
    int n, me;
} comm_group;

static int mod(int a, int n) { return ((a % n) + n) % n; }

/* ------------------------------------------------------------------------------------------------
 * Algorithms. off/len give each group member's chunk in elements from buf; esz is the element size. */

/* Ring reduce-scatter: afterwards member i holds chunk i reduced over the group. scratch >= max len. */
static void build_ring_rs(comm_prog *p, comm_group G, char *buf, const size_t *off, const size_t *len, size_t esz,
                          char *scratch) {
    int n = G.n, me = G.me, right = G.g[mod(me + 1, n)], left = G.g[mod(me - 1, n)];
    for (int s = 0; s < n - 1; s++) {
        int sc = mod(me - s - 1, n), rc = mod(me - s - 2, n);
        prog_xfer(p, p->round + s, right, buf + off[sc] * esz, len[sc] * esz, left, scratch, len[rc] * esz);
        prog_action(p, STEP_REDUCE, buf + off[rc] * esz, scratch, len[rc]);
    }
    p->round += n - 1;
}

/* Ring allgather: member i starts with chunk i, ends with all. */
static void build_ring_ag(comm_prog *p, comm_group G, char *buf, const size_t *off, const size_t *len, size_t esz) {
    int n = G.n, me = G.me, right = G.g[mod(me + 1, n)], left = G.g[mod(me - 1, n)];
    for (int s = 0; s < n - 1; s++) {
        int sc = mod(me - s, n), rc = mod(me - s - 1, n);
        prog_xfer(p, p->round + s, right, buf + off[sc] * esz, len[sc] * esz, left, buf + off[rc] * esz, len[rc] * esz);
    }
    p->round += n - 1;
}

/* Recursive doubling allreduce of count elements; a group that is not a power of two first folds
 * its extra members into their neighbours and unfolds at the end. scratch >= count elements. */
static void build_rd_allreduce(comm_prog *p, comm_group G, char *buf, size_t count, size_t esz, char *scratch) {
    int n = G.n, me = G.me, p2 = 1, lg = 0, r0 = p->round;
    if (n == 1) return;
    while (p2 * 2 <= n) { p2 *= 2; lg++; }
    int rem = n - p2, vme;
    size_t bytes = count * esz;
    if (me < 2 * rem && me % 2 == 0) {
        prog_xfer(p, r0, G.g[me + 1], buf, bytes, -1, NULL, 0);
        prog_xfer(p, r0 + 1 + lg, -1, NULL, 0, G.g[me + 1], buf, bytes);
        vme = -1;
    } else if (me < 2 * rem) {
        prog_xfer(p, r0, -1, NULL, 0, G.g[me - 1], scratch, bytes);
        prog_action(p, STEP_REDUCE, buf, scratch, count);
        vme = me / 2;
    } else {
        vme = me - rem;
    }
    for (int k = 0; vme >= 0 && k < lg; k++) {
        int vpeer = vme ^ (1 << k), peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
        prog_xfer(p, r0 + 1 + k, G.g[peer], buf, bytes, G.g[peer], scratch, bytes);
        prog_action(p, STEP_REDUCE, buf, scratch, count);
    }
    if (vme >= 0 && me < 2 * rem) prog_xfer(p, r0 + 1 + lg, G.g[me - 1], buf, bytes, -1, NULL, 0);
    p->round = r0 + 2 + lg;
}

/* Allreduce of count elements over G: recursive doubling when small, else ring. scratch >= count. */
static void build_allreduce_flat(comm_prog *p, comm_group G, char *buf, size_t count, size_t esz, char *scratch,
                                 int recursive, size_t *off, size_t *len) {
    if (recursive) { build_rd_allreduce(p, G, buf, count, esz, scratch); return; }
    for (int i = 0; i < G.n; i++) comm_part(count, G.n, i, &off[i], &len[i]);
    build_ring_rs(p, G, buf, off, len, esz, scratch);
    build_ring_ag(p, G, buf, off, len, esz);
}

/* ------------------------------------------------------------------------------------------------
 * Shared plumbing of the public calls */

static pdde_status comm_check(pdde_comm *c, pdde_dtype t, pdde_reduce_op op, pdde_comm_request **req) {
    if (!c || !req) return PDDE_ERR_INVALID_ARG;
    *req = NULL;
    if ((unsigned)t >= PDDE_DTYPE_COUNT) return pdde_error(c->w->ctx, PDDE_ERR_DTYPE, "comm: bad dtype %d", (int)t);
    if ((unsigned)op > PDDE_REDUCE_MIN) return pdde_error(c->w->ctx, PDDE_ERR_INVALID_ARG, "comm: bad reduce op %d", (int)op);
    return PDDE_OK;
}

#define COMM_NEED(cond, what)                                                                     \
    do {                                                                                          \
        if (!(cond)) return pdde_error(c->w->ctx, PDDE_ERR_INVALID_ARG, "%s: %s", __func__, what); \
    } while (0)

static pdde_comm_algo comm_pick(const pdde_comm *c, size_t bytes) {
    if (c->algo) return c->algo;
    return bytes <= COMM_SMALL_BYTES ? PDDE_ALGO_RECURSIVE : PDDE_ALGO_RING;
}

static int comm_nseg(size_t count, size_t esz, int min_elems) {
    size_t nseg = (count * esz + COMM_SEGMENT_BYTES - 1) / COMM_SEGMENT_BYTES;
    if (nseg > COMM_MAX_SEGMENTS) nseg = COMM_MAX_SEGMENTS;
    if (min_elems > 0 && nseg > count / (size_t)min_elems) nseg = count / (size_t)min_elems;
    return nseg ? (int)nseg : 1;
}

static pdde_status req_built(pdde_comm_request *r) {
    for (int i = 0; i < r->nprog; i++)
        if (r->progs[i].oom) return PDDE_ERR_OOM;
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Allreduce */

pdde_status pdde_comm_iallreduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t,
                                 pdde_reduce_op op, pdde_comm_request **req) {
    pdde_status st = comm_check(c, t, op, req);
    if (st) return st;
    COMM_NEED(!count || (sendbuf && recvbuf), "NULL buffer");
    if (comm_shm_takes(c, count, 1, t, op)) return comm_shm_istart(c, comm_shm_allreduce_op(sendbuf, recvbuf, count, t, op), req);
    size_t esz = pdde_dtype_size(t), bytes = count * esz;
    if (sendbuf != recvbuf && bytes) memcpy(recvbuf, sendbuf, bytes);
    pdde_comm_algo algo = comm_pick(c, bytes);
    if (!c->algo && c->n_hosts > 1 && c->local_equal && c->local_n > 1 && bytes > COMM_SMALL_BYTES)
        algo = PDDE_ALGO_TWO_LEVEL;
    if (algo == PDDE_ALGO_TWO_LEVEL && !(c->n_hosts > 1 && c->local_equal)) algo = PDDE_ALGO_RING;
    int two = algo == PDDE_ALGO_TWO_LEVEL, rec = algo == PDDE_ALGO_RECURSIVE;
    int group_n = two ? c->local_n : c->size;
    int nseg = rec ? 1 : comm_nseg(count, esz, group_n);
    pdde_comm_request *r = NULL;
    if ((st = req_alloc(c, c->size > 1 ? nseg : 0, t, op, &r))) return st;
    r->max_active = COMM_PIPELINE_DEPTH;
    size_t seg_max = (count + (size_t)nseg - 1) / (size_t)nseg;
    size_t scratch = rec ? seg_max : seg_max / (size_t)group_n + 1; /* two-level: cross phase reuses it */
    size_t nparts = (size_t)c->size + 1, hdr = 2 * nparts * sizeof(size_t);
    if ((st = req_scratch(r, hdr + (size_t)req_nslots(r) * scratch * esz))) return req_abandon(r, st);
    size_t *off = r->scratch, *len = off + nparts; /* the parts tables first: they keep their alignment */
    comm_group world = {c->ranks, c->size, c->rank}, local = {c->local_group, c->local_n, c->local_me},
               cross = {c->cross_group, c->cross_n, c->cross_me};
    for (int s = 0; s < r->nprog; s++) {
        comm_prog *p = &r->progs[s];
        size_t soff, slen;
        comm_part(count, nseg, s, &soff, &slen);
        char *buf = (char *)recvbuf + soff * esz, *scr = (char *)r->scratch + hdr + (size_t)req_slot(r, s) * scratch * esz;
        if (two) {
            for (int i = 0; i < local.n; i++) comm_part(slen, local.n, i, &off[i], &len[i]);
            size_t coff = off[local.me], clen = len[local.me];
            build_ring_rs(p, local, buf, off, len, esz, scr);
            /* off/len are reused by the cross phase; recompute the local split after it */
            build_allreduce_flat(p, cross, buf + coff * esz, clen, esz, scr, clen * esz <= COMM_SMALL_BYTES, off, len);
            for (int i = 0; i < local.n; i++) comm_part(slen, local.n, i, &off[i], &len[i]);
            build_ring_ag(p, local, buf, off, len, esz);
        } else {
            build_allreduce_flat(p, world, buf, slen, esz, scr, rec, off, len);
        }
        if (op == PDDE_REDUCE_AVG) prog_action(p, STEP_DIV, buf, NULL, slen);
    }
    if ((st = req_built(r))) return req_abandon(r, st);
    r->kind = "allreduce";
    return comm_start(c, r, two ? "two_level" : rec ? "recursive" : "ring", req);
}

/* ------------------------------------------------------------------------------------------------
 * Reduce-scatter: reduce into a copy of sendbuf, then keep block rank. */

pdde_status pdde_comm_ireduce_scatter(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                      pdde_dtype t, pdde_reduce_op op, pdde_comm_request **req) {
    pdde_status st = comm_check(c, t, op, req);
    if (st) return st;
    COMM_NEED(!recvcount || (sendbuf && recvbuf), "NULL buffer");
    if (comm_shm_takes(c, recvcount, 1, t, op))
        return comm_shm_istart(c, comm_shm_reduce_scatter_op(sendbuf, recvbuf, recvcount, t, op), req);
    int n = c->size;
    size_t esz = pdde_dtype_size(t), total = recvcount * (size_t)n;
    int rec = comm_pick(c, total * esz) == PDDE_ALGO_RECURSIVE;
    int nseg = rec ? 1 : comm_nseg(recvcount, esz, 1);
    pdde_comm_request *r = NULL;
    if ((st = req_alloc(c, recvcount ? nseg : 0, t, op, &r))) return st;
    r->max_active = COMM_PIPELINE_DEPTH;
    size_t seg_max = (recvcount + (size_t)nseg - 1) / (size_t)nseg, scratch = rec ? total : seg_max;
    size_t hdr = 2 * (size_t)n * sizeof(size_t);
    if ((st = req_scratch(r, hdr + (total + (size_t)req_nslots(r) * scratch) * esz))) return req_abandon(r, st);
    size_t *off = r->scratch, *len = off + n;
    char *work = (char *)r->scratch + hdr;
    if (total) memcpy(work, sendbuf, total * esz);
    comm_group G = {c->ranks, n, c->rank};
    for (int s = 0; s < r->nprog; s++) {
        comm_prog *p = &r->progs[s];
        size_t soff, slen;
        comm_part(recvcount, nseg, s, &soff, &slen);
        char *scr = work + (total + (size_t)req_slot(r, s) * scratch) * esz;
        if (rec) {
            build_rd_allreduce(p, G, work, total, esz, scr);
        } else {
            for (int i = 0; i < n; i++) { off[i] = (size_t)i * recvcount + soff; len[i] = slen; }
            build_ring_rs(p, G, work, off, len, esz, scr);
        }
        size_t mine = (size_t)c->rank * recvcount + soff;
        prog_action(p, STEP_COPY, (char *)recvbuf + soff * esz, work + mine * esz, slen * esz);
        if (op == PDDE_REDUCE_AVG) prog_action(p, STEP_DIV, (char *)recvbuf + soff * esz, NULL, slen);
    }
    if ((st = req_built(r))) return req_abandon(r, st);
    r->kind = "reduce_scatter";
    return comm_start(c, r, rec ? "recursive" : "ring", req);
}

/* ------------------------------------------------------------------------------------------------
 * Allgather */

pdde_status pdde_comm_iallgather(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount, pdde_dtype t,
                                 pdde_comm_request **req) {
    pdde_status st = comm_check(c, t, PDDE_REDUCE_SUM, req);
    if (st) return st;
    COMM_NEED(!sendcount || (sendbuf && recvbuf), "NULL buffer");
    if (comm_shm_takes(c, sendcount, 1, t, PDDE_REDUCE_SUM))
        return comm_shm_istart(c, comm_shm_allgather_op(sendbuf, recvbuf, sendcount, t), req);
    int n = c->size, me = c->rank;
    size_t esz = pdde_dtype_size(t), block = sendcount * esz;
    char *out = recvbuf;
    if (block) memmove(out + (size_t)me * block, sendbuf, block);
    int pow2 = !(n & (n - 1));
    int rec = pow2 && comm_pick(c, block * (size_t)n) == PDDE_ALGO_RECURSIVE;
    int nseg = rec ? 1 : comm_nseg(sendcount, esz, 1);
    pdde_comm_request *r = NULL;
    if ((st = req_alloc(c, sendcount && n > 1 ? nseg : 0, t, PDDE_REDUCE_SUM, &r))) return st;
    r->max_active = COMM_PIPELINE_DEPTH;
    if ((st = req_scratch(r, 2 * (size_t)n * sizeof(size_t)))) return req_abandon(r, st);
    size_t *off = r->scratch, *len = off + n;
    comm_group G = {c->ranks, n, me};
    for (int s = 0; s < r->nprog; s++) {
        comm_prog *p = &r->progs[s];
        if (rec) {
            /* step k swaps the aligned runs of 2^k blocks that me and me^2^k hold */
            for (int k = 0; (1 << k) < n; k++) {
                int peer = me ^ (1 << k), mine = (me >> k) << k, theirs = (peer >> k) << k;
                prog_xfer(p, k, c->ranks[peer], out + (size_t)mine * block, block << k, c->ranks[peer],
                          out + (size_t)theirs * block, block << k);
            }
        } else {
            size_t soff, slen;
            comm_part(sendcount, nseg, s, &soff, &slen);
            for (int i = 0; i < n; i++) { off[i] = (size_t)i * sendcount + soff; len[i] = slen; }
            build_ring_ag(p, G, out, off, len, esz);
        }
    }
    if ((st = req_built(r))) return req_abandon(r, st);
    r->kind = "allgather";
    return comm_start(c, r, rec ? "recursive" : "ring", req);
}

/* ------------------------------------------------------------------------------------------------
 * Broadcast and reduce: binomial trees when small, pipelined chains when large. Ranks are renumbered
 * relative to the root (v = 0 is the root). */

pdde_status pdde_comm_ibroadcast(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int root, pdde_comm_request **req) {
    pdde_status st = comm_check(c, t, PDDE_REDUCE_SUM, req);
    if (st) return st;
    COMM_NEED(!count || buf, "NULL buffer");
    COMM_NEED(root >= 0 && root < c->size, "root out of range");
    if (comm_shm_takes(c, count, 1, t, PDDE_REDUCE_SUM)) return comm_shm_istart(c, comm_shm_broadcast_op(buf, count, t, root), req);
    int n = c->size, v = mod(c->rank - root, n);
    size_t esz = pdde_dtype_size(t);
    int tree = comm_pick(c, count * esz) == PDDE_ALGO_RECURSIVE;
    int nseg = tree ? 1 : comm_nseg(count, esz, 1);
    pdde_comm_request *r = NULL;
    if ((st = req_alloc(c, count && n > 1 ? nseg : 0, t, PDDE_REDUCE_SUM, &r))) return st;
    r->max_active = COMM_PIPELINE_DEPTH;
#define REL(x) c->ranks[mod((x) + root, n)]
    for (int s = 0; s < r->nprog; s++) {
        comm_prog *p = &r->progs[s];
        size_t soff, slen;
        comm_part(count, nseg, s, &soff, &slen);
        char *b = (char *)buf + soff * esz;
        size_t bytes = slen * esz;
        if (tree) {
            int mask = 1;
            while (mask < n && !(v & mask)) mask <<= 1;
            if (v) prog_xfer(p, __builtin_ctz((unsigned)mask), -1, NULL, 0, REL(v - mask), b, bytes);
            for (mask >>= 1; mask > 0; mask >>= 1)
                if (v + mask < n) prog_xfer(p, __builtin_ctz((unsigned)mask), REL(v + mask), b, bytes, -1, NULL, 0);
        } else {
            if (v > 0) prog_xfer(p, 0, -1, NULL, 0, REL(v - 1), b, bytes);
            if (v < n - 1) prog_xfer(p, 0, REL(v + 1), b, bytes, -1, NULL, 0);
        }
    }
    if ((st = req_built(r))) return req_abandon(r, st);
    r->kind = "broadcast";
    return comm_start(c, r, tree ? "tree" : "chain", req);
}

pdde_status pdde_comm_ireduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t,
                              pdde_reduce_op op, int root, pdde_comm_request **req) {
    pdde_status st = comm_check(c, t, op, req);
    if (st) return st;
    COMM_NEED(root >= 0 && root < c->size, "root out of range");
    COMM_NEED(!count || (sendbuf && (recvbuf || c->rank != root)), "NULL buffer");
    int n = c->size, v = mod(c->rank - root, n);
    size_t esz = pdde_dtype_size(t), bytes = count * esz;
    int tree = comm_pick(c, bytes) == PDDE_ALGO_RECURSIVE;
    int nseg = tree ? 1 : comm_nseg(count, esz, 1);
    pdde_comm_request *r = NULL;
    if ((st = req_alloc(c, count && n > 1 ? nseg : 0, t, op, &r))) return st;
    r->max_active = COMM_PIPELINE_DEPTH;
    /* the accumulator is recvbuf on the root, a scratch copy elsewhere; then receive space */
    size_t seg_max = (count + (size_t)nseg - 1) / (size_t)nseg;
    if ((st = req_scratch(r, (v ? bytes : 0) + (size_t)req_nslots(r) * seg_max * esz))) return req_abandon(r, st);
    char *acc = v ? r->scratch : recvbuf, *rbuf = (char *)r->scratch + (v ? bytes : 0);
    if (bytes && acc != sendbuf) memcpy(acc, sendbuf, bytes);
    for (int s = 0; s < r->nprog; s++) {
        comm_prog *p = &r->progs[s];
        size_t soff, slen;
        comm_part(count, nseg, s, &soff, &slen);
        char *a = acc + soff * esz, *scr = rbuf + (size_t)req_slot(r, s) * seg_max * esz;
        if (tree) {
            for (int mask = 1; mask < n; mask <<= 1) {
                int k = __builtin_ctz((unsigned)mask);
                if (v & mask) { prog_xfer(p, k, REL(v - mask), a, slen * esz, -1, NULL, 0); break; }
                if (v + mask < n) {
                    prog_xfer(p, k, -1, NULL, 0, REL(v + mask), scr, slen * esz);
                    prog_action(p, STEP_REDUCE, a, scr, slen);
                }
            }
        } else {
            if (v < n - 1) {
                prog_xfer(p, 0, -1, NULL, 0, REL(v + 1), scr, slen * esz);
                prog_action(p, STEP_REDUCE, a, scr, slen);
            }
            if (v > 0) prog_xfer(p, 0, REL(v - 1), a, slen * esz, -1, NULL, 0);
        }
        if (!v && op == PDDE_REDUCE_AVG) prog_action(p, STEP_DIV, a, NULL, slen);
    }
#undef REL
    if ((st = req_built(r))) return req_abandon(r, st);
    r->kind = "reduce";
    return comm_start(c, r, tree ? "tree" : "chain", req);
}

/* ------------------------------------------------------------------------------------------------
 * All-to-all: n-1 programs of one exchange each (with me+k and me-k), all in flight at once. */

pdde_status pdde_comm_ialltoallv(pdde_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                                 void *recvbuf, const size_t *recvcounts, const size_t *rdispls, pdde_dtype t,
                                 pdde_comm_request **req) {
    pdde_status st = comm_check(c, t, PDDE_REDUCE_SUM, req);
    if (st) return st;
    COMM_NEED(sendcounts && sdispls && recvcounts && rdispls, "NULL counts or displacements");
    int n = c->size, me = c->rank;
    COMM_NEED(n <= COMM_MAX_SEGMENTS + 1, "more ranks than alltoall supports (256)");
    /* one host: through the shared segment (every rank takes this path whatever its counts) */
    if (comm_shm_takes(c, 1, 1, t, PDDE_REDUCE_SUM))
        return comm_shm_istart(c, comm_shm_alltoallv_op(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t), req);
    /* (the pairwise exchange would write blocks before they are sent) */
    COMM_NEED(n == 1 || sendbuf != recvbuf, "in place (sendbuf == recvbuf) only where all ranks share a host");
    size_t esz = pdde_dtype_size(t);
    const char *in = sendbuf;
    char *out = recvbuf;
    if (recvcounts[me]) {
        COMM_NEED(sendcounts[me] == recvcounts[me], "sendcounts[rank] != recvcounts[rank]");
        memmove(out + rdispls[me] * esz, in + sdispls[me] * esz, recvcounts[me] * esz);
    }
    pdde_comm_request *r = NULL;
    if ((st = req_alloc(c, n - 1, t, PDDE_REDUCE_SUM, &r))) return st;
    for (int k = 1; k < n; k++) {
        int to = mod(me + k, n), from = mod(me - k, n);
        prog_xfer(&r->progs[k - 1], 0, c->ranks[to], in + sdispls[to] * esz, sendcounts[to] * esz, c->ranks[from],
                  out + rdispls[from] * esz, recvcounts[from] * esz);
    }
    if ((st = req_built(r))) return req_abandon(r, st);
    r->kind = "alltoall";
    return comm_start(c, r, "pairwise", req);
}

pdde_status pdde_comm_ialltoall(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t,
                                pdde_comm_request **req) {
    if (!c) return PDDE_ERR_INVALID_ARG;
    size_t *a = malloc(2 * (size_t)c->size * sizeof *a);
    if (!a) return pdde_error(c->w->ctx, PDDE_ERR_OOM, "comm: out of memory");
    for (int i = 0; i < c->size; i++) { a[i] = count; a[c->size + i] = (size_t)i * count; }
    pdde_status st = pdde_comm_ialltoallv(c, sendbuf, a, a + c->size, recvbuf, a, a + c->size, t, req);
    free(a);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Barrier (dissemination: round k, signal me+2^k, hear from me-2^k) and point to point. */

pdde_status pdde_comm_ibarrier(pdde_comm *c, pdde_comm_request **req) {
    pdde_status st = comm_check(c, PDDE_I32, PDDE_REDUCE_SUM, req);
    if (st) return st;
    int n = c->size;
    pdde_comm_request *r = NULL;
    if ((st = req_alloc(c, n > 1, PDDE_I32, PDDE_REDUCE_SUM, &r))) return st;
    for (int k = 0; n > 1 && (1 << k) < n; k++)
        prog_xfer(&r->progs[0], k, c->ranks[mod(c->rank + (1 << k), n)], NULL, 0, c->ranks[mod(c->rank - (1 << k), n)],
                  NULL, 0);
    if ((st = req_built(r))) return req_abandon(r, st);
    r->kind = "barrier";
    return comm_start(c, r, "dissemination", req);
}

static pdde_status comm_p2p(pdde_comm *c, int is_send, void *buf, size_t count, pdde_dtype t, int peer, int tag,
                            pdde_comm_request **req) {
    pdde_status st = comm_check(c, t, PDDE_REDUCE_SUM, req);
    if (st) return st;
    COMM_NEED(peer >= 0 && peer < c->size && peer != c->rank, "peer out of range (or self)");
    COMM_NEED(tag >= 0 && tag < (1 << 20), "tag out of [0, 2^20)");
    COMM_NEED(!count || buf, "NULL buffer");
    pdde_comm_request *r = NULL;
    if ((st = req_alloc(c, 1, t, PDDE_REDUCE_SUM, &r))) return st;
    size_t bytes = count * pdde_dtype_size(t);
    if (is_send) prog_xfer(&r->progs[0], 0, c->ranks[peer], buf, bytes, -1, NULL, 0);
    else prog_xfer(&r->progs[0], 0, -1, NULL, 0, c->ranks[peer], buf, bytes);
    if ((st = req_built(r))) return req_abandon(r, st);
    r->tagbase = COMM_TAG_P2P | (uint64_t)c->id << 28 | (uint64_t)tag << 8;
    r->kind = is_send ? "send" : "recv";
    /* (point-to-point calls may come from several threads at once: the parameter server's client) */
    __atomic_store_n(&c->last_algo, r->kind, __ATOMIC_RELAXED);
    r->peer = c->ranks[peer], r->tag = tag;
    return comm_start(c, r, NULL, req);
}

pdde_status pdde_comm_isend(pdde_comm *c, const void *buf, size_t count, pdde_dtype t, int peer, int tag,
                            pdde_comm_request **req) {
    return comm_p2p(c, 1, (void *)buf, count, t, peer, tag, req);
}
pdde_status pdde_comm_irecv(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int peer, int tag,
                            pdde_comm_request **req) {
    return comm_p2p(c, 0, buf, count, t, peer, tag, req);
}

/* ------------------------------------------------------------------------------------------------
 * Blocking forms (the request is read after the call: argument evaluation order is unspecified) */

/* Blocking allreduce of a few bytes on a power-of-two communicator: the exchanges of recursive
 * doubling run right here, receiving into the caller's stack, with no request, programs or scratch
 * to build (at 8 bytes, building and running the general program cost more than the transfer).
 * The messages (tags, rounds) are exactly those of the general recursive-doubling program, and the
 * wait is req_wait_locked's: progress by the caller, spin then back off, the communicator's timeout,
 * and any failure of the world (found here, by the service thread or by pdde_comm_abort) ends it.
 * COMM_FAST_BYTES stays far below every UCX rendezvous threshold: an eager receive is written only
 * inside ucp_worker_progress, which is never called after a failure, so the stack buffer is safe. */
#define COMM_FAST_BYTES 2048u

static pdde_status comm_allreduce_fast(pdde_comm *c, void *buf, size_t count, pdde_dtype t, pdde_reduce_op op) {
    comm_world *w = c->w;
    const pdde_transport_iface *tp = w->tp;
    _Alignas(16) char tmp[COMM_FAST_BYTES];
    size_t bytes = count * pdde_dtype_size(t);
    c->last_algo = "recursive";
    uint64_t tagbase = (uint64_t)c->id << 28 | (uint64_t)(c->seq++ & 0xfff) << 16;
    pthread_mutex_lock(&w->lock);
    pdde_status st = w->failed;
    w->started++;
    if (!w->watching) pthread_cond_signal(&w->cv); /* see comm_start */
    w->waiters++;
    double start = comm_now(), deadline = start + w->timeout_s, idle_since = start;
    for (int k = 0; (1 << k) < c->size && !st; k++) {
        int peer = c->ranks[c->rank ^ (1 << k)];
        uint64_t tag = tagbase | (uint64_t)(1 + k); /* program 0, round 1 + k (build_rd_allreduce) */
        void *rq = NULL, *sq = NULL;
        st = tp->irecv(w->recv[peer], tmp, bytes, tag, PDDE_MEM_HOST, &rq);
        if (!st) st = tp->isend(w->send[peer], buf, bytes, tag, PDDE_MEM_HOST, &sq);
        if (st) comm_fail(w, st == PDDE_ERR_PEER_LOST ? st : PDDE_ERR_COMM, "rank %d: cannot post a transfer (%s)",
                          w->rank, pdde_status_str(st));
        while (!st && (rq || sq)) {
            int moved = world_progress(w), done = 0;
            pdde_status e = PDDE_OK;
            if (rq && ((e = tp->test(rq, &done, NULL)) || done)) { rq = NULL; moved = 1; }
            if (!e && sq && ((e = tp->test(sq, &done, NULL)) || done)) { sq = NULL; moved = 1; }
            if (e) comm_fail(w, e == PDDE_ERR_PEER_LOST ? e : PDDE_ERR_COMM, "rank %d: connection to rank %d %s",
                             w->rank, peer, e == PDDE_ERR_PEER_LOST ? "lost (peer died?)" : "failed");
            if ((st = w->failed)) break;
            if (!rq && !sq) break;
            double now = comm_now();
            if (moved) idle_since = now;
            if (now >= deadline) {
                comm_fail(w, PDDE_ERR_TIMEOUT, "rank %d: an allreduce (its exchange with rank %d) did not finish within %.3g s",
                          w->rank, peer, w->timeout_s);
                world_progress(w);
                st = PDDE_ERR_TIMEOUT;
                break;
            }
            pthread_mutex_unlock(&w->lock);
            comm_backoff(now - idle_since, deadline - now, w->spin_s);
            pthread_mutex_lock(&w->lock);
        }
        if (rq) tp->cancel(w->tr, rq);
        if (sq) tp->cancel(w->tr, sq);
        if (!st) comm_reduce(buf, tmp, count, t, op);
    }
    w->waiters--;
    pthread_mutex_unlock(&w->lock);
    if (!st && op == PDDE_REDUCE_AVG) comm_divide(buf, count, t, c->size);
    return comm_report(w, st);
}

pdde_status pdde_comm_allreduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t,
                                pdde_reduce_op op) {
    if (comm_shm_takes(c, count, sendbuf && recvbuf, t, op))
        return comm_shm_run(c, comm_shm_allreduce_op(sendbuf, recvbuf, count, t, op));
    if (c && c->size > 1 && !(c->size & (c->size - 1)) && count && sendbuf && recvbuf && (unsigned)t < PDDE_DTYPE_COUNT &&
        (unsigned)op <= PDDE_REDUCE_MIN && count * pdde_dtype_size(t) <= COMM_FAST_BYTES &&
        (c->algo == PDDE_ALGO_AUTO || c->algo == PDDE_ALGO_RECURSIVE)) {
        if (sendbuf != recvbuf) memcpy(recvbuf, sendbuf, count * pdde_dtype_size(t));
        return comm_allreduce_fast(c, recvbuf, count, t, op);
    }
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_iallreduce(c, sendbuf, recvbuf, count, t, op, &r);
    return comm_finish(c, st, r);
}
pdde_status pdde_comm_reduce_scatter(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount, pdde_dtype t,
                                     pdde_reduce_op op) {
    if (comm_shm_takes(c, recvcount, sendbuf && recvbuf, t, op))
        return comm_shm_run(c, comm_shm_reduce_scatter_op(sendbuf, recvbuf, recvcount, t, op));
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_ireduce_scatter(c, sendbuf, recvbuf, recvcount, t, op, &r);
    return comm_finish(c, st, r);
}
pdde_status pdde_comm_allgather(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount, pdde_dtype t) {
    if (comm_shm_takes(c, sendcount, sendbuf && recvbuf, t, PDDE_REDUCE_SUM))
        return comm_shm_run(c, comm_shm_allgather_op(sendbuf, recvbuf, sendcount, t));
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_iallgather(c, sendbuf, recvbuf, sendcount, t, &r);
    return comm_finish(c, st, r);
}
pdde_status pdde_comm_broadcast(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int root) {
    if (comm_shm_takes(c, count, buf != NULL, t, PDDE_REDUCE_SUM) && root >= 0 && root < c->size)
        return comm_shm_run(c, comm_shm_broadcast_op(buf, count, t, root));
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_ibroadcast(c, buf, count, t, root, &r);
    return comm_finish(c, st, r);
}
pdde_status pdde_comm_reduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t,
                             pdde_reduce_op op, int root) {
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_ireduce(c, sendbuf, recvbuf, count, t, op, root, &r);
    return comm_finish(c, st, r);
}
/* the flat blocking all-to-all(v); alltoall_hier.c's public calls take them or the hierarchical form */
static pdde_status comm_alltoall_flat(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t) {
    if (comm_shm_takes(c, 1, 1, t, PDDE_REDUCE_SUM) && c->size <= 64) {
        size_t a[4 * 64];
        for (int i = 0; i < c->size; i++) a[i] = count, a[64 + i] = (size_t)i * count;
        return comm_shm_run(c, comm_shm_alltoallv_op(sendbuf, a, a + 64, recvbuf, a, a + 64, t));
    }
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_ialltoall(c, sendbuf, recvbuf, count, t, &r);
    return comm_finish(c, st, r);
}
static pdde_status comm_alltoallv_flat(pdde_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                                       void *recvbuf, const size_t *recvcounts, const size_t *rdispls, pdde_dtype t) {
    if (comm_shm_takes(c, 1, 1, t, PDDE_REDUCE_SUM)) {
        if (!sendcounts || !sdispls || !recvcounts || !rdispls)
            return pdde_error(c->w->ctx, PDDE_ERR_INVALID_ARG, "pdde_comm_alltoallv: NULL counts or displacements");
        return comm_shm_run(c, comm_shm_alltoallv_op(sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t));
    }
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_ialltoallv(c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t, &r);
    return comm_finish(c, st, r);
}
pdde_status pdde_comm_barrier(pdde_comm *c) {
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_ibarrier(c, &r);
    return comm_finish(c, st, r);
}
pdde_status pdde_comm_send(pdde_comm *c, const void *buf, size_t count, pdde_dtype t, int peer, int tag) {
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_isend(c, buf, count, t, peer, tag, &r);
    return comm_finish(c, st, r);
}
pdde_status pdde_comm_recv(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int peer, int tag) {
    pdde_comm_request *r = NULL;
    comm_blocking_call = 1;
    pdde_status st = pdde_comm_irecv(c, buf, count, t, peer, tag, &r);
    return comm_finish(c, st, r);
}

#endif /* PDDE_COMM_COLLECTIVES_C */
