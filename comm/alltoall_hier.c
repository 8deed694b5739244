/* comm/alltoall_hier.c — the blocking all-to-all(v) calls, and the hierarchical all-to-all they take
 * on a communicator that spans H > 1 hosts with the same number L > 1 of its ranks on each. The flat
 * exchange sends every rank's L (H-1) messages to other hosts; this one sends H-1, each L times larger:
 *   0. within each host, the counts: local rank j tells local rank j' what it sends to (h', j') for
 *      every host h' (an all-to-all of H integers a pair);
 *   1. within each host (shared memory), local rank j' collects everything its host sends to the
 *      ranks with local index j' (rank (h, j) packs its blocks by destination local index);
 *   2. across hosts, the ranks with one local index exchange: (h, j') sends (h', j') the L blocks its
 *      host's ranks send there, in local order (a transpose of what stage 1 brought in);
 *   then the receiver's blocks go to their places (received in place where they are laid out host by
 *   host, as the executor's are). Only the host's ranks' own sub-communicators run the stages, on the
 *   flat calls; they are made at the first hierarchical exchange (every rank takes it at the same
 *   call) and kept with the communicator. Data is moved, never combined: the result equals the flat
 *   exchange's bit for bit.
 *
 * The choice (PDDE_COMM_A2A_HIER=0|1, unset: pdde.h's PDDE_COMM_A2A_HIER_BYTES rule on the mean
 * message of a rank pair) must be the same on every rank: alltoall's count is; alltoallv's mean is
 * agreed by a sum of the ranks' bytes first (one small allreduce). */

#ifndef PDDE_COMM_ALLTOALL_HIER_C
#define PDDE_COMM_ALLTOALL_HIER_C

#include "comm.c"

/* PDDE_COMM_A2A_HIER: -1 unset or empty (auto), 0, 1; anything else is auto too (said once) */
static int a2a_hier_env(void) { return pdde_env_bool("PDDE_COMM_A2A_HIER", -1); }

/* The state of c: host and local index of each rank (hosts in order of first appearance, as
 * comm_topology counts them). NULL where the hierarchical form cannot run (one host, one rank a host,
 * unequal hosts) or it is off. */
static comm_a2a_hier *a2a_hier_state(pdde_comm *c) {
    if (c->a2a) return c->a2a->mode ? c->a2a : NULL;
    if (c->n_hosts < 2 || !c->local_equal || c->local_n < 2) return NULL;
    comm_a2a_hier *a = calloc(1, sizeof *a);
    int n = c->size;
    if (!a) return NULL;
    a->mode = a2a_hier_env();
    a->hosts = c->n_hosts, a->local = c->local_n;
    a->host_idx = malloc((size_t)n * sizeof(int)), a->local_idx = malloc((size_t)n * sizeof(int));
    a->rank_at = malloc((size_t)n * sizeof(int));
    int *first = malloc((size_t)c->w->size * sizeof(int)), *seen = calloc((size_t)a->hosts, sizeof(int));
    if (!a->host_idx || !a->local_idx || !a->rank_at || !first || !seen) {
        free(a->host_idx), free(a->local_idx), free(a->rank_at), free(a), free(first), free(seen);
        return NULL; /* (the flat exchange then runs) */
    }
    for (int i = 0; i < c->w->size; i++) first[i] = -1;
    int hosts = 0;
    for (int r = 0; r < n; r++) {
        int wh = c->w->host_of[c->ranks[r]];
        if (first[wh] < 0) first[wh] = hosts++;
        int h = first[wh];
        a->host_idx[r] = h, a->local_idx[r] = seen[h]++;
        a->rank_at[h * a->local + a->local_idx[r]] = r;
    }
    free(first), free(seen);
    c->a2a = a;
    return a->mode ? a : NULL;
}

/* The sub-communicators, made once (collective over c: every rank is here at the same call). */
static pdde_status a2a_hier_comms(pdde_comm *c, comm_a2a_hier *a) {
    if (a->local_comm && a->cross_comm) return PDDE_OK;
    pdde_status st = pdde_comm_split(c, a->host_idx[c->rank], c->rank, &a->local_comm);
    if (!st) st = pdde_comm_split(c, a->local_idx[c->rank], a->host_idx[c->rank], &a->cross_comm);
    if (st) {
        pdde_comm_free(a->local_comm), pdde_comm_free(a->cross_comm);
        a->local_comm = a->cross_comm = NULL;
        return pdde_error(c->w->ctx, st, "alltoallv (hierarchical): making the host and cross-host communicators: %s", pdde_last_error(c->w->ctx));
    }
    return PDDE_OK;
}

