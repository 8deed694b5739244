/* backends/cpu_moe.c — the Mixture-of-Experts ops on the CPU: routing (top-k, gate weights and their
 * gradient, counts), the token permutation into expert order and back (dispatch, combine) and the
 * grouped GEMM over experts of varying row counts. Included by cpu.c; the reference the other
 * backends are compared with.
 *
 * The expert-ordered buffer (pdde.h, PDDE_OP_MOE_TOPK..): choice (n, j) of token n lands on row
 * offset[e] + (its rank among e's choices in (n, j) order), e = idx[n, j]; offset[e] is the sum of
 * the counts before e (dropless, capacity 0) or e * capacity; with a capacity, a choice ranked past
 * it is dropped (row -1). moe_layout computes this in one O(N k + E) pass; every op recomputes it
 * from idx rather than passing a permutation tensor, so a graph holds no extra integer state.
 *
 * Under a bf16 compute dtype the activations the permutation moves are bf16 (an f32 or bf16 source,
 * an f32 or bf16 result, as the node's dtypes say): a bf16 row moved as it is is exact, a weighted or
 * summed one is computed in f32 and rounded once, as a cast would. The grouped GEMM takes bf16 rows
 * and weights (oneDNN's bf16 GEMM, or widened to f32: exact, the products of bf16 values are exact in
 * f32) and accumulates in f32. Routing (top-k, gate, counts) and the balance loss read f32 logits only. */

static float *half_widen(const pdde_tensor *t);
static void half_to_f32(const uint16_t *h, float *f, int64_t n, pdde_dtype dt);
static void f32_to_half(const float *f, uint16_t *h, int64_t n, pdde_dtype dt);
#define MOE_DATA(t) ((void *)((char *)(t)->data + (t)->offset))

typedef struct {
    int64_t E, cap, R;
    int64_t *offset; /* [E] first row of each expert */
    int64_t *rows;   /* [E] rows in use of each expert (its count, at most cap) */
    int32_t *row;    /* [N*k] the row of choice (n, j), -1 when dropped (NULL when not asked for) */
} moe_layout;

static void moe_layout_free(moe_layout *L) { free(L->offset), free(L->rows), free(L->row); }

/* idx: i32 [N, k]; R the rows of the expert-ordered buffer. Fails on an expert id out of [0, E) or a
 * buffer too short for the counts. */
static pdde_status moe_layout_init(pdde_context *ctx, const pdde_tensor *node, const pdde_tensor *idx, int64_t E, int64_t cap, int64_t R,
                                   bool want_rows, moe_layout *L) {
    memset(L, 0, sizeof *L);
    int64_t nk = pdde_tensor_numel(idx);
    if (cap > 0 && R != INT64_MAX && E > 0) cap = R / E; /* a rank's share of the capacity (its buffer: E x share) */
    L->E = E, L->cap = cap, L->R = R;
    L->offset = calloc((size_t)(E ? E : 1), sizeof *L->offset);
    L->rows = calloc((size_t)(E ? E : 1), sizeof *L->rows);
    int64_t *seen = calloc((size_t)(E ? E : 1), sizeof *seen);
    if (want_rows) L->row = malloc((size_t)(nk ? nk : 1) * sizeof *L->row);
    if (!L->offset || !L->rows || !seen || (want_rows && !L->row)) {
        free(seen), moe_layout_free(L);
        return pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory", node->name);
    }
    const int32_t *id = (const int32_t *)((const char *)idx->data + idx->offset);
    for (int64_t i = 0; i < nk; i++) {
        if (id[i] < 0 || id[i] >= E) {
            free(seen), moe_layout_free(L);
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: %s[%lld] = %d is not an expert id in 0..%lld", node->name, idx->name,
                              (long long)i, id[i], (long long)E - 1);
        }
        L->rows[id[i]]++;
    }
    int64_t total = 0;
    for (int64_t e = 0; e < E; e++) {
        if (cap > 0 && L->rows[e] > cap) L->rows[e] = cap;
        L->offset[e] = cap > 0 ? e * cap : total;
        total += L->rows[e];
    }
    if ((cap > 0 ? E * cap : total) > R) {
        free(seen), moe_layout_free(L);
        return pdde_error(ctx, PDDE_ERR_SHAPE, "%s: %lld expert rows do not fit the %lld rows of the buffer", node->name,
                          (long long)(cap > 0 ? E * cap : total), (long long)R);
    }
    if (want_rows)
        for (int64_t i = 0; i < nk; i++) {
            int64_t e = id[i], r = seen[e]++;
            L->row[i] = r < L->rows[e] ? (int32_t)(L->offset[e] + r) : -1;
        }
    free(seen);
    return PDDE_OK;
}

