/* backends/cpu_attention.c — fused causal attention on the CPU (PDDE_OP_ATTENTION and its backward),
 * flash-attention style: keys are visited in tiles with an online softmax, so no [T, T] matrix of
 * scores or probabilities exists; the forward saves each row's logsumexp and the backward recomputes
 * the probabilities of one tile at a time from it. The tile products are GEMMs (attention_gemm).
 * Included by cpu.c.
 *
 * Layouts: q, k, v [BH, T, D]; the forward's output y [BH, T, D + 1] (the attention output, then the
 * row's logsumexp); the backward's output [3, BH, T, D] (dq, dk, dv). y, dy and the output are f32.
 * Packed (pdde_attention_qkv): q, k, v strided in qkv [B, T, H*3*D] (row stride 3HD, head h at column
 * 3hD, k and v D and 2D after q), y and dy [B, T, H*D] (row stride HD) with the logsumexp [BH, T] after
 * y, and dqkv in qkv's layout: the tile GEMMs take the row strides as their leading dimensions.
 *
 * Documents (pdde_attention_docs): query i of batch row b sees keys attention_lo(i) .. i only; the tiles
 * mask the keys before it, and a tile no row of which sees a key is never computed.
 *
 * Mixed precision: q, k, v may be bf16 or f16 (all three alike). Row statistics, the softmax and every
 * accumulation stay f32. bf16 runs oneDNN's bf16 GEMM on the tiles, as flash attention does on a GPU:
 * the probabilities (and dS, dO) are rounded to bf16 to be its operands. Where that GEMM is missing,
 * and for f16 (oneDNN has no f16 GEMM on these CPUs), the head's rows are widened to f32 and the f32
 * tile GEMMs run (attention_operands). */

/* Tiles of 128 x 128 (64 KB of scores) ran the T = 1024 pass in about 7% less CPU time than 64 x 64
 * (make bench-attention); -D overrides them for such comparisons. */
#ifndef ATT_BR
#define ATT_BR 128 /* query rows of a tile */
#endif
#ifndef ATT_BC
#define ATT_BC 128 /* keys of a tile */
#endif

static void half_to_f32(const uint16_t *h, float *f, int64_t n, pdde_dtype dt);
static void f32_to_half(const float *f, uint16_t *h, int64_t n, pdde_dtype dt);

#ifdef PDDE_HAVE_DNNL
/* oneDNN's bf16 GEMM, row-major like dnnl_sgemm, bf16 A and B, f32 accumulation and C: exported by
 * libdnnl (its own tests declare it) but not in dnnl.h. Weak, so that a oneDNN without it leaves it
 * NULL (attention_bf16_gemm_works) and the widening path runs. */
dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t M, dnnl_dim_t N, dnnl_dim_t K, float alpha,
                                    const uint16_t *A, dnnl_dim_t lda, const uint16_t *B, dnnl_dim_t ldb, float beta,
                                    float *C, dnnl_dim_t ldc) __attribute__((weak));
#endif

/* Whether the bf16 tile GEMM runs here: present and implemented for this processor (oneDNN returns
 * unimplemented without AVX-512). Asked on a 1x1 product once per node, on one OpenMP thread. */
static bool attention_bf16_gemm_works(void) {
#ifdef PDDE_HAVE_DNNL
    const uint16_t one = 0x3f80; /* 1.0 */
    float c = 0.0f;
    return dnnl_gemm_bf16bf16f32 && dnnl_gemm_bf16bf16f32('N', 'N', 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1) == dnnl_success &&
           c == 1.0f;
#else
    return false;
#endif
}

/* The tile GEMMs, C = alpha op(A) op(B) + beta C with operands of gemm_dt: f32 through oneDNN's sgemm
 * (its JIT kernels, single-threaded on the pool thread) where the build has it, else gemm_rows_acc
 * (OpenBLAS or the portable loop); bf16 through oneDNN's bf16 GEMM. Returns 0, or -1 when that failed. */
