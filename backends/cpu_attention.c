/* backends/cpu_attention.c — fused causal attention on the CPU (PDDE_OP_ATTENTION and its backward),
 * flash-attention style: keys are visited in tiles with an online softmax, so no [T, T] matrix of
 * scores or probabilities exists; the forward saves each row's logsumexp and the backward recomputes
 * the probabilities of one tile at a time from it. The tile products are GEMMs (attention_gemm).
 * Included by cpu.c.
 *
 * Layouts: q, k, v [BH, T, D]; the forward's output y [BH, T, D + 1] (the attention output, then the
 * row's logsumexp); the backward's output [3, BH, T, D] (dq, dk, dv). */

/* Tiles of 128 x 128 (64 KB of scores) ran the T = 1024 pass in about 7% less CPU time than 64 x 64
 * (make bench-attention); -D overrides them for such comparisons. */
#ifndef ATT_BR
#define ATT_BR 128 /* query rows of a tile */
#endif
#ifndef ATT_BC
#define ATT_BC 128 /* keys of a tile */
#endif

/* The tile GEMMs: oneDNN's sgemm (its JIT kernels, single-threaded on the pool thread) where the build
 * has it, else gemm_rows_acc (OpenBLAS or the portable loop). */
static void attention_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
#ifdef PDDE_HAVE_DNNL
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success) return;
#endif
    gemm_rows_acc(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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
    const float *q, *k, *v, *y, *dy; /* y, dy: the forward's output and its gradient (backward only) */
    float *out;
    int64_t BH, T, D, n_qtiles;
    float scale;
    int oom; /* a task could not allocate its scratch */
} attention_job;

/* Query tile of task row r: light and heavy tiles alternate (tile 0, the last, 1, the one before...)
 * so that the contiguous ranges parallel_for hands the threads carry about equal causal work. */
static int64_t attention_qtile(int64_t r, int64_t n) { return r % 2 == 0 ? r / 2 : n - 1 - r / 2; }

/* Forward: one task per (query tile, batch*head), see attention_qtile for the order. */
static void attention_task(void *arg, int64_t begin, int64_t end) {
    attention_job *j = arg;
    int64_t T = j->T, D = j->D, Dy = D + 1;
    float *S = malloc(sizeof(float) * (size_t)(ATT_BR * ATT_BC + ATT_BR * D + 2 * ATT_BR));
    if (!S) { __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED); return; }
    float *acc = S + ATT_BR * ATT_BC, *mx = acc + ATT_BR * D, *sum = mx + ATT_BR;
    int omp_prev = attention_threads_enter();
    for (int64_t t = begin; t < end; t++) {
        int64_t bh = t % j->BH, i0 = attention_qtile(t / j->BH, j->n_qtiles) * ATT_BR;
        int64_t br = T - i0 < ATT_BR ? T - i0 : ATT_BR;
        const float *q = j->q + (bh * T + i0) * D, *k = j->k + bh * T * D, *v = j->v + bh * T * D;
        for (int64_t r = 0; r < br; r++) mx[r] = -INFINITY, sum[r] = 0.0f;
        memset(acc, 0, sizeof(float) * (size_t)(br * D));
        for (int64_t j0 = 0; j0 < i0 + br; j0 += ATT_BC) { /* keys up to the tile's last row */
            int64_t bc = i0 + br - j0 < ATT_BC ? i0 + br - j0 : ATT_BC;
            attention_gemm(0, 1, br, bc, D, 1.0f, q, D, k + j0 * D, D, 0.0f, S, bc);
            for (int64_t r = 0; r < br; r++) {
                float *s = S + r * bc;
                int64_t valid = i0 + r - j0 + 1; /* row i sees keys 0..i */
                if (valid > bc) valid = bc;
                if (valid <= 0) { memset(s, 0, sizeof(float) * (size_t)bc); continue; }
                float m = mx[r];
                for (int64_t c = 0; c < valid; c++) s[c] *= j->scale, m = s[c] > m ? s[c] : m;
                float alpha = exp_fast(mx[r] - m), l = 0.0f; /* rescales what earlier tiles summed */
                for (int64_t c = 0; c < valid; c++) l += (s[c] = exp_fast(s[c] - m));
                for (int64_t c = valid; c < bc; c++) s[c] = 0.0f;
                sum[r] = sum[r] * alpha + l, mx[r] = m;
                if (alpha != 1.0f)
                    for (int64_t d = 0; d < D; d++) acc[r * D + d] *= alpha;
            }
            attention_gemm(0, 0, br, D, bc, 1.0f, S, bc, v + j0 * D, D, 1.0f, acc, D);
        }
        float *y = (float *)j->out + (bh * T + i0) * Dy;
        for (int64_t r = 0; r < br; r++) {
            float inv = 1.0f / sum[r];
            for (int64_t d = 0; d < D; d++) y[r * Dy + d] = acc[r * D + d] * inv;
            y[r * Dy + D] = mx[r] + logf(sum[r]);
        }
    }
    attention_threads_leave(omp_prev);
    free(S);
}