/* ---- routing ---- */

static inline float moe_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* The scores of one row of logits: softmax or sigmoid. */
static void moe_scores(const float *l, int64_t E, bool sigmoid, float *s) {
    if (sigmoid) {
        for (int64_t e = 0; e < E; e++) s[e] = moe_sigmoid(l[e]);
        return;
    }
    float m = -INFINITY;
    for (int64_t e = 0; e < E; e++) m = l[e] > m ? l[e] : m;
    double z = 0;
    for (int64_t e = 0; e < E; e++) z += s[e] = expf(l[e] - m);
    for (int64_t e = 0; e < E; e++) s[e] = (float)(s[e] / z);
}

#define MOE_ROUTE_PAR_MIN (1 << 13) /* scores (rows x experts) below which routing stays on the calling thread */

/* scratch: E + 2k floats per row of logits (allocated once by cpu_moe: a task cannot fail) */
typedef struct { const pdde_tensor *t; int64_t E, k; bool sigmoid, normalize; float *scratch; } moe_route_job;

static void moe_topk_task(void *arg, int64_t begin, int64_t end) {
    const moe_route_job *j = arg;
    const pdde_tensor *t = j->t;
    const float *bias = t->nsrc > 1 ? F32(t->src[1]) : NULL;
    for (int64_t n = begin; n < end; n++) {
        float *sc = j->scratch + n * (j->E + 2 * j->k);
        moe_scores(F32(t->src[0]) + n * j->E, j->E, j->sigmoid, sc);
        if (bias)
            for (int64_t e = 0; e < j->E; e++) sc[e] += bias[e];
        int32_t *out = I32(t) + n * j->k;
        for (int64_t c = 0; c < j->k; c++) { /* k passes: k is small; strict > keeps the lower id on ties */
            int64_t best = -1;
            for (int64_t e = 0; e < j->E; e++) {
                bool taken = false;
                for (int64_t p = 0; p < c && !taken; p++) taken = out[p] == e;
                if (!taken && (best < 0 || sc[e] > sc[best] || (isnan(sc[best]) && !isnan(sc[e])))) best = e;
            }
            out[c] = (int32_t)best;
        }
    }
}

/* weights of row n (and, for the backward, the chosen scores s): softmax over the chosen logits, or
 * the chosen softmax probabilities / sigmoids, normalised by their sum unless asked not to */
static void moe_gate_row(const moe_route_job *j, const float *l, const int32_t *id, float *full, float *s, float *w) {
    int64_t k = j->k;
    if (!j->sigmoid && !j->normalize) {
        moe_scores(l, j->E, false, full);
        for (int64_t c = 0; c < k; c++) s[c] = w[c] = full[id[c]];
        return;
    }
    if (!j->sigmoid) { /* = the chosen probabilities renormalised */
        float m = -INFINITY;
        for (int64_t c = 0; c < k; c++) m = l[id[c]] > m ? l[id[c]] : m;
        double z = 0;
        for (int64_t c = 0; c < k; c++) z += s[c] = expf(l[id[c]] - m);
        for (int64_t c = 0; c < k; c++) w[c] = (float)(s[c] / z);
        return;
    }
    double z = 0;
    for (int64_t c = 0; c < k; c++) z += s[c] = moe_sigmoid(l[id[c]]);
    for (int64_t c = 0; c < k; c++) w[c] = j->normalize ? (float)(s[c] / z) : s[c];
}