static int attention_gemm(pdde_dtype gemm_dt, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const void *A,
                          int64_t lda, const void *B, int64_t ldb, float beta, float *C, int64_t ldc) {
#ifdef PDDE_HAVE_DNNL
    if (gemm_dt == PDDE_BF16)
        return dnnl_gemm_bf16bf16f32(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success ? 0 : -1;
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success) return 0;
#endif
    if (gemm_dt != PDDE_F32) return -1;
    gemm_rows_acc(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return 0;
}

/* oneDNN's sgemm threads with OpenMP: one thread on each pool thread (as cpu_onednn.c runs it), the
 * calling thread's own setting given back after. */
static int attention_threads_enter(void) {
#if defined(PDDE_HAVE_DNNL) && DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    int prev = omp_get_max_threads();
    onednn_one_thread();
    return prev;
#else
    return 1;
#endif
}
static void attention_threads_leave(int prev) {
#if defined(PDDE_HAVE_DNNL) && DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    omp_set_num_threads(prev);
#else
    (void)prev;
#endif
}

typedef struct {
    const void *q, *k, *v;   /* of dtype dt */
    const float *y, *dy;     /* the forward's output and its gradient (backward only) */
    float *out;
    pdde_dtype dt, gemm_dt;  /* q, k, v's; the tile GEMMs' operands' (f32, or bf16 for bf16 inputs) */
    int64_t BH, T, D, n_qtiles;
    int64_t H;               /* packed: heads a batch row (0: q, k, v [BH, T, D] apart) */
    int64_t heads;           /* heads a batch row, in either layout */
    const int32_t *starts;   /* [B, T]: each query's first key (pdde_attention_docs), or NULL: key 0 */
    float scale;
    int oom;                 /* a task could not allocate its scratch */
    int gemm_failed;         /* a tile GEMM returned an error */
} attention_job;

/* Element offset of head bh's first row in q (k, v: their own pointers) and in dq, dk, dv (which: 0, 1, 2),
 * its row stride; of y's, its row stride; and its row i's logsumexp */
static int64_t attention_in_head(const attention_job *j, int64_t bh) {
    return j->H ? (bh / j->H) * j->T * 3 * j->H * j->D + (bh % j->H) * 3 * j->D : bh * j->T * j->D;
}
static int64_t attention_ld_in(const attention_job *j) { return j->H ? 3 * j->H * j->D : j->D; }
static float *attention_grad_head(const attention_job *j, int64_t bh, int which) {
    return j->out + attention_in_head(j, bh) + which * (j->H ? j->D : j->BH * j->T * j->D);
}
static int64_t attention_y_head(const attention_job *j, int64_t bh) {
    return j->H ? (bh / j->H) * j->T * j->H * j->D + (bh % j->H) * j->D : bh * j->T * (j->D + 1);
}
static int64_t attention_ld_y(const attention_job *j) { return j->H ? j->H * j->D : j->D + 1; }
static float *attention_lse(const attention_job *j, float *y, int64_t bh, int64_t i) {
    return j->H ? y + j->BH * j->T * j->D + bh * j->T + i : y + attention_y_head(j, bh) + i * (j->D + 1) + j->D;
}

/* The first key query i of head bh sees */
static int64_t attention_lo(const attention_job *j, int64_t bh, int64_t i) {
    if (!j->starts) return 0;
    int64_t lo = j->starts[bh / j->heads * j->T + i];
    return lo < 0 ? 0 : lo > i ? i : lo;
}

/* A task's scratch: f32 and 2-byte pieces carved from one allocation, each 64-byte aligned. */
typedef struct { char *base; size_t used; } attention_scratch;
static void *attention_carve(attention_scratch *s, int64_t n, size_t elem) {
    void *p = s->base ? s->base + s->used : NULL;
    s->used += ((size_t)n * elem + 63) / 64 * 64;
    return p;
}

/* Head bh of q, k, v as GEMM operands (gemm_dt) in op[0..2]: the tensors themselves where their dtype
 * is the GEMM's, else rows [rows[i][0], rows[i][1]) of each widened to f32 into wide[i] (at the rows'
 * own offsets, so that the caller indexes both alike). */
static int64_t attention_operands(const attention_job *j, int64_t bh, const int64_t rows[3][2], float *const wide[3],
                                  const void *op[3]) {
    const void *src[3] = {j->q, j->k, j->v};
    size_t es = pdde_dtype_size(j->dt);
    int64_t head = attention_in_head(j, bh), ld = attention_ld_in(j);
    for (int i = 0; i < 3; i++) {
        if (j->dt == j->gemm_dt) { op[i] = (const char *)src[i] + (size_t)head * es; continue; }
        for (int64_t r = rows[i][0]; r < rows[i][1]; r++) /* (widened rows are [T, D], stride D) */
            half_to_f32((const uint16_t *)src[i] + head + r * ld, wide[i] + r * j->D, j->D, j->dt);
        op[i] = wide[i];
    }
    return j->dt == j->gemm_dt ? ld : j->D; /* the operands' row stride */
}

/* An f32 tile as a GEMM operand: itself, or rounded to bf16 into lowp */
static const void *attention_tile_operand(const attention_job *j, const float *x, int64_t n, uint16_t *lowp) {
    if (j->gemm_dt == PDDE_F32) return x;
    f32_to_half(x, lowp, n, PDDE_BF16);
    return lowp;
}

/* Element offset e of a GEMM operand of dtype dt */
static const void *attention_at(const void *p, pdde_dtype dt, int64_t e) {
    return (const char *)p + (size_t)e * pdde_dtype_size(dt);
}

/* Query tile of task row r: light and heavy tiles alternate (tile 0, the last, 1, the one before...)
 * so that the contiguous ranges parallel_for hands the threads carry about equal causal work. */
static int64_t attention_qtile(int64_t r, int64_t n) { return r % 2 == 0 ? r / 2 : n - 1 - r / 2; }

/* Forward: one task per (query tile, batch*head), see attention_qtile for the order. */
static void attention_task(void *arg, int64_t begin, int64_t end) {
    attention_job *j = arg;
    int64_t T = j->T, D = j->D, ldy = attention_ld_y(j);
    bool widen = j->dt != j->gemm_dt, lowp = j->gemm_dt != PDDE_F32;
    attention_scratch sc = {0};
    float *S = NULL, *w = NULL;
    int64_t *lo = NULL; /* each row's first key */
    uint16_t *Slowp = NULL;
    for (int pass = 0; pass < 2; pass++) { /* the size (no base yet), then the pieces */
        if (pass && !(sc = (attention_scratch){.base = malloc(sc.used)}).base) { __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED); return; }
        S = attention_carve(&sc, ATT_BR * ATT_BC + ATT_BR * D + 2 * ATT_BR, sizeof(float));
        lo = attention_carve(&sc, ATT_BR, sizeof(int64_t));
        Slowp = attention_carve(&sc, lowp ? ATT_BR * ATT_BC : 0, sizeof(uint16_t));
        w = attention_carve(&sc, widen ? 3 * T * D : 0, sizeof(float));
    }
    float *acc = S + ATT_BR * ATT_BC, *mx = acc + ATT_BR * D, *sum = mx + ATT_BR;
    float *wide[3] = {w, widen ? w + T * D : NULL, widen ? w + 2 * T * D : NULL};
    int omp_prev = attention_threads_enter(), failed = 0;
    for (int64_t t = begin; t < end && !failed; t++) {
        int64_t bh = t % j->BH, i0 = attention_qtile(t / j->BH, j->n_qtiles) * ATT_BR;
        int64_t br = T - i0 < ATT_BR ? T - i0 : ATT_BR;
        const int64_t rows[3][2] = {{i0, i0 + br}, {0, i0 + br}, {0, i0 + br}}; /* the tile's queries, the keys they see */
        const void *op[3];
        int64_t ld = attention_operands(j, bh, rows, wide, op);
        pdde_dtype gd = j->gemm_dt;
        const void *q = attention_at(op[0], gd, i0 * ld), *k = op[1], *v = op[2];
        int64_t first = i0; /* the first key a row of the tile sees */
        for (int64_t r = 0; r < br; r++) {
            mx[r] = -INFINITY, sum[r] = 0.0f, lo[r] = attention_lo(j, bh, i0 + r);
            if (lo[r] < first) first = lo[r];
        }
        memset(acc, 0, sizeof(float) * (size_t)(br * D));
        for (int64_t j0 = first / ATT_BC * ATT_BC; j0 < i0 + br && !failed; j0 += ATT_BC) { /* keys up to the tile's last row */
            int64_t bc = i0 + br - j0 < ATT_BC ? i0 + br - j0 : ATT_BC;
            failed |= attention_gemm(gd, 0, 1, br, bc, D, 1.0f, q, ld, attention_at(k, gd, j0 * ld), ld, 0.0f, S, bc);
            for (int64_t r = 0; r < br; r++) {
                float *s = S + r * bc;
                int64_t valid = i0 + r - j0 + 1, c0 = lo[r] - j0; /* row i sees keys lo..i: columns c0..valid-1 */
                if (valid > bc) valid = bc;
                if (c0 < 0) c0 = 0;
                if (valid <= c0) { memset(s, 0, sizeof(float) * (size_t)bc); continue; }
                float m = mx[r];
                for (int64_t c = c0; c < valid; c++) s[c] *= j->scale, m = s[c] > m ? s[c] : m;
                float alpha = exp_fast(mx[r] - m), l = 0.0f; /* rescales what earlier tiles summed */
                for (int64_t c = c0; c < valid; c++) l += (s[c] = exp_fast(s[c] - m));
                for (int64_t c = 0; c < c0; c++) s[c] = 0.0f;
                for (int64_t c = valid; c < bc; c++) s[c] = 0.0f;
                sum[r] = sum[r] * alpha + l, mx[r] = m;
                if (alpha != 1.0f)
                    for (int64_t d = 0; d < D; d++) acc[r * D + d] *= alpha;
            }
            const void *p = attention_tile_operand(j, S, br * bc, Slowp);
            failed |= attention_gemm(gd, 0, 0, br, D, bc, 1.0f, p, bc, attention_at(v, gd, j0 * ld), ld, 1.0f, acc, D);
        }
        float *y = j->out + attention_y_head(j, bh) + i0 * ldy;
        for (int64_t r = 0; r < br; r++) {
            float inv = 1.0f / sum[r];
            for (int64_t d = 0; d < D; d++) y[r * ldy + d] = acc[r * D + d] * inv;
            *attention_lse(j, j->out, bh, i0 + r) = mx[r] + logf(sum[r]);
        }
    }
    attention_threads_leave(omp_prev);
    if (failed) __atomic_store_n(&j->gemm_failed, 1, __ATOMIC_RELAXED);
    free(sc.base);
}