/* Backward of one batch*head per task. For each key tile (outer) and the query tiles that see it:
 * P = exp(q k^T * scale - lse), dV += P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
 * dQ += scale dS K, dK += scale dS^T Q. The task owns its head's dq, so nothing is shared. */
static void attention_back_task(void *arg, int64_t begin, int64_t end) {
    attention_job *j = arg;
    int64_t T = j->T, D = j->D, Dy = D + 1, n = j->BH * T * D;
    float *P = malloc(sizeof(float) * (size_t)(2 * ATT_BR * ATT_BC + T));
    if (!P) { __atomic_store_n(&j->oom, 1, __ATOMIC_RELAXED); return; }
    float *dP = P + ATT_BR * ATT_BC, *rowdot = dP + ATT_BR * ATT_BC;
    int omp_prev = attention_threads_enter();
    for (int64_t bh = begin; bh < end; bh++) {
        const float *q = j->q + bh * T * D, *k = j->k + bh * T * D, *v = j->v + bh * T * D;
        const float *y = j->y + bh * T * Dy, *dy = j->dy + bh * T * Dy; /* dO: dy's first D columns */
        float *dq = j->out + bh * T * D, *dk = dq + n, *dv = dk + n;
        memset(dq, 0, sizeof(float) * (size_t)(T * D));
        memset(dk, 0, sizeof(float) * (size_t)(T * D));
        memset(dv, 0, sizeof(float) * (size_t)(T * D));
        for (int64_t i = 0; i < T; i++) {
            float s = 0.0f;
            for (int64_t d = 0; d < D; d++) s += dy[i * Dy + d] * y[i * Dy + d];
            rowdot[i] = s;
        }
        for (int64_t j0 = 0; j0 < T; j0 += ATT_BC) {
            int64_t bc = T - j0 < ATT_BC ? T - j0 : ATT_BC;
            for (int64_t i0 = j0 / ATT_BR * ATT_BR; i0 < T; i0 += ATT_BR) { /* rows i >= j0 */
                int64_t br = T - i0 < ATT_BR ? T - i0 : ATT_BR;
                attention_gemm(0, 1, br, bc, D, 1.0f, q + i0 * D, D, k + j0 * D, D, 0.0f, P, bc);
                attention_gemm(0, 1, br, bc, D, 1.0f, dy + i0 * Dy, Dy, v + j0 * D, D, 0.0f, dP, bc);
                for (int64_t r = 0; r < br; r++) {
                    int64_t i = i0 + r, valid = i - j0 + 1;
                    if (valid > bc) valid = bc;
                    float lse = y[i * Dy + D], *p = P + r * bc, *dp = dP + r * bc;
                    for (int64_t c = 0; c < bc; c++) {
                        float pc = c < valid ? exp_fast(p[c] * j->scale - lse) : 0.0f;
                        p[c] = pc;
                        dp[c] = pc * (dp[c] - rowdot[i]);
                    }
                }
                attention_gemm(1, 0, bc, D, br, 1.0f, P, bc, dy + i0 * Dy, Dy, 1.0f, dv + j0 * D, D);
                attention_gemm(0, 0, br, D, bc, j->scale, dP, bc, k + j0 * D, D, 1.0f, dq + i0 * D, D);
                attention_gemm(1, 0, bc, D, br, j->scale, dP, bc, q + i0 * D, D, 1.0f, dk + j0 * D, D);
            }
        }
    }
    attention_threads_leave(omp_prev);
    free(P);
}

static pdde_status cpu_attention(pdde_context *ctx, pdde_threadpool *pool, pdde_tensor *t) {
    bool back = t->op == PDDE_OP_ATTENTION_BACK;
    const pdde_tensor *q = t->src[0];
    attention_job j = {.q = F32(q), .k = F32(t->src[1]), .v = F32(t->src[2]), .out = F32(t),
                       .scale = pdde_op_f32(t, PDDE_P_ATTENTION_SCALE)};
    j.BH = q->shape[0] * q->shape[1], j.T = q->shape[2], j.D = q->shape[3];
    j.n_qtiles = (j.T + ATT_BR - 1) / ATT_BR;
    if (j.BH * j.T == 0) return PDDE_OK;
    if (back) {
        j.y = F32(t->src[3]), j.dy = F32(t->src[4]);
        parallel_for(pool, j.BH, 2, attention_back_task, &j);
    } else {
        parallel_for(pool, j.BH * j.n_qtiles, 2, attention_task, &j);
    }
    return j.oom ? pdde_error(ctx, PDDE_ERR_OOM, "%s: out of memory for the attention tiles", t->name) : PDDE_OK;
}