static void moe_gate_task(void *arg, int64_t begin, int64_t end) {
    const moe_route_job *j = arg;
    const pdde_tensor *t = j->t, *lt = t->src[0], *it = t->src[1];
    bool back = t->op == PDDE_OP_MOE_GATE_BACK;
    for (int64_t n = begin; n < end; n++) {
        float *full = j->scratch + n * (j->E + 2 * j->k), *s = full + j->E, *w = s + j->k;
        const float *l = F32(lt) + n * j->E;
        const int32_t *id = I32(it) + n * j->k;
        moe_gate_row(j, l, id, full, s, w);
        if (!back) {
            memcpy(F32(t) + n * j->k, w, (size_t)j->k * sizeof *w);
            continue;
        }
        const float *dw = F32(t->src[2]) + n * j->k;
        float *dl = F32(t) + n * j->E;
        memset(dl, 0, (size_t)j->E * sizeof *dl);
        double wdw = 0;
        for (int64_t c = 0; c < j->k; c++) wdw += (double)w[c] * dw[c];
        if (!j->sigmoid && j->normalize) { /* softmax over the chosen: dl = w (dw - <w, dw>) */
            for (int64_t c = 0; c < j->k; c++) dl[id[c]] += w[c] * (float)(dw[c] - wdw);
        } else if (!j->sigmoid) { /* w_c = p[id_c]: dl_i = sum_c dw_c p_c (delta - p_i) */
            for (int64_t e = 0; e < j->E; e++) dl[e] = -full[e] * (float)wdw;
            for (int64_t c = 0; c < j->k; c++) dl[id[c]] += dw[c] * w[c];
        } else { /* w = s / S (or s): ds, then sigmoid' */
            double S = 0;
            for (int64_t c = 0; c < j->k; c++) S += s[c];
            for (int64_t c = 0; c < j->k; c++) {
                double ds = j->normalize ? (dw[c] - wdw) / S : dw[c];
                dl[id[c]] += (float)(ds * s[c] * (1.0 - s[c]));
            }
        }
    }
}

/* ---- the permutation ---- */

/* The row kernels of the permutation, per dtype as loops the compiler vectorises: a bf16 value widens
 * by a shift (exact), a bf16 result rounds as pdde_f32_to_bf16 does (f32_to_half), through chunks of
 * MOE_CHUNK f32 values on the stack. */
#define MOE_CHUNK 256

/* x[i0 .. i0+n) of an f32 or bf16 row as f32: x itself (f32) or widened into buf */
static const float *moe_chunk_f32(const void *x, pdde_dtype dt, int64_t i0, int64_t n, float *buf) {
    if (dt == PDDE_F32) return (const float *)x + i0;
    half_to_f32((const uint16_t *)x + i0, buf, n, dt);
    return buf;
}

/* y = s x (s NULL: y = x), y and x f32 or bf16 rows of C */
CPU_KERNEL static void moe_row_scale(void *y, pdde_dtype ydt, const float *s, const void *x, pdde_dtype xdt, int64_t C) {
    float xb[MOE_CHUNK], yb[MOE_CHUNK];
    for (int64_t i0 = 0; i0 < C; i0 += MOE_CHUNK) {
        int64_t n = C - i0 < MOE_CHUNK ? C - i0 : MOE_CHUNK;
        const float *xf = moe_chunk_f32(x, xdt, i0, n, xb);
        float *yf = ydt == PDDE_F32 ? (float *)y + i0 : yb;
        if (s) {
            float sv = *s;
            for (int64_t i = 0; i < n; i++) yf[i] = sv * xf[i];
        } else if (yf != xf) {
            memcpy(yf, xf, (size_t)n * sizeof *yf);
        }
        if (ydt != PDDE_F32) f32_to_half(yf, (uint16_t *)y + i0, n, ydt);
    }
}

/* y += s x: y f32, x an f32 or bf16 row of C */
CPU_KERNEL static void moe_row_axpy(float *y, float s, const void *x, pdde_dtype xdt, int64_t C) {
    if (xdt == PDDE_F32) {
        const float *xf = x;
        for (int64_t i = 0; i < C; i++) y[i] += s * xf[i];
        return;
    }
    const uint16_t *h = x;
    for (int64_t i = 0; i < C; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        y[i] += s * f;
    }
}