/* Backward of one batch*head per task. For each key tile (outer) and the query tiles that see it:
 * P = exp(q k^T * scale - lse), dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
 * dQ += scale dS K, dK += scale dS^T Q. The task owns its head's dq, so nothing is shared. */
static void attention_back_task(void *arg, int64_t begin, int64_t end) {
    attention_job *j = arg;
    int64_t T = j->T, D = j->D, Dy = attention_ld_y(j), ldg = attention_ld_in(j);
    bool widen = j->dt != j->gemm_dt, lowp = j->gemm_dt != PDDE_F32;
    attention_scratch sc = {0};
    float *P = NULL, *w = NULL;
    int64_t *lo = NULL; /* each query's first key, then each query tile's least */
    uint16_t *Plowp = NULL;
    for (int pass = 0; pass < 2; pass++) { /* the size (no base yet), then the pieces */
        if (pass && !(sc = (attention_scratch){.base = malloc(sc.used)}).base) { __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED); return; }
        P = attention_carve(&sc, 2 * ATT_BR * ATT_BC + T, sizeof(float));
        lo = attention_carve(&sc, T + j->n_qtiles, sizeof(int64_t));
        Plowp = attention_carve(&sc, lowp ? 2 * ATT_BR * ATT_BC + T * D : 0, sizeof(uint16_t));
        w = attention_carve(&sc, widen ? 3 * T * D : 0, sizeof(float));
    }
    float *dP = P + ATT_BR * ATT_BC, *rowdot = dP + ATT_BR * ATT_BC;
    float *wide[3] = {w, widen ? w + T * D : NULL, widen ? w + 2 * T * D : NULL};
    uint16_t *dPlowp = lowp ? Plowp + ATT_BR * ATT_BC : NULL, *dOlowp = lowp ? Plowp + 2 * ATT_BR * ATT_BC : NULL;
    pdde_dtype gd = j->gemm_dt;
    int omp_prev = attention_threads_enter(), failed = 0;
    for (int64_t bh = begin; bh < end && !failed; bh++) {
        const int64_t rows[3][2] = {{0, T}, {0, T}, {0, T}};
        const void *op[3];
        int64_t ld = attention_operands(j, bh, rows, wide, op);
        const void *q = op[0], *k = op[1], *v = op[2];
        const float *y = j->y + attention_y_head(j, bh), *dy = j->dy + attention_y_head(j, bh); /* dO: dy's first D columns */
        /* dO as a GEMM operand: dy itself (row stride Dy), or its bf16 rounding [T, D] */
        const void *dO = dy;
        int64_t ldo = Dy;
        if (lowp) {
            for (int64_t i = 0; i < T; i++) f32_to_half(dy + i * Dy, dOlowp + i * D, D, PDDE_BF16);
            dO = dOlowp, ldo = D;
        }
        float *dq = attention_grad_head(j, bh, 0), *dk = attention_grad_head(j, bh, 1), *dv = attention_grad_head(j, bh, 2);
        for (int64_t i = 0; i < T; i++) {
            memset(dq + i * ldg, 0, sizeof(float) * (size_t)D);
            memset(dk + i * ldg, 0, sizeof(float) * (size_t)D);
            memset(dv + i * ldg, 0, sizeof(float) * (size_t)D);
        }
        for (int64_t i = 0; i < T; i++) { /* of the dO the GEMMs read, so that dP - rowdot cancels as it should */
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += (lowp ? pdde_bf16_to_f32(dOlowp[i * D + d]) : dy[i * Dy + d]) * y[i * Dy + d];
            rowdot[i] = s;
        }
        int64_t *tile_lo = lo + T;
        for (int64_t i = 0; i < T; i++) {
            lo[i] = attention_lo(j, bh, i);
            if (i % ATT_BR == 0 || lo[i] < tile_lo[i / ATT_BR]) tile_lo[i / ATT_BR] = lo[i];
        }
        for (int64_t j0 = 0; j0 < T; j0 += ATT_BC) {
            int64_t bc = T - j0 < ATT_BC ? T - j0 : ATT_BC;
            for (int64_t i0 = j0 / ATT_BR * ATT_BR; i0 < T && !failed; i0 += ATT_BR) { /* rows i >= j0 */
                int64_t br = T - i0 < ATT_BR ? T - i0 : ATT_BR;
                if (tile_lo[i0 / ATT_BR] >= j0 + bc) continue; /* no row of the tile sees these keys */
                const void *qi = attention_at(q, gd, i0 * ld), *kj = attention_at(k, gd, j0 * ld), *doi = attention_at(dO, gd, i0 * ldo);
                failed |= attention_gemm(gd, 0, 1, br, bc, D, 1.0f, qi, ld, kj, ld, 0.0f, P, bc);
                failed |= attention_gemm(gd, 0, 1, br, bc, D, 1.0f, doi, ldo, attention_at(v, gd, j0 * ld), ld, 0.0f, dP, bc);
                for (int64_t r = 0; r < br; r++) {
                    int64_t i = i0 + r, valid = i - j0 + 1, c0 = lo[i] - j0; /* row i sees columns c0..valid-1 */
                    if (valid > bc) valid = bc;
                    float lse = *attention_lse(j, (float *)j->y, bh, i), *p = P + r * bc, *dp = dP + r * bc;
                    for (int64_t c = 0; c < bc; c++) {
                        float pc = c >= c0 && c < valid ? exp_fast(p[c] * j->scale - lse) : 0.0f;
                        p[c] = pc;
                        dp[c] = pc * (dp[c] - rowdot[i]);
                    }
                }
                const void *p = attention_tile_operand(j, P, br * bc, Plowp), *ds = attention_tile_operand(j, dP, br * bc, dPlowp);
                failed |= attention_gemm(gd, 1, 0, bc, D, br, 1.0f, p, bc, doi, ldo, 1.0f, dv + j0 * ldg, ldg);
                failed |= attention_gemm(gd, 0, 0, br, D, bc, j->scale, ds, bc, kj, ld, 1.0f, dq + i0 * ldg, ldg);
                failed |= attention_gemm(gd, 1, 0, bc, D, br, j->scale, ds, bc, qi, ld, 1.0f, dk + j0 * ldg, ldg);
            }
        }
    }
    attention_threads_leave(omp_prev);
    if (failed) __atomic_store_n(&j->gemm_failed, 1, __ATOMIC_RELAXED);
    free(sc.base);
}

