/* tools/bench/bench_sparse.h — the session the sparse-table benches time: one sparse embedding of
 * B x F ids (one id a bag, summed, dim C) on device dev, a loss that makes its gradient depend on the
 * rows, and a client of an in-process parameter server with table parameters pp; DLRM-like ids. */
#ifndef PDDE_BENCH_SPARSE_H
#define PDDE_BENCH_SPARSE_H
#include "pdde.h"

#include <stdint.h>

typedef struct {
    pdde_graph *g;
    pdde_session *s;
    pdde_sparse_embedding *e;
    pdde_sparse_batch *sb;
    pdde_ps_client *c;
} bench_sparse;

static inline pdde_status bench_sparse_init(pdde_context *ctx, int dev, int B, int F, int C, const pdde_ps_params *pp, bench_sparse *b) {
    *b = (bench_sparse){0};
    pdde_graph_init(ctx, &b->g);
    pdde_tensor *y = pdde_sparse_embedding_init(b->g, "e", B, F, 1, C, PDDE_POOL_SUM, &b->e);
    pdde_tensor *loss = pdde_mean(b->g, pdde_mul(b->g, y, y), -1, 0);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev;
    pdde_status st = pdde_graph_status(b->g);
    if (!st) st = pdde_backward(b->g, loss);
    if (!st) st = pdde_session_init(b->g, &sp, &b->s);
    if (!st) st = pdde_ps_client_init(ctx, NULL, pp, &b->c);
    if (!st) st = pdde_sparse_batch_init(b->e, &b->sb);
    return st;
}

static inline void bench_sparse_free(bench_sparse *b) {
    pdde_sparse_batch_free(b->sb);
    pdde_ps_client_free(b->c);
    pdde_session_free(b->s);
    pdde_graph_free(b->g);
    pdde_sparse_embedding_free(b->e);
}

/* n ids drawn from [0, from) by a fixed LCG (state *r): the same batches in every run */
static inline void bench_sparse_ids(uint32_t *r, uint64_t *ids, int n, uint32_t from) {
    for (int k = 0; k < n; k++) *r = *r * 1103515245u + 12345u, ids[k] = (*r >> 8) % from;
}
#endif
