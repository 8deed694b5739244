/* core/ps_worker.c — the worker side of parameter-server tables: sparse embeddings in a graph.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

#ifdef PDDE_HAVE_PS /* (comm/ps.c is there: the table and its in-process client, with or without comm/) */
/* ================================================================================================
 * Sparse tables in a graph: the worker side of parameter-server tables. A batch's unique ids are
 * pulled into a local [U, dim] table, the ids remapped to its rows, the embedding op and bag pooling
 * run over it, the rows' gradients are pushed back. It joins the graph and session (core) to the
 * client (comm/), which neither of them may know about, so it lives here, above both. */

struct pdde_sparse_embedding {
    pdde_tensor *table;        /* [U, dim] PDDE_TENSOR_SPARSE parameter */
    pdde_tensor *ids;          /* i32 [batch, fields, bag]: rows of table */
    pdde_tensor *weights;      /* f32 [batch, fields, bag, 1] (bag > 1): 1 or 1/count, 0 on empty slots */
    int64_t batch, slots, rows; /* slots = batch x fields x bag; rows = slots + 1 (a batch of U unique ids: rows
                                * 0..U-1 theirs, row U zeros for the empty slots) */
    int fields, bag, dim;
    pdde_pooling pool;
};

struct pdde_sparse_batch {
    const pdde_sparse_embedding *e;
    ps_map index;              /* id -> local row, rebuilt per batch */
    uint64_t *unique;          /* the batch's ids, in first-seen order */
    int64_t n_unique;
    int32_t *local;            /* [slots] local rows */
    float *weights;            /* [slots] (bag > 1) */
    float *rows;               /* [rows, dim]: the pulled rows, then (collect) their gradients */
    /* dense parameters held on the servers (pdde_sparse_batch_hold_dense): each is ceil(numel / dim)
     * rows of the table, with ids PDDE_PS_DENSE_IDS | parameter << 32 | row */
    int n_dense;
    pdde_tensor **dense;       /* the session's non-sparse parameters with a gradient */
    int64_t *dense_row0;       /* each one's first row */
    int64_t dense_rows;
    uint64_t *dense_ids;       /* [dense_rows] */
    float *dense_vals;         /* [dense_rows, dim]: pulled values, then (collect) gradients */
    uint64_t *push_ids;        /* [slots + dense_rows]: a push of both in one request (one clock tick) */
    float *push_vals;
};

pdde_tensor *pdde_sparse_embedding_init(pdde_graph *g, const char *name, int64_t batch, int fields, int bag, int dim,
                                       pdde_pooling pool, pdde_sparse_embedding **out) {
    if (out) *out = NULL;
    if (!g || g->status) return NULL;
    if (!name || !out) return graph_fail(g, PDDE_ERR_INVALID_ARG, "pdde_sparse_embedding_init: no %s", name ? "out" : "name");
    if (batch <= 0 || fields <= 0 || bag <= 0 || dim <= 0 || (unsigned)pool > PDDE_POOL_MEAN || batch * fields * bag >= INT32_MAX)
        return graph_fail(g, PDDE_ERR_INVALID_ARG, "sparse embedding %s: batch %lld, fields %d, bag %d, dim %d, pooling %d",
                          name, (long long)batch, fields, bag, dim, (int)pool);
    pdde_sparse_embedding *e = calloc(1, sizeof *e);
    if (!e) return graph_fail(g, PDDE_ERR_OOM, "sparse embedding %s: out of memory", name);
    e->batch = batch, e->fields = fields, e->bag = bag, e->dim = dim, e->pool = pool;
    e->slots = batch * fields * bag, e->rows = e->slots + 1;
    char nm[64];
    snprintf(nm, sizeof nm, "%s.rows", name);
    e->table = pdde_param(g, nm, 2, (int64_t[]){e->rows, dim}, 0.0f);
    snprintf(nm, sizeof nm, "%s.ids", name);
    e->ids = pdde_input(g, nm, PDDE_I32, 3, (int64_t[]){batch, fields, bag});
    if (e->table) e->table->flags |= PDDE_TENSOR_SPARSE;
    pdde_tensor *y = pdde_embedding(g, e->table, e->ids); /* [batch, fields, bag, dim] */
    if (bag > 1) {
        snprintf(nm, sizeof nm, "%s.weights", name);
        e->weights = pdde_input(g, nm, PDDE_F32, 4, (int64_t[]){batch, fields, bag, 1});
        y = pdde_sum(g, pdde_mul(g, y, e->weights), 2, 0);
    } else y = pdde_reshape(g, y, 3, (int64_t[]){batch, fields, dim});
    if (!y) { free(e); return NULL; }
    *out = e;
    return y;
}

