/* pdde_sparse.c — the worker side of parameter-server tables in a graph: a batch's unique ids pulled
 * into a local [U, dim] table, the ids remapped to its rows, the embedding op and bag pooling over
 * it, the rows' gradients pushed back. A part of pdde.c (included after comm/ps.c): it joins the
 * graph and session (core) to the client (comm/), which neither of them may know about. */

struct pdde_sparse_embedding {
    pdde_tensor *table;        /* [U, dim] PDDE_TENSOR_SPARSE parameter */
    pdde_tensor *ids;          /* i32 [batch, fields, bag]: rows of table */
    pdde_tensor *weights;      /* f32 [batch, fields, bag, 1] (bag > 1): 1 or 1/count, 0 on empty slots */
    int64_t batch, slots, rows; /* slots = batch x fields x bag; rows = slots + 1 (the last: zeros) */
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
};

pdde_tensor *pdde_sparse_embedding_add(pdde_graph *g, const char *name, int64_t batch, int fields, int bag, int dim,
                                       pdde_pooling pool, pdde_sparse_embedding **out) {
    *out = NULL;
    if (!g || g->status) return NULL;
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
    free(b);
}

int64_t pdde_sparse_batch_n_unique(const pdde_sparse_batch *b) { return b->n_unique; }

pdde_status pdde_sparse_batch_pull(pdde_sparse_batch *b, pdde_ps_client *c, const uint64_t *ids) {
    const pdde_sparse_embedding *e = b->e;
    int32_t empty = (int32_t)(e->rows - 1);
    b->n_unique = 0;
    if (b->index.cap) memset(b->index.vals, 0xff, b->index.cap * sizeof *b->index.vals), b->index.n = 0;
    for (int64_t i = 0; i < e->slots; i++) {
        if (ids[i] == PDDE_SPARSE_NO_ID) { b->local[i] = empty; continue; }
        uint32_t *r = ps_map_find(&b->index, ids[i]);
        if (!r) {
            if (!(r = ps_map_insert(&b->index, ids[i], (uint32_t)b->n_unique)))
                return pdde_error(c->ctx, PDDE_ERR_OOM, "sparse batch: out of memory");
            b->unique[b->n_unique++] = ids[i];
        }
        b->local[i] = (int32_t)*r;
    }
    if (e->bag > 1)
        for (int64_t s = 0; s < e->slots; s += e->bag) { /* one bag */
            int n = 0;
            for (int k = 0; k < e->bag; k++) n += b->local[s + k] != empty;
            for (int k = 0; k < e->bag; k++)
                b->weights[s + k] = b->local[s + k] == empty ? 0.0f : e->pool == PDDE_POOL_MEAN ? 1.0f / (float)n : 1.0f;
        }
    /* rows past the unique ones (and the empty row) are zeros: no id refers to them */
    memset(b->rows + b->n_unique * e->dim, 0, (size_t)(e->rows - b->n_unique) * e->dim * sizeof(float));
    return pdde_ps_client_pull(c, (size_t)b->n_unique, b->unique, b->rows);
}

pdde_status pdde_sparse_batch_feed(pdde_sparse_batch *b, pdde_session *s) {
    const pdde_sparse_embedding *e = b->e;
    pdde_status st = pdde_session_write(s, e->table, b->rows, (size_t)e->rows * e->dim * sizeof(float));
    if (!st) st = pdde_session_write(s, e->ids, b->local, (size_t)e->slots * sizeof(int32_t));
    if (!st && e->weights) st = pdde_session_write(s, e->weights, b->weights, (size_t)e->slots * sizeof(float));
    return st;
}

pdde_status pdde_sparse_batch_collect(pdde_sparse_batch *b, pdde_session *s) {
    const pdde_sparse_embedding *e = b->e;
    size_t bytes = (size_t)e->rows * e->dim * sizeof(float);
    if (!e->table->grad) return pdde_error(s->ctx, PDDE_ERR_STATE, "sparse batch: %s has no gradient (pdde_backward not called, or the loss does not use it)", e->table->name);
    pdde_status st = pdde_session_read(s, e->table->grad, b->rows, bytes);
    /* the accumulator is the optimizers' to zero, and they skip sparse tables */
    float *zeros = st ? NULL : calloc(1, bytes);
    if (!st && !zeros) st = pdde_error(s->ctx, PDDE_ERR_OOM, "sparse batch: out of memory");
    if (!st) st = pdde_session_write(s, e->table->grad, zeros, bytes);
    free(zeros);
    return st;
}

pdde_status pdde_sparse_batch_push(pdde_sparse_batch *b, pdde_ps_client *c) {
    return pdde_ps_client_push(c, (size_t)b->n_unique, b->unique, b->rows);
}

pdde_status pdde_sparse_allreduce_dense(pdde_session *s, pdde_comm *comm) {
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