static pdde_status cpu_attention(pdde_context *ctx, pdde_threadpool *pool, pdde_tensor *t) {
    bool back = t->op == PDDE_OP_ATTENTION_BACK;
    const pdde_tensor *q = t->src[0];
    int64_t B, H, T, D;
    int packed;
    pdde_attention_dims(t, &B, &H, &T, &D, &packed);
    size_t es = pdde_dtype_size(q->dtype);
    const char *qb = (const char *)F32(q);
    attention_job j = {.q = qb, .k = packed ? (const void *)(qb + D * es) : (const void *)F32(t->src[1]),
                       .v = packed ? (const void *)(qb + 2 * D * es) : (const void *)F32(t->src[2]), .out = F32(t), .dt = q->dtype,
                       .gemm_dt = PDDE_F32, .scale = pdde_op_f32(t, PDDE_P_ATTENTION_SCALE)};
    j.BH = B * H, j.T = T, j.D = D, j.H = packed ? H : 0, j.heads = H;
    const pdde_tensor *starts = pdde_attention_starts(t);
    j.starts = starts ? I32(starts) : NULL;
    j.n_qtiles = (j.T + ATT_BR - 1) / ATT_BR;
    if (j.BH * j.T == 0) return PDDE_OK;
    if (j.dt == PDDE_BF16) {
        int omp_prev = attention_threads_enter();
        if (attention_bf16_gemm_works()) j.gemm_dt = PDDE_BF16;
        attention_threads_leave(omp_prev);
    }
    if (back) {
        j.y = F32(t->src[packed ? 1 : 3]), j.dy = F32(t->src[packed ? 2 : 4]);
        parallel_for(pool, j.BH, 2, attention_back_task, &j);
    } else {
        parallel_for(pool, j.BH * j.n_qtiles, 2, attention_task, &j);
    }
    if (j.oom) return pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory for the attention tiles", t->name);
    if (j.gemm_failed) return pdde_error(ctx, PDDE_ERR_BACKEND, "%s: a %s tile GEMM of the attention failed (oneDNN)", t->name, pdde_dtype_name(j.gemm_dt));
    pdde_dtype cdt = (pdde_dtype)pdde_op_i32(t, PDDE_P_ATTENTION_LOWP_COPY);
    if (packed && cdt) /* the output rounded as a cast, beside it (lowering's PDDE_ATT_LOWP) */
        f32_to_half(F32(t), (uint16_t *)((char *)F32(t) + pdde_lowp_copy_offset(t)), pdde_tensor_numel(t), cdt);
    return PDDE_OK;
}