/* Whether the hierarchical form pays, by pdde.h's rule: mean_bytes is the mean message of a pair. */
static int a2a_hier_pays(const comm_a2a_hier *a, double mean_bytes) {
    return a->mode == 1 || mean_bytes <= PDDE_COMM_A2A_HIER_BYTES(a->hosts, a->local);
}

/* The exchange itself (a: c's state, its communicators made). Counts and displacements in elements. */
static pdde_status a2a_hier_run(pdde_comm *c, comm_a2a_hier *a, const void *sendbuf, const size_t *sc, const size_t *sd,
                                void *recvbuf, const size_t *rc, const size_t *rd, pdde_dtype t) {
    pdde_context *ctx = c->w->ctx;
    int H = a->hosts, L = a->local, me = c->rank, h0 = a->host_idx[me];
    size_t esz = pdde_dtype_size(t);
    const char *in = sendbuf;
    char *out = recvbuf;
    /* stage 0: cnt_out[j' H + h'] = what I send (h', j'); cnt_in[s H + h'] = what local s sends (h', me's j) */
    int64_t *cnt_out = malloc(2 * (size_t)L * H * sizeof *cnt_out), *cnt_in = cnt_out + (size_t)L * H;
    size_t *v = malloc(8 * (size_t)(L > H ? L : H) * sizeof *v); /* the stages' counts and displacements */
    char *buf = NULL;
    pdde_status st = cnt_out && v ? PDDE_OK : pdde_error(ctx, PDDE_ERR_OOM, "alltoallv (hierarchical): out of memory");
    for (int j = 0; j < L && !st; j++)
        for (int h = 0; h < H; h++) cnt_out[j * H + h] = (int64_t)sc[a->rank_at[h * L + j]];
    if (!st && (st = pdde_comm_alltoall(a->local_comm, cnt_out, cnt_in, (size_t)H, PDDE_I64)))
        st = pdde_error(ctx, st, "alltoallv (hierarchical): the counts within host %d: %s", h0, pdde_last_error(ctx));
    size_t n_send = 0, n_mid = 0, n_recv = 0;
    for (int i = 0; i < L * H && !st; i++) n_send += (size_t)cnt_out[i], n_mid += (size_t)cnt_in[i];
    for (int r = 0; r < c->size && !st; r++) n_recv += rc[r];
    /* where the blocks of each host's ranks lie one after another in recvbuf, stage 2 lands in place */
    int direct = 1;
    for (int h = 0; h < H && direct; h++) {
        size_t pos = SIZE_MAX;
        for (int j = 0; j < L && direct; j++) {
            int r = a->rank_at[h * L + j];
            if (!rc[r]) continue;
            direct = pos == SIZE_MAX || rd[r] == pos;
            pos = rd[r] + rc[r];
        }
    }
    size_t total = n_send + 2 * n_mid + (direct ? 0 : n_recv);
    if (!st && total && !(buf = malloc(total * esz))) st = pdde_error(ctx, PDDE_ERR_OOM, "alltoallv (hierarchical): out of memory for %zu bytes", total * esz);
    char *pack = buf, *mid = buf + n_send * esz, *tr = mid + n_mid * esz, *land = tr + n_mid * esz;
    size_t *c1 = v, *d1 = v + L, *c1r = v + 2 * L, *d1r = v + 3 * L;
    if (!st) { /* stage 1: pack by destination local index, then host */
        size_t o = 0, oi = 0;
        for (int j = 0; j < L; j++) {
            c1[j] = 0, d1[j] = o, c1r[j] = 0, d1r[j] = oi;
            for (int h = 0; h < H; h++) {
                size_t k = (size_t)cnt_out[j * H + h];
                if (k) memcpy(pack + o * esz, in + sd[a->rank_at[h * L + j]] * esz, k * esz);
                o += k, c1[j] += k;
                c1r[j] += (size_t)cnt_in[j * H + h];
            }
            oi += c1r[j];
        }
        if ((st = pdde_comm_alltoallv(a->local_comm, pack, c1, d1, mid, c1r, d1r, t)))
            st = pdde_error(ctx, st, "alltoallv (hierarchical): the exchange within host %d: %s", h0, pdde_last_error(ctx));
    }
    size_t *c2 = v, *d2 = v + H, *c2r = v + 2 * H, *d2r = v + 3 * H;
    if (!st) { /* transpose: mid holds [local s][host h'], stage 2 sends [host h'][local s] */
        size_t *at = v + 4 * H; /* (v's first 4 L are free again) where local s's block of host 0 starts in mid */
        size_t o = 0;
        for (int s = 0; s < L; s++) {
            at[s] = o;
            for (int h = 0; h < H; h++) o += (size_t)cnt_in[s * H + h];
        }
        o = 0;
        for (int h = 0; h < H; h++) {
            c2[h] = 0, d2[h] = o;
            for (int s = 0; s < L; s++) {
                size_t k = (size_t)cnt_in[s * H + h];
                if (k) memcpy(tr + o * esz, mid + at[s] * esz, k * esz);
                at[s] += k, o += k, c2[h] += k;
            }
        }
        size_t oi = 0;
        for (int h = 0; h < H; h++) { /* from (h, my j): what host h's ranks send me, in local order */
            c2r[h] = 0;
            for (int s = 0; s < L; s++) c2r[h] += rc[a->rank_at[h * L + s]];
            size_t first = 0;
            for (int s = 0; s < L && direct; s++)
                if (rc[a->rank_at[h * L + s]]) { first = rd[a->rank_at[h * L + s]]; break; }
            d2r[h] = direct ? first : oi;
            oi += c2r[h];
        }
        if ((st = pdde_comm_alltoallv(a->cross_comm, tr, c2, d2, direct ? out : land, c2r, d2r, t)))
            st = pdde_error(ctx, st, "alltoallv (hierarchical): the exchange across hosts (local rank %d's): %s", a->local_idx[me],
                            pdde_last_error(ctx));
    }
    if (!st && !direct) { /* each source's block to its place */
        for (int h = 0; h < H; h++) {
            size_t o = d2r[h];
            for (int s = 0; s < L; s++) {
                int r = a->rank_at[h * L + s];
                if (rc[r]) memcpy(out + rd[r] * esz, land + o * esz, rc[r] * esz);
                o += rc[r];
            }
        }
    }
    free(buf), free(v), free(cnt_out);
    c->last_algo = "hierarchical";
    return st;
}