void pdde_sparse_embedding_free(pdde_sparse_embedding *e) { free(e); }

pdde_status pdde_sparse_batch_init(const pdde_sparse_embedding *e, pdde_sparse_batch **out) {
    if (!e || !out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    pdde_sparse_batch *b = calloc(1, sizeof *b);
    if (!b) return PDDE_ERR_OOM;
    b->e = e;
    b->unique = malloc((size_t)e->slots * sizeof *b->unique);
    b->local = malloc((size_t)e->slots * sizeof *b->local);
    b->weights = e->bag > 1 ? malloc((size_t)e->slots * sizeof *b->weights) : NULL;
    b->rows = malloc((size_t)e->rows * e->dim * sizeof *b->rows);
    if (!b->unique || !b->local || !b->rows || (e->bag > 1 && !b->weights)) { pdde_sparse_batch_free(b); return PDDE_ERR_OOM; }
    *out = b;
    return PDDE_OK;
}

void pdde_sparse_batch_free(pdde_sparse_batch *b) {
    if (!b) return;
    ps_map_free(&b->index);
    free(b->unique), free(b->local), free(b->weights), free(b->rows);
    free(b->dense), free(b->dense_row0), free(b->dense_ids), free(b->dense_vals), free(b->push_ids), free(b->push_vals);
    free(b);
}

int64_t pdde_sparse_batch_unique_count(const pdde_sparse_batch *b) { return b ? b->n_unique : 0; }

pdde_status pdde_sparse_batch_pull(pdde_sparse_batch *b, pdde_ps_client *c, const uint64_t *ids) {
    if (!b || !c || !ids) return pdde_error(c ? c->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_sparse_batch_pull: no %s", !b ? "batch" : !c ? "client" : "ids");
    const pdde_sparse_embedding *e = b->e;
    b->n_unique = 0;
    if (b->index.cap) memset(b->index.vals, 0xff, b->index.cap * sizeof *b->index.vals), b->index.n = 0;
    for (int64_t i = 0; i < e->slots; i++) {
        if (ids[i] == PDDE_SPARSE_NO_ID) { b->local[i] = -1; continue; }
        bool added;
        uint32_t *r = ps_map_find_or_insert(&b->index, ids[i], (uint32_t)b->n_unique, &added);
        if (!r) return pdde_error(c->ctx, PDDE_ERR_OOM, "sparse batch: out of memory");
        if (added) b->unique[b->n_unique++] = ids[i];
        b->local[i] = (int32_t)*r;
    }
    /* the empty slots read row n_unique, zeros: feed writes the batch's rows and it in one piece */
    int32_t empty = (int32_t)b->n_unique;
    for (int64_t i = 0; i < e->slots; i++)
        if (b->local[i] < 0) b->local[i] = empty;
    memset(b->rows + b->n_unique * e->dim, 0, (size_t)e->dim * sizeof *b->rows);
    if (e->bag > 1)
        for (int64_t s = 0; s < e->slots; s += e->bag) { /* one bag */
            int n = 0;
            for (int k = 0; k < e->bag; k++) n += b->local[s + k] != empty;
            for (int k = 0; k < e->bag; k++)
                b->weights[s + k] = b->local[s + k] == empty ? 0.0f : e->pool == PDDE_POOL_MEAN ? 1.0f / (float)n : 1.0f;
        }
    pdde_status st = pdde_ps_client_pull(c, (size_t)b->n_unique, b->unique, b->rows);
    if (!st && b->n_dense) st = pdde_ps_client_pull(c, (size_t)b->dense_rows, b->dense_ids, b->dense_vals);
    return st;
}

pdde_status pdde_sparse_batch_feed(pdde_sparse_batch *b, pdde_session *s) {
    if (!b || !s) return pdde_error(s ? s->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_sparse_batch_feed: no %s", s ? "batch" : "session");
    const pdde_sparse_embedding *e = b->e;
    size_t row_bytes = (size_t)e->dim * sizeof(float);
    /* only the rows the batch reads: its n_unique rows and the empty slots' zero row after them; no id refers to
     * the rows past those, which keep what an earlier batch left there */
    pdde_status st = write_first(s, e->table, (size_t)e->rows * row_bytes, b->rows, (size_t)(b->n_unique + 1) * row_bytes, "sparse batch feed");
    if (!st) st = pdde_session_write(s, e->ids, b->local, (size_t)e->slots * sizeof(int32_t));
    if (!st && e->weights) st = pdde_session_write(s, e->weights, b->weights, (size_t)e->slots * sizeof(float));
    for (int i = 0; i < b->n_dense && !st; i++)
        st = pdde_session_write(s, b->dense[i], b->dense_vals + b->dense_row0[i] * e->dim, pdde_tensor_nbytes(b->dense[i]));
    return st;
}

pdde_status pdde_sparse_batch_collect(pdde_sparse_batch *b, pdde_session *s) {
    if (!b || !s) return pdde_error(s ? s->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_sparse_batch_collect: no %s", s ? "batch" : "session");
    const pdde_sparse_embedding *e = b->e;
    size_t bytes = (size_t)e->rows * e->dim * sizeof(float);
    if (!e->table->grad) return pdde_error(s->ctx, PDDE_ERR_STATE, "sparse batch: %s has no gradient (pdde_backward not called, or the loss does not use it)", e->table->name);
    pdde_tensor *lt = NULL;
    pdde_status st = check_io(s, e->table->grad, bytes, "sparse batch collect", &lt);
    /* only the batch's rows are pushed: the rest (the empty slots' row after them, rows no id refers to) stay unread */
    if (!st && b->n_unique) st = read_local(s, lt, b->rows, (size_t)b->n_unique * e->dim * sizeof(float));
    /* the accumulator is the optimizers' to zero, and they skip sparse tables (and the graph of a
     * model whose dense parameters live on the servers has no optimizer): zeroed where it lives */
    if (!st) st = zero_bound(s, lt);
    for (int i = 0; i < b->n_dense && !st; i++) {
        pdde_tensor *g = b->dense[i]->grad;
        float *dst = b->dense_vals + b->dense_row0[i] * e->dim;
        int64_t n = pdde_tensor_numel(g), end = (i + 1 < b->n_dense ? b->dense_row0[i + 1] : b->dense_rows) * e->dim - b->dense_row0[i] * e->dim;
        st = check_io(s, g, pdde_tensor_nbytes(g), "sparse batch collect", &lt);
        if (!st) st = read_local(s, lt, dst, pdde_tensor_nbytes(g));
        memset(dst + n, 0, (size_t)(end - n) * sizeof *dst); /* the last row's padding has no gradient */
        if (!st) st = zero_bound(s, lt);
    }
    return st;
}

pdde_status pdde_sparse_batch_push(pdde_sparse_batch *b, pdde_ps_client *c) {
    if (!b || !c) return pdde_error(c ? c->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_sparse_batch_push: no %s", c ? "batch" : "client");
    if (!b->n_dense) return pdde_ps_client_push(c, (size_t)b->n_unique, b->unique, b->rows);
    size_t C = (size_t)b->e->dim, U = (size_t)b->n_unique;
    memcpy(b->push_ids, b->unique, U * sizeof *b->push_ids);
    memcpy(b->push_ids + U, b->dense_ids, (size_t)b->dense_rows * sizeof *b->push_ids);
    memcpy(b->push_vals, b->rows, U * C * sizeof *b->push_vals);
    memcpy(b->push_vals + U * C, b->dense_vals, (size_t)b->dense_rows * C * sizeof *b->push_vals);
    return pdde_ps_client_push(c, U + (size_t)b->dense_rows, b->push_ids, b->push_vals);
}

pdde_status pdde_sparse_batch_hold_dense(pdde_sparse_batch *b, pdde_session *s, pdde_ps_client *c, int seed) {
    if (!b || !s || (seed && !c)) return pdde_error(s ? s->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_sparse_batch_hold_dense: no %s", !b ? "batch" : !s ? "session" : "client");
    const pdde_sparse_embedding *e = b->e;
    pdde_graph *g = s->g;
    if (b->n_dense) return pdde_error(s->ctx, PDDE_ERR_STATE, "sparse batch: holds its dense parameters on the servers already");
    int n = 0;
    int64_t rows = 0;
    for (int i = 0; i < g->n; i++) {
        pdde_tensor *t = g->nodes[i];
        if (!(t->flags & PDDE_TENSOR_PARAM) || (t->flags & PDDE_TENSOR_SPARSE) || !t->grad) continue;
        if (t->dtype != PDDE_F32) return pdde_error(s->ctx, PDDE_ERR_DTYPE, "sparse batch: dense parameter %s on the servers must be f32", t->name);
        if (n >= 1 << 24) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "sparse batch: more than 2^24 dense parameters");
        int64_t k = (pdde_tensor_numel(t) + e->dim - 1) / e->dim;
        if (k >= (int64_t)1 << 32) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "sparse batch: %s has more than 2^32 rows of %d", t->name, e->dim);
        n++, rows += k;
    }
    if (!n) return PDDE_OK;
    b->dense = malloc((size_t)n * sizeof *b->dense), b->dense_row0 = malloc((size_t)n * sizeof *b->dense_row0);
    b->dense_ids = malloc((size_t)rows * sizeof *b->dense_ids), b->dense_vals = calloc((size_t)rows * e->dim, sizeof *b->dense_vals);
    b->push_ids = malloc((size_t)(e->slots + rows) * sizeof *b->push_ids);
    b->push_vals = malloc((size_t)(e->slots + rows) * e->dim * sizeof *b->push_vals);
    if (!b->dense || !b->dense_row0 || !b->dense_ids || !b->dense_vals || !b->push_ids || !b->push_vals)
        return pdde_error(s->ctx, PDDE_ERR_OOM, "sparse batch: out of memory (%lld dense rows)", (long long)rows);
    int k = 0;
    int64_t r = 0;
    pdde_status st = PDDE_OK;
    for (int i = 0; i < g->n && !st; i++) {
        pdde_tensor *t = g->nodes[i];
        if (!(t->flags & PDDE_TENSOR_PARAM) || (t->flags & PDDE_TENSOR_SPARSE) || !t->grad) continue;
        int64_t m = (pdde_tensor_numel(t) + e->dim - 1) / e->dim;
        b->dense[k] = t, b->dense_row0[k] = r;
        for (int64_t j = 0; j < m; j++) b->dense_ids[r + j] = PDDE_PS_DENSE_IDS | (uint64_t)k << 32 | (uint64_t)j;
        if (seed) st = pdde_session_read(s, t, b->dense_vals + r * e->dim, pdde_tensor_nbytes(t));
        k++, r += m;
    }
    b->n_dense = n, b->dense_rows = rows;
    if (!st && seed) st = pdde_ps_client_set(c, (size_t)rows, b->dense_ids, b->dense_vals);
    return st;
}

pdde_status pdde_sparse_allreduce_dense(pdde_session *s, pdde_comm *comm) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    pdde_graph *g = s->g;
    size_t total = 0;
    for (int i = 0; i < g->n; i++) {
        pdde_tensor *t = g->nodes[i];
        if ((t->flags & PDDE_TENSOR_PARAM) && !(t->flags & PDDE_TENSOR_SPARSE) && t->grad) total += (size_t)pdde_tensor_numel(t);
    }
    if (!total || !comm || pdde_comm_size(comm) == 1) return PDDE_OK;
    float *buf = malloc(total * sizeof *buf);
    if (!buf) return pdde_error(s->ctx, PDDE_ERR_OOM, "dense allreduce: out of memory (%zu floats)", total);
    pdde_status st = PDDE_OK;
    size_t off = 0;
    for (int i = 0; i < g->n && !st; i++) {
        pdde_tensor *t = g->nodes[i];
        if (!(t->flags & PDDE_TENSOR_PARAM) || (t->flags & PDDE_TENSOR_SPARSE) || !t->grad) continue;
        st = pdde_session_read(s, t->grad, buf + off, pdde_tensor_nbytes(t->grad));
        off += (size_t)pdde_tensor_numel(t);
    }
    if (!st) st = pdde_comm_allreduce(comm, buf, buf, total, PDDE_F32, PDDE_REDUCE_AVG);
    off = 0;
    for (int i = 0; i < g->n && !st; i++) {
        pdde_tensor *t = g->nodes[i];
        if (!(t->flags & PDDE_TENSOR_PARAM) || (t->flags & PDDE_TENSOR_SPARSE) || !t->grad) continue;
        st = pdde_session_write(s, t->grad, buf + off, pdde_tensor_nbytes(t->grad));
        off += (size_t)pdde_tensor_numel(t);
    }
    free(buf);
    return st;
}
#endif

#ifndef PDDE_HAVE_COMM /* no comm/: every call of its part of pdde.h links and says so */

static pdde_status comm_unavailable(pdde_context *ctx, const char *fn) {
    return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "%s: pdde was built without communication (comm/ needs UCX; PDDE_HAVE_UCX, "
                      "no PDDE_NO_COMM; pdde_features() says what a build has)", fn);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
/* (the hashes have no status to return: they give zeros, which no real digest is) */
void pdde_comm_abort(pdde_comm *comm) {  }
pdde_status pdde_comm_allgather(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount, pdde_dtype t) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_allreduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t, pdde_reduce_op op) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_alltoall(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_alltoallv(pdde_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls, void *recvbuf, const size_t *recvcounts, const size_t *rdispls, pdde_dtype t) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_barrier(pdde_comm *c) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_broadcast(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int root) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_buffer_alloc(pdde_comm *c, size_t bytes, void **out) { if (out) *out = NULL; return comm_unavailable(NULL, __func__); }
void pdde_comm_buffer_free(void *buf) {  }
pdde_context *pdde_comm_context(const pdde_comm *comm) { return NULL; }
pdde_status pdde_comm_env_read(pdde_context *ctx, pdde_comm_env *out) { return comm_unavailable(ctx, __func__); }
void pdde_comm_free(pdde_comm *comm) {  }
pdde_status pdde_comm_iallgather(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount, pdde_dtype t, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_iallreduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t, pdde_reduce_op op, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_ialltoall(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_ialltoallv(pdde_comm *c, const void *sendbuf, const size_t *sendcounts, const size_t *sdispls, void *recvbuf, const size_t *recvcounts, const size_t *rdispls, pdde_dtype t, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_ibarrier(pdde_comm *c, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_ibroadcast(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int root, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_init(pdde_context *ctx, const pdde_comm_params *params, pdde_comm **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
pdde_status pdde_comm_irecv(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int peer, int tag, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_ireduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t, pdde_reduce_op op, int root, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_ireduce_scatter(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount, pdde_dtype t, pdde_reduce_op op, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_isend(pdde_comm *c, const void *buf, size_t count, pdde_dtype t, int peer, int tag, pdde_comm_request **req) { if (req) *req = NULL; return comm_unavailable(NULL, __func__); }
const char *pdde_comm_last_algo(const pdde_comm *comm) { return NULL; }
int pdde_comm_host_count(const pdde_comm *comm) { return 0; }
int pdde_comm_rank(const pdde_comm *comm) { return 0; }
pdde_status pdde_comm_recv(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int peer, int tag) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_reduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t, pdde_reduce_op op, int root) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_reduce_scatter(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount, pdde_dtype t, pdde_reduce_op op) { return comm_unavailable(NULL, __func__); }
void pdde_comm_request_free(pdde_comm_request *req) {  }
pdde_status pdde_comm_send(pdde_comm *c, const void *buf, size_t count, pdde_dtype t, int peer, int tag) { return comm_unavailable(NULL, __func__); }
void pdde_comm_set_algo(pdde_comm *comm, pdde_comm_algo algo) {  }
int pdde_comm_size(const pdde_comm *comm) { return 0; }
pdde_status pdde_comm_split(pdde_comm *comm, int color, int key, pdde_comm **out) { if (out) *out = NULL; return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_status(pdde_comm *comm) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_test(pdde_comm_request *req, int *done) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_comm_wait(pdde_comm_request *req, double timeout_s) { return comm_unavailable(NULL, __func__); }
void pdde_hmac_sha256(const void *key, size_t key_len, const void *data, size_t n, unsigned char out[32]) { if (out) memset(out, 0, 32); }
pdde_status pdde_job_secret_generate(pdde_context *ctx, char *out, size_t cap) { return comm_unavailable(ctx, __func__); }
void pdde_sha256(const void *data, size_t n, unsigned char out[32]) { if (out) memset(out, 0, 32); }
pdde_status pdde_store_add(pdde_store *s, const char *key, int64_t delta, int64_t *out) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_store_compare_set(pdde_store *s, const char *key, const void *expected, size_t expected_len, const void *desired, size_t desired_len, int *swapped) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_store_connect(pdde_context *ctx, const char *addr, double timeout_s, pdde_store **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
pdde_status pdde_store_connect_secret(pdde_context *ctx, const char *addr, const char *secret, double timeout_s, pdde_store **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
void pdde_store_close(pdde_store *s) {  }
pdde_status pdde_store_get(pdde_store *s, const char *key, void **val, size_t *len) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_store_ping(pdde_store *s) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_store_remove(pdde_store *s, const char *key) { return comm_unavailable(NULL, __func__); }
int pdde_store_server_first_failure(pdde_store_server *srv, char *buf, size_t cap) { return 0; }
void pdde_store_server_free(pdde_store_server *srv) {  }
pdde_status pdde_store_server_init(pdde_context *ctx, const char *addr, pdde_store_server **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
pdde_status pdde_store_server_init_params(pdde_context *ctx, const pdde_store_server_params *params, pdde_store_server **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
int pdde_store_server_n_clients(const pdde_store_server *srv) { return 0; }
int pdde_store_server_port(const pdde_store_server *srv) { return 0; }
pdde_status pdde_store_set(pdde_store *s, const char *key, const void *val, size_t len) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_store_set_liveness(pdde_store *s, const char *key, const void *val, size_t len, double lease_s) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_store_wait(pdde_store *s, const char *key, double timeout_s) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_store_wrap(pdde_context *ctx, const pdde_store_iface *iface, void *impl, pdde_store **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
const pdde_transport_iface *pdde_transport_ucx(void) { return NULL; }
#pragma GCC diagnostic pop
#endif

#ifndef PDDE_HAVE_PS /* a copy without comm/ps.c: the parameter server's calls link and say so */
static pdde_status ps_unavailable(pdde_context *ctx, const char *fn) {
    return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "%s: pdde was built without the parameter server (comm/ps.c)", fn);
}
#define comm_unavailable ps_unavailable
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
pdde_status pdde_ps_client_flush(pdde_ps_client *c) { return comm_unavailable(NULL, __func__); }
void pdde_ps_client_free(pdde_ps_client *c) {  }
double pdde_ps_client_geo_delta_sum(const pdde_ps_client *c) { return 0; }
pdde_status pdde_ps_client_init(pdde_context *ctx, pdde_comm *comm, const pdde_ps_params *p, pdde_ps_client **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
pdde_status pdde_ps_client_pull(pdde_ps_client *c, size_t n, const uint64_t *ids, float *out) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_ps_client_push(pdde_ps_client *c, size_t n, const uint64_t *ids, const float *grads) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_ps_client_save(pdde_ps_client *c, const char *dir) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_ps_client_server_stats(pdde_ps_client *c, int index, pdde_ps_server_stats *out) { return comm_unavailable(NULL, __func__); }
void pdde_ps_server_free(pdde_ps_server *s) {  }
pdde_status pdde_ps_server_init(pdde_context *ctx, const pdde_ps_params *p, int server_index, pdde_ps_server **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
pdde_status pdde_ps_server_run(pdde_ps_server *s, pdde_comm *comm) { return comm_unavailable(NULL, __func__); }
void pdde_ps_server_stats_get(const pdde_ps_server *s, pdde_ps_server_stats *out) { if (out) memset(out, 0, sizeof *out); }
pdde_ps_table *pdde_ps_server_table(pdde_ps_server *s) { return NULL; }
int pdde_ps_shard_of(uint64_t id, int n_servers) { return 0; }
int pdde_ps_shard_path(char *buf, size_t n, const char *dir, int index, int n_servers) { return 0; }
pdde_status pdde_ps_table_add(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *deltas) { return comm_unavailable(NULL, __func__); }
void pdde_ps_table_free(pdde_ps_table *t) {  }
pdde_status pdde_ps_table_get(const pdde_ps_table *t, uint64_t id, float *out) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_ps_table_init(pdde_context *ctx, const pdde_ps_table_params *p, pdde_ps_table **out) { if (out) *out = NULL; return comm_unavailable(ctx, __func__); }
pdde_status pdde_ps_table_load(pdde_ps_table *t, const char *path) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_ps_table_pull(pdde_ps_table *t, size_t n, const uint64_t *ids, float *out) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_ps_table_push(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *grads, float scale) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_ps_table_save(const pdde_ps_table *t, const char *path) { return comm_unavailable(NULL, __func__); }
void pdde_ps_table_stats_get(const pdde_ps_table *t, pdde_ps_table_stats *out) { if (out) memset(out, 0, sizeof *out); }
pdde_status pdde_sparse_allreduce_dense(pdde_session *s, pdde_comm *comm) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_sparse_batch_collect(pdde_sparse_batch *b, pdde_session *s) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_sparse_batch_feed(pdde_sparse_batch *b, pdde_session *s) { return comm_unavailable(NULL, __func__); }
void pdde_sparse_batch_free(pdde_sparse_batch *b) {  }
pdde_status pdde_sparse_batch_init(const pdde_sparse_embedding *e, pdde_sparse_batch **out) { if (out) *out = NULL; return comm_unavailable(NULL, __func__); }
int64_t pdde_sparse_batch_unique_count(const pdde_sparse_batch *b) { return 0; }
pdde_status pdde_sparse_batch_pull(pdde_sparse_batch *b, pdde_ps_client *c, const uint64_t *ids) { return comm_unavailable(NULL, __func__); }
pdde_status pdde_sparse_batch_push(pdde_sparse_batch *b, pdde_ps_client *c) { return comm_unavailable(NULL, __func__); }
pdde_tensor *pdde_sparse_embedding_init(pdde_graph *g, const char *name, int64_t batch, int fields, int bag, int dim, pdde_pooling pool, pdde_sparse_embedding **out) {
    if (out) *out = NULL;
    return graph_fail(g, PDDE_ERR_UNAVAILABLE, "%s: pdde was built without communication (comm/, UCX)", __func__);
}
void pdde_sparse_embedding_free(pdde_sparse_embedding *e) {  }
#pragma GCC diagnostic pop
#undef comm_unavailable
#endif