/* <a, b> of two f32 or bf16 rows of C, the products and sums in double (8 partial sums) */
CPU_KERNEL static double moe_row_dot(const void *a, pdde_dtype adt, const void *b, pdde_dtype bdt, int64_t C) {
    float ab[MOE_CHUNK], bb[MOE_CHUNK];
    double acc[8] = {0};
    for (int64_t i0 = 0; i0 < C; i0 += MOE_CHUNK) {
        int64_t n = C - i0 < MOE_CHUNK ? C - i0 : MOE_CHUNK, i = 0;
        const float *af = moe_chunk_f32(a, adt, i0, n, ab), *bf = moe_chunk_f32(b, bdt, i0, n, bb);
        for (; i + 8 <= n; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)af[i + l] * bf[i + l];
        for (; i < n; i++) acc[0] += (double)af[i] * bf[i];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

typedef struct { const pdde_tensor *t; const moe_layout *L; int64_t k, C; } moe_perm_job;

/* dispatch: row(n, j) = x[n] (* w[n, j]); over tokens n */
static void moe_dispatch_task(void *arg, int64_t begin, int64_t end) {
    const moe_perm_job *j = arg;
    const pdde_tensor *t = j->t, *xt = t->src[0];
    const float *w = t->nsrc > 2 ? F32(t->src[2]) : NULL;
    const char *x = MOE_DATA(xt);
    char *y = MOE_DATA(t);
    size_t esz = pdde_dtype_size(t->dtype), xsz = pdde_dtype_size(xt->dtype);
    for (int64_t n = begin; n < end; n++)
        for (int64_t c = 0; c < j->k; c++) {
            int32_t r = j->L->row[n * j->k + c];
            if (r < 0) continue;
            char *yr = y + (size_t)r * (size_t)j->C * esz;
            const char *xn = x + (size_t)(n * j->C) * xsz;
            if (!w && xt->dtype == t->dtype) memcpy(yr, xn, (size_t)j->C * esz); /* a row moved as it is (f32 or bf16: exact) */
            else moe_row_scale(yr, t->dtype, w ? w + n * j->k + c : NULL, xn, xt->dtype, j->C);
        }
}

/* combine: y[n] = sum_j (w[n, j] *) ye[row(n, j)]; combine_back_w: dw[n, j] = <dy[n], ye[row(n, j)]>.
 * ye and dy f32 or bf16, summed into f32 */
static void moe_combine_task(void *arg, int64_t begin, int64_t end) {
    const moe_perm_job *j = arg;
    const pdde_tensor *t = j->t, *et = t->src[0];
    const char *ye = MOE_DATA(et);
    size_t esz = pdde_dtype_size(et->dtype);
    if (t->op == PDDE_OP_MOE_COMBINE_BACK_W) {
        const pdde_tensor *dt = t->src[2];
        const char *dy = MOE_DATA(dt);
        size_t dsz = pdde_dtype_size(dt->dtype);
        for (int64_t n = begin; n < end; n++)
            for (int64_t c = 0; c < j->k; c++) {
                int32_t r = j->L->row[n * j->k + c];
                F32(t)[n * j->k + c] = r < 0 ? 0.0f
                                             : (float)moe_row_dot(dy + (size_t)(n * j->C) * dsz, dt->dtype,
                                                                  ye + (size_t)r * (size_t)j->C * esz, et->dtype, j->C);
            }
        return;
    }
    const float *w = t->nsrc > 2 ? F32(t->src[2]) : NULL;
    for (int64_t n = begin; n < end; n++) {
        float *yn = F32(t) + n * j->C;
        memset(yn, 0, (size_t)j->C * sizeof *yn);
        for (int64_t c = 0; c < j->k; c++) {
            int32_t r = j->L->row[n * j->k + c];
            if (r < 0) continue;
            moe_row_axpy(yn, w ? w[n * j->k + c] : 1.0f, ye + (size_t)r * (size_t)j->C * esz, et->dtype, j->C);
        }
    }
}

/* ---- the grouped GEMM ---- */

/* Tasks are (expert, row tile, column tile) blocks of the output, as gemm_task's are for one GEMM, so
 * a few busy experts and many idle ones spread over the threads alike. */
typedef struct {
    const pdde_tensor *t;
    const moe_layout *L;
    int64_t K, M;            /* forward: x [R,K] -> [R,M]; back_w: [E,K,M] */
    int64_t tile_m, tile_n;
    int64_t *task_expert, *task_first; /* per task: its expert and first tile index within it */
    int64_t n_tasks;
    const void *a, *b;       /* forward: the rows x and the weights; back_w: the rows a, b (at the layout's offsets) */
    pdde_dtype dt;           /* a's and b's: f32, or bf16 (oneDNN's bf16 GEMM, f32 sums) */
    float *c;                /* the output (f32) */
    uint16_t *lowp;          /* forward with a bf16 result: each tile of c rounded into it once computed (else NULL) */
    pdde_dtype lowp_dt;
    int failed;              /* a GEMM returned an error */
} moe_gemm_job;

static void moe_gemm_task(void *arg, int64_t begin, int64_t end) {
    const moe_gemm_job *j = arg;
    const pdde_tensor *t = j->t;
    bool back_w = t->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W;
    int tb = back_w ? 0 : pdde_op_i32(t, PDDE_P_MOE_TRANS_B);
    int prev = attention_threads_enter();
    int64_t col_tiles = (j->M + j->tile_n - 1) / j->tile_n;
    for (int64_t task = begin; task < end; task++) {
        int64_t e = j->task_expert[task], tile = task - j->task_first[e];
        int64_t i0 = tile / col_tiles * j->tile_m, j0 = tile % col_tiles * j->tile_n;
        int64_t rows = back_w ? j->K : j->L->rows[e], off = j->L->offset[e];
        int64_t m = rows - i0 < j->tile_m ? rows - i0 : j->tile_m, n = j->M - j0 < j->tile_n ? j->M - j0 : j->tile_n;
        size_t esz = pdde_dtype_size(j->dt);
        if (back_w) { /* dw_e[i0.., j0..] = a_e[:, i0..]^T b_e[:, j0..] over the expert's rows */
            const char *A = (const char *)j->a + (size_t)(off * j->K + i0) * esz, *B = (const char *)j->b + (size_t)(off * j->M + j0) * esz;
            float *Cm = j->c + e * j->K * j->M + i0 * j->M + j0;
            if (j->L->rows[e] == 0) {
                for (int64_t r = 0; r < m; r++) memset(Cm + r * j->M, 0, (size_t)n * sizeof *Cm);
                continue;
            }
            if (attention_gemm(j->dt, 1, 0, m, n, j->L->rows[e], 1.0f, A, j->K, B, j->M, 0.0f, Cm, j->M)) ((moe_gemm_job *)j)->failed = 1;
        } else {
            const char *A = (const char *)j->a + (size_t)((off + i0) * j->K) * esz;
            const char *W = (const char *)j->b + (size_t)(e * j->K * j->M + (tb ? j0 * j->K : j0)) * esz;
            float *Cm = j->c + (off + i0) * j->M + j0;
            if (attention_gemm(j->dt, 0, tb, m, n, j->K, 1.0f, A, j->K, W, tb ? j->K : j->M, 0.0f, Cm, j->M)) ((moe_gemm_job *)j)->failed = 1;
            for (int64_t r = 0; j->lowp && r < m; r++) /* (while the tile is in cache, on this thread) */
                f32_to_half(Cm + r * j->M, j->lowp + (off + i0 + r) * j->M + j0, n, j->lowp_dt);
        }
    }
    attention_threads_leave(prev);
}

/* a: the rows as the layout places them; b: the weights (forward) or the other rows (back_w), both of
 * dtype dt; c: the f32 output; lowp: NULL, or (forward) the bf16 result c is rounded into */
static pdde_status cpu_moe_gemm(pdde_context *ctx, pdde_threadpool *pool, pdde_tensor *t, const moe_layout *L, const void *a,
                                const void *b, pdde_dtype dt, float *c, uint16_t *lowp) {
    bool back_w = t->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W;
    moe_gemm_job j = {.t = t, .L = L, .a = a, .b = b, .dt = dt, .c = c, .lowp = back_w ? NULL : lowp, .lowp_dt = t->dtype};
    if (back_w) j.K = t->shape[1], j.M = t->shape[2];
    else j.K = t->src[0]->shape[t->src[0]->ndim - 1], j.M = t->shape[t->ndim - 1];
    if (!back_w) { /* rows no expert uses (past a capacity's counts, or a dropless tail) are zero */
        float *y = j.c;
        int64_t used_end = 0;
        for (int64_t e = 0; e <= L->E; e++) {
            int64_t next = e < L->E ? L->offset[e] : L->R;
            if (next > used_end) {
                memset(y + used_end * j.M, 0, (size_t)((next - used_end) * j.M) * sizeof *y);
                if (j.lowp) memset(j.lowp + used_end * j.M, 0, (size_t)((next - used_end) * j.M) * sizeof *j.lowp); /* (bf16 zero) */
            }
            if (e < L->E) used_end = L->offset[e] + L->rows[e];
        }
    }
    if (j.M == 0 || (back_w && j.K == 0)) return PDDE_OK;
    int64_t total_rows = 0, used_rows = 0, threads = pool ? pool->n_threads : 1;
    for (int64_t e = 0; e < L->E; e++) total_rows += back_w ? j.K : L->rows[e], used_rows += L->rows[e];
    /* tiles: about 2 tasks a thread over all experts, at least 16 rows x 64 columns */
    int64_t want = 2 * threads;
    j.tile_m = total_rows / want > 16 ? total_rows / want : 16;
    j.tile_n = j.M;
    if (total_rows < want * 16 && j.M > 64) {
        int64_t split = want * 16 / (total_rows ? total_rows : 1);
        j.tile_n = (j.M + split - 1) / split;
        if (j.tile_n < 64) j.tile_n = 64;
    }
    int64_t col_tiles = (j.M + j.tile_n - 1) / j.tile_n;
    j.task_first = malloc((size_t)(L->E + 1) * sizeof *j.task_first);
    if (!j.task_first) return pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
    int64_t n_tasks = 0;
    for (int64_t e = 0; e < L->E; e++) {
        int64_t rows = back_w ? j.K : L->rows[e];
        j.task_first[e] = n_tasks;
        n_tasks += (rows + j.tile_m - 1) / j.tile_m * col_tiles;
    }
    j.task_first[L->E] = n_tasks;
    j.task_expert = malloc((size_t)(n_tasks ? n_tasks : 1) * sizeof *j.task_expert);
    if (!j.task_expert) { free(j.task_first); return pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory", t->name); }
    for (int64_t e = 0; e < L->E; e++)
        for (int64_t k = j.task_first[e]; k < j.task_first[e + 1]; k++) j.task_expert[k] = e;
    j.n_tasks = n_tasks;
    double flops = 2.0 * (double)used_rows * (double)j.M * (double)j.K;
    parallel_for(pool, n_tasks, flops < 2e5 ? INT64_MAX : 2, moe_gemm_task, &j);
    free(j.task_first), free(j.task_expert);
    return j.failed ? pdde_error(ctx, PDDE_ERR_BACKEND, "%s: oneDNN's %s GEMM failed", t->name, pdde_dtype_name(dt)) : PDDE_OK;
}

/* The buffer by expert, [E, S, K] (this rank's experts; S rows each, the capacity): the rows of zeros
 * (past each block's tokens: the padding the exchange brought) add nothing to a GEMM without a bias, so
 * only the others are multiplied: gathered into one block an expert, multiplied, and the results
 * scattered back (the zero rows' outputs zero). For the weight gradient, a zero row of a. */
static pdde_status cpu_moe_gemm_by_expert(pdde_context *ctx, pdde_threadpool *pool, pdde_tensor *t, const void *xa, const void *b,
                                          pdde_dtype dt, float *out) {
    bool back_w = t->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W;
    const pdde_tensor *x = t->src[0];
    int64_t El = x->shape[0], S = x->shape[1], K = x->shape[2], M = back_w ? t->src[1]->shape[2] : t->shape[2];
    moe_layout L;
    memset(&L, 0, sizeof L);
    L.E = El, L.cap = S;
    L.offset = calloc((size_t)(El ? El : 1), sizeof *L.offset), L.rows = calloc((size_t)(El ? El : 1), sizeof *L.rows);
    int64_t *used = malloc((size_t)(El * S > 0 ? El * S : 1) * sizeof *used);
    char *ca = NULL, *cb = NULL;
    float *cc = NULL;
    size_t esz = pdde_dtype_size(dt);
    pdde_status st = PDDE_OK;
    if (!L.offset || !L.rows || !used) { st = pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory", t->name); goto done; }
    int64_t n = 0;
    for (int64_t e = 0; e < El; e++) {
        L.offset[e] = n;
        for (int64_t r = e * S; r < (e + 1) * S; r++) { /* (in blocks without an early exit, which the compiler vectorizes:
                                                        * the padding's zero rows are most of the buffer) */
            int any = 0;
            if (dt == PDDE_BF16) { /* (a bf16 zero: its bits but the sign are 0) */
                const uint16_t *row = (const uint16_t *)xa + r * K;
                any = K > 0 && (row[0] & 0x7fff) != 0;
                for (int64_t i = 1; i < K && !any; i += 64)
                    for (int64_t j = i, end = i + 64 < K ? i + 64 : K; j < end; j++) any |= (row[j] & 0x7fff) != 0;
            } else {
                const float *row = (const float *)xa + r * K;
                any = K > 0 && row[0] != 0.0f;
                for (int64_t i = 1; i < K && !any; i += 64)
                    for (int64_t j = i, end = i + 64 < K ? i + 64 : K; j < end; j++) any |= row[j] != 0.0f;
            }
            if (any) used[n++] = r;
        }
        L.rows[e] = n - L.offset[e];
    }
    L.R = n;
    if (n == El * S) { /* no padding: the rows where they are */
        st = cpu_moe_gemm(ctx, pool, t, &L, xa, b, dt, out, NULL);
        goto done;
    }
    ca = malloc((size_t)(n * K + 1) * esz);
    if (back_w) cb = malloc((size_t)(n * M + 1) * esz);
    else cc = malloc((size_t)(n * M + 1) * sizeof *cc);
    if (!ca || (back_w ? !cb : !cc)) { st = pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory", t->name); goto done; }
    for (int64_t i = 0; i < n; i++) {
        memcpy(ca + (size_t)(i * K) * esz, (const char *)xa + (size_t)(used[i] * K) * esz, (size_t)K * esz);
        if (back_w) memcpy(cb + (size_t)(i * M) * esz, (const char *)b + (size_t)(used[i] * M) * esz, (size_t)M * esz);
    }
    st = cpu_moe_gemm(ctx, pool, t, &L, ca, back_w ? (const void *)cb : b, dt, back_w ? out : cc, NULL);
    if (!st && !back_w) {
        memset(out, 0, (size_t)pdde_tensor_numel(t) * sizeof *out);
        for (int64_t i = 0; i < n; i++) memcpy(out + used[i] * M, cc + i * M, (size_t)M * sizeof *cc);
    }
done:
    free(ca), free(cb), free(cc), free(used);
    moe_layout_free(&L);
    return st;
}

/* ---- the ops ---- */

static pdde_status cpu_moe(pdde_context *ctx, pdde_threadpool *pool, pdde_tensor *t) {
    int64_t E = pdde_op_i32(t, PDDE_P_MOE_EXPERTS), cap = pdde_op_i32(t, PDDE_P_MOE_CAPACITY);
    unsigned flags = (unsigned)pdde_op_i32(t, PDDE_P_MOE_FLAGS);
    switch (t->op) {
    case PDDE_OP_MOE_TOPK: case PDDE_OP_MOE_GATE: case PDDE_OP_MOE_GATE_BACK: {
        const pdde_tensor *l = t->src[0];
        moe_route_job j = {.t = t, .E = l->shape[1], .k = t->op == PDDE_OP_MOE_TOPK ? t->shape[1] : t->src[1]->shape[1],
                           .sigmoid = flags & PDDE_MOE_SIGMOID, .normalize = !(flags & PDDE_MOE_NO_NORMALIZE)};
        if (t->op != PDDE_OP_MOE_TOPK) { /* the expert ids are checked once here, not per row */
            moe_layout L;
            pdde_status st = moe_layout_init(ctx, t, t->src[1], j.E, 0, INT64_MAX, false, &L);
            if (st) return st;
            moe_layout_free(&L);
        }
        j.scratch = malloc((size_t)(l->shape[0] * (j.E + 2 * j.k) + 1) * sizeof *j.scratch);
        if (!j.scratch) return pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
        /* on the pool only when the scores are many: below MOE_ROUTE_PAR_MIN waking the pool's threads
         * costs more than splitting the rows saves (a GPT's 512 tokens of 8 experts run inline) */
        parallel_for(pool, l->shape[0], (MOE_ROUTE_PAR_MIN + j.E - 1) / (j.E > 0 ? j.E : 1), t->op == PDDE_OP_MOE_TOPK ? moe_topk_task : moe_gate_task, &j);
        free(j.scratch);
        return PDDE_OK;
    }
    case PDDE_OP_MOE_COUNTS: {
        moe_layout L;
        pdde_status st = moe_layout_init(ctx, t, t->src[0], E, 0, INT64_MAX, false, &L);
        if (st) return st;
        const int32_t *id = I32(t->src[0]);
        memset(I32(t), 0, (size_t)E * sizeof(int32_t));
        for (int64_t i = 0, n = pdde_tensor_numel(t->src[0]); i < n; i++) I32(t)[id[i]]++;
        moe_layout_free(&L);
        return PDDE_OK;
    }
    case PDDE_OP_MOE_DISPATCH: case PDDE_OP_MOE_COMBINE: case PDDE_OP_MOE_COMBINE_BACK_W: {
        /* the expert-ordered buffer as rows of C ([R, C], or [E, S, C]: R = E S, the capacity S) */
        const pdde_tensor *idx = t->src[1], *buf = t->op == PDDE_OP_MOE_DISPATCH ? t : t->src[0];
        int64_t C = buf->shape[buf->ndim - 1], R = C ? pdde_tensor_numel(buf) / C : 0;
        if (buf->ndim == 3) R = buf->shape[0] * buf->shape[1];
        moe_layout L;
        pdde_status st = moe_layout_init(ctx, t, idx, E, cap, R, true, &L);
        if (st) return st;
        moe_perm_job j = {.t = t, .L = &L, .k = idx->shape[1], .C = C};
        if (t->op == PDDE_OP_MOE_DISPATCH) {
            if (cap > 0 || pdde_tensor_numel(idx) < R) memset(F32(t), 0, pdde_tensor_nbytes(t)); /* the unused rows */
            parallel_for(pool, idx->shape[0], 256, moe_dispatch_task, &j);
        } else {
            parallel_for(pool, idx->shape[0], 256, moe_combine_task, &j);
        }
        moe_layout_free(&L);
        return PDDE_OK;
    }
    case PDDE_OP_MOE_GROUPED_MATMUL: case PDDE_OP_MOE_GROUPED_MATMUL_BACK_W: {
        /* bf16 operands: oneDNN's bf16 GEMM where it runs here, else widened to f32 (exact); the sums
         * in f32 either way. A bf16 result (a cast folded in by lowering) computed in f32 and rounded once. */
        const pdde_tensor *x = t->src[0], *b = t->src[1];
        bool widen = x->dtype != PDDE_F32 && !attention_bf16_gemm_works();
        float *wa = widen ? half_widen(x) : NULL, *wb = widen ? half_widen(b) : NULL;
        float *wc = t->dtype == PDDE_F32 ? NULL : malloc((size_t)(pdde_tensor_numel(t) + 1) * sizeof *wc);
        const void *A = wa ? wa : MOE_DATA(x), *B = wb ? wb : MOE_DATA(b);
        pdde_dtype dt = widen ? PDDE_F32 : x->dtype;
        float *Cm = wc ? wc : F32(t);
        pdde_status st = PDDE_OK;
        if ((widen && (!wa || !wb)) || (t->dtype != PDDE_F32 && !wc))
            st = pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
        else if (x->ndim == 3) {
            st = cpu_moe_gemm_by_expert(ctx, pool, t, A, B, dt, Cm);
            if (!st && wc) f32_to_half(wc, (uint16_t *)MOE_DATA(t), pdde_tensor_numel(t), t->dtype);
        } else { /* (a bf16 result rounded tile by tile, by the thread that computed it) */
            moe_layout L;
            st = moe_layout_init(ctx, t, t->src[2], E, cap, x->shape[0], false, &L);
            if (!st) st = cpu_moe_gemm(ctx, pool, t, &L, A, B, dt, Cm, wc ? (uint16_t *)MOE_DATA(t) : NULL);
            if (!st) moe_layout_free(&L);
        }
        free(wa), free(wb), free(wc);
        return st;
    }
    case PDDE_OP_MOE_AUX_LOSS: case PDDE_OP_MOE_AUX_LOSS_BACK: {
        /* the mean over this node's rows (a rank's own under data parallelism: its mean, as its
         * cross-entropy's); f from the counts of all tokens */
        const pdde_tensor *lt = t->src[0];
        int64_t N = lt->shape[0], Ex = lt->shape[1];
        const int32_t *cnt = I32(t->src[1]);
        float *f = malloc((size_t)(2 * Ex + 1) * sizeof *f), *p = f + Ex;
        if (!f) return pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory", t->name);
        double total = 0, loss = 0;
        for (int64_t e = 0; e < Ex; e++) total += cnt[e];
        for (int64_t e = 0; e < Ex; e++) f[e] = total > 0 ? (float)(cnt[e] / total) : 0.0f;
        float dl = t->op == PDDE_OP_MOE_AUX_LOSS_BACK ? F32(t->src[2])[0] * (float)Ex / (float)(N ? N : 1) : 0.0f;
        for (int64_t n = 0; n < N; n++) {
            moe_scores(F32(lt) + n * Ex, Ex, false, p);
            double pf = 0;
            for (int64_t e = 0; e < Ex; e++) pf += (double)p[e] * f[e];
            if (t->op == PDDE_OP_MOE_AUX_LOSS) { loss += pf; continue; }
            float *d = F32(t) + n * Ex; /* softmax's Jacobian applied to E f / N */
            for (int64_t e = 0; e < Ex; e++) d[e] = dl * p[e] * (f[e] - (float)pf);
        }
        if (t->op == PDDE_OP_MOE_AUX_LOSS) F32(t)[0] = N ? (float)(Ex * loss / N) : 0.0f;
        free(f);
        return PDDE_OK;
    }
    default: return pdde_error(ctx, PDDE_ERR_UNSUPPORTED, "cpu: op %s (%s) is not a MoE op", pdde_op_name(t->op), t->name);
    }
}