/* Runs alltoallv hierarchically when c's hosts allow it and the rule picks it (*ran = 1), else leaves
 * it to the flat call (*ran = 0). Every rank decides alike (see the top). */
static pdde_status a2a_hier_try(pdde_comm *c, const void *sendbuf, const size_t *sc, const size_t *sd, void *recvbuf, const size_t *rc,
                                const size_t *rd, pdde_dtype t, int equal, int *ran) {
    *ran = 0;
    if (!c || !sc || !sd || !rc || !rd || (unsigned)t >= PDDE_DTYPE_COUNT) return PDDE_OK; /* (the flat call says why) */
    comm_a2a_hier *a = a2a_hier_state(c);
    if (!a) return PDDE_OK;
    int n = c->size, me = c->rank;
    size_t esz = pdde_dtype_size(t);
    if (rc[me] && sc[me] != rc[me]) return PDDE_OK; /* (the flat call's error) */
    double mean = (double)sc[0] * (double)esz; /* alltoall: every pair's message */
    pdde_status st;
    if (a->mode < 0 && !equal) {
        int64_t mine = 0, all = 0;
        for (int r = 0; r < n; r++) mine += (int64_t)(sc[r] * esz);
        if ((st = pdde_comm_allreduce(c, &mine, &all, 1, PDDE_I64, PDDE_REDUCE_SUM))) return st;
        mean = (double)all / ((double)n * n);
    }
    if (!a2a_hier_pays(a, mean)) return PDDE_OK;
    *ran = 1;
    if ((st = a2a_hier_comms(c, a))) return st;
    return a2a_hier_run(c, a, sendbuf, sc, sd, recvbuf, rc, rd, t);
}

pdde_status pdde_comm_alltoallv(pdde_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls,
                                void *recvbuf, const size_t *recvcounts, const size_t *rdispls, pdde_dtype t) {
    int ran = 0;
    pdde_status st = a2a_hier_try(c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t, 0, &ran);
    if (st || ran) return st;
    return comm_alltoallv_flat(c, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls, t);
}

pdde_status pdde_comm_alltoall(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t) {
    comm_a2a_hier *a = c ? a2a_hier_state(c) : NULL;
    if (a) {
        int n = c->size, ran = 0;
        size_t *v = malloc(2 * (size_t)n * sizeof *v);
        if (!v) return pdde_error(c->w->ctx, PDDE_ERR_OOM, "alltoall: out of memory");
        for (int r = 0; r < n; r++) v[r] = count, v[n + r] = (size_t)r * count;
        pdde_status st = a2a_hier_try(c, sendbuf, v, v + n, recvbuf, v, v + n, t, 1, &ran);
        free(v);
        if (st || ran) return st;
    }
    return comm_alltoall_flat(c, sendbuf, recvbuf, count, t);
}

#endif /* PDDE_COMM_ALLTOALL_HIER_C */
