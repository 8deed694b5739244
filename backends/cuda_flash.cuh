/* cuda_flash.cuh — the tensor-core causal attention of the CUDA backend (FlashAttention-2's schedule),
 * included by backends/cuda_kernels.cu for compute capability 8.0 and later, and by
 * tests/flash_emu.cpp, which runs these functions on the CPU with the warp-level primitives emulated
 * after the PTX manual (PDDE_FLASH_EMU) to check the fragment bookkeeping where there is no GPU.
 *
 * bf16 tensor cores (mma.sync m16n8k16, f32 accumulation), fragments loaded with ldmatrix from shared
 * tiles whose rows are padded by 16 bytes (no bank conflicts). A block of 4 warps takes 64 rows (16 a
 * warp) of one head; head sizes 64 and 128 are compiled in. The m16n8 accumulator layout of S is the
 * A-fragment layout of the next product, so P and dS go from registers to the tensor cores as bf16.
 * Row statistics use base-2 exponentials with log2(e) folded into the scale. With starts (pdde_attention_docs:
 * each query's first key, att_lo) the pairs before a query's first key are masked too, and the tiles no row of
 * the block sees are skipped: key tiles before the block's least first key (forward, dq), query tiles whose
 * first keys all lie past the block's keys (dk, dv). */
#define FL_WARPS 4
#define FL_ROWS 64 /* rows a block: pgd_ctx.flash_rows of the CUDA backend (flash_threads = 32 * FL_WARPS) */
#define FL_LOG2E 1.4426950408889634f

#ifndef PDDE_FLASH_EMU
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* four 8x8 b16 matrices: lane l gives the address of row l % 8 of matrix l / 8 */
__device__ __forceinline__ void ldsm4(uint32_t r[4], const uint16_t *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldsm4t(uint32_t r[4], const uint16_t *p) {
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
/* two f32 as bf16x2, round to nearest even; lo in the low half (the lower column of a fragment) */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif

/* The ldmatrix address of lane for the 16x16 block at (r0, c0) of a tile with row pitch ld: rows r0 + lane % 16,
 * columns c0 + 8 (lane / 16). Non-transposed: A fragments (a 16x16 block), or B fragments of two 8-row
 * n-tiles ({r0, r2} and {r1, r3}); transposed (k-major B): two 8-column n-tiles ({r0, r1}, {r2, r3}). */
__device__ __forceinline__ const uint16_t *fl_at(const uint16_t *tile, int ld, int r0, int c0, int lane) {
    return tile + (r0 + (lane & 15)) * ld + c0 + (lane >> 4) * 8;
}

/* The A operand of m16n8k16 from a row's two n-tiles 2 kk, 2 kk + 1 of an accumulator tile (16 columns, its
 * 16 x 16 block kk), rounded to bf16 */
template <int NT>
__device__ __forceinline__ void fl_pack_a(uint32_t a[4], const float (&s)[NT][4], int kk) {
    a[0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]), a[1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
    a[2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]), a[3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}
/* A backward step's score tiles over the reduction's 16-wide slice kk: s += A B^T and dp += C E^T for the
 * warp's 16 rows (fragments a, c) and NT n-tiles of 8 columns, B and E read from the shared tiles bt, et
 * (pitch ld) by ldmatrix (dq's S = Q K^T and dP = dO V^T; dk and dv's S^T = K Q^T and dP^T = V dO^T) */
template <int NT>
__device__ __forceinline__ void fl_s_dp(float (&s)[NT][4], float (&dp)[NT][4], const uint32_t a[4], const uint32_t c[4], const uint16_t *bt,
                                        const uint16_t *et, int ld, int kk, int lane) {
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
        uint32_t b[4], e[4];
        ldsm4(b, fl_at(bt, ld, n * 8, kk * 16, lane));
        ldsm4(e, fl_at(et, ld, n * 8, kk * 16, lane));
        mma16816(s[n], a, b[0], b[2]);
        mma16816(s[n + 1], a, b[1], b[3]);
        mma16816(dp[n], c, e[0], e[2]);
        mma16816(dp[n + 1], c, e[1], e[3]);
    }
}

/* acc += S B for the warp's 16 rows: S an accumulator tile of NT n-tiles (A operands by fl_pack_a, 16 of its
 * columns at a time), B the shared tile bt's NT * 8 rows (pitch ld) read transposed by ldmatrix, acc DT n-tiles of
 * 8 columns (the forward's o += P V, dq's dq += dS K) */
template <int NT, int DT>
__device__ __forceinline__ void fl_acc_sb(float (&acc)[DT][4], const float (&s)[NT][4], const uint16_t *bt, int ld, int lane) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t a[4];
        fl_pack_a(a, s, kk);
#pragma unroll
        for (int d = 0; d < DT; d += 2) {
            uint32_t b[4];
            ldsm4t(b, fl_at(bt, ld, kk * 16, d * 8, lane));
            mma16816(acc[d], a, b[0], b[1]);
            mma16816(acc[d + 1], a, b[2], b[3]);
        }
    }
}

/* rows [row0, row0 + n) of a bf16 [T, D] head (row stride ld) into a shared tile (pitch D + 8), zeros past T;
 * 16-byte moves */
template <int D>
__device__ __forceinline__ void fl_load(uint16_t *tile, const uint16_t *src, long long row0, long long T, int n, long long ld) {
    constexpr int V = D / 8;
    for (int e = threadIdx.x; e < n * V; e += 32 * FL_WARPS) {
        int r = e / V, c = (e % V) * 8;
        long long gr = row0 + r;
        uint4 v = gr < T ? *(const uint4 *)(src + gr * ld + c) : make_uint4(0, 0, 0, 0);
        *(uint4 *)(tile + r * (D + 8) + c) = v;
    }
}
/* the same from an f32 output gradient (row stride ld), rounded to bf16 */
template <int D>
__device__ __forceinline__ void fl_load_f32(uint16_t *tile, const float *src, long long row0, long long T, int n, long long ld) {
    for (int e = threadIdx.x; e < n * (D / 2); e += 32 * FL_WARPS) {
        int r = e / (D / 2), c = (e % (D / 2)) * 2;
        long long gr = row0 + r;
        float a = gr < T ? src[gr * ld + c] : 0.0f, b = gr < T ? src[gr * ld + c + 1] : 0.0f;
        *(uint32_t *)(tile + r * (D + 8) + c) = pack_bf16(a, b);
    }
}

/* The shared memory of a flash kernel of head size D (bf16 elements): the most of its tiles (two 64-row
 * tiles and, backward, two of the query tiles of flash_dkv: 32 rows at D 64, 16 at D 128) */
#define FL_SMEM(D) (2 * FL_ROWS * ((D) + 8) + 2 * ((D) == 64 ? 32 : 16) * ((D) + 8))

/* One key tile of the forward for a warp's 16 query rows (this thread's: row0, row0 + 8), flash's and flash2's:
 * S = Q K^T on the tensor cores (qf: Q's fragments), scaled to base 2 and masked causally (every key past T is past
 * the row), the running max m and sum l and the output o rescaled to the new max, P = exp2(S - m) summed into l, and
 * o += P V. ks, vs: the tile's BK keys and values in shared memory (rows of D + 8); kt: the tile's index. DOCS (with
 * starts): keys before the rows' first keys lo0, lo1 masked too, so a row may have seen no key yet (its max still -inf). */
template <int D, int BK, bool DOCS = false>
__device__ __forceinline__ void fl_fwd_key_tile(float (&o)[D / 8][4], float (&m)[2], float (&l)[2], const uint32_t (&qf)[D / 16][4],
                                                const uint16_t *ks, const uint16_t *vs, long long kt, long long row0, float sl2, int lane,
                                                int lo0 = 0, int lo1 = 0) {
    constexpr int LD = D + 8, NT = BK / 8, DT = D / 8, KS = D / 16;
    int t4 = lane & 3;
    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            uint32_t b[4];
            ldsm4(b, fl_at(ks, LD, n * 8, kk * 16, lane));
            mma16816(s[n], qf[kk], b[0], b[2]);
            mma16816(s[n + 1], qf[kk], b[1], b[3]);
        }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            long long col = kt * BK + n * 8 + t4 * 2 + (e & 1), row = row0 + (e >> 1) * 8;
            float x = s[n][e] * sl2;
            s[n][e] = col > row || (DOCS && col < (e >> 1 ? lo1 : lo0)) ? -INFINITY : x;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
    float mb[2]; /* the max the exponentials subtract: 0 while a row has seen no key (-inf - -inf would be NaN) */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        float mn = fmaxf(m[r], mx[r]);
        mb[r] = DOCS && mn == -INFINITY ? 0.0f : mn;
        float alpha = exp2f(m[r] - mb[r]); /* (m = -inf at first: alpha 0) */
        m[r] = mn;
        l[r] *= alpha;
#pragma unroll
        for (int d = 0; d < DT; d++) o[d][2 * r] *= alpha, o[d][2 * r + 1] *= alpha;
    }
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s[n][e] = exp2f(s[n][e] - mb[e >> 1]);
            l[e >> 1] += s[n][e];
        }
    fl_acc_sb(o, s, vs, LD, lane);
}

/* The first keys (att_lo) of a block's N query rows from row0 of head bh into lo_s (rows past T: T), written by
 * its first N threads (N at most the block's threads); read after the next barrier */
template <int N = FL_ROWS>
__device__ __forceinline__ void fl_row_los(int *lo_s, const int *starts, long long bh, long long row0, long long T, long long heads) {
    if (threadIdx.x < N) {
        long long row = row0 + threadIdx.x;
        lo_s[threadIdx.x] = row < T ? (int)att_lo(starts, bh * T + row, T, heads) : (int)T;
    }
}
/* after it: the least of them (the block's first key) */
template <int N = FL_ROWS>
__device__ __forceinline__ int fl_least_lo(const int *lo_s) {
    int least = lo_s[0];
    for (int r = 1; r < N; r++) least = lo_s[r] < least ? lo_s[r] : least;
    return least;
}

template <int D>
__device__ __forceinline__ void flash_fwd(uint16_t *sm, const uint16_t *q, const uint16_t *k, const uint16_t *v, float *y,
                                          long long BH, long long T, float scale, long long H, uint16_t *ycp = nullptr,
                                          const int *starts = nullptr, long long heads = 1) {
    constexpr int LD = D + 8, BK = 64, DT = D / 8, KS = D / 16;
    uint16_t *ks = sm, *vs = sm + BK * LD;
    long long tiles = (T + FL_ROWS - 1) / FL_ROWS, bh = blockIdx.x / tiles, qt = tiles - 1 - blockIdx.x % tiles;
    /* (layouts: att_in, att_y of cuda_kernels.cu; H = 0 heads apart, H > 0 packed qkv) */
    long long ldi = H ? 3 * H * D : D, hb = att_in(bh * T, T, D, H);
    const uint16_t *qb = q + hb, *kb = k + hb, *vb = v + hb;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    __shared__ int lo_s[FL_ROWS];
    fl_load<D>(ks, qb, qt * FL_ROWS, T, FL_ROWS, ldi); /* Q through the K tile, into registers */
    if (starts) fl_row_los(lo_s, starts, bh, qt * FL_ROWS, T, heads);
    __syncthreads();
    uint32_t qf[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) ldsm4(qf[kk], fl_at(ks, LD, warp * 16, kk * 16, lane));
    __syncthreads();
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, sl2 = scale * FL_LOG2E;
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    long long row0 = qt * FL_ROWS + warp * 16 + g; /* this thread's rows: row0, row0 + 8 */
    int lo0 = starts ? lo_s[warp * 16 + g] : 0, lo1 = starts ? lo_s[warp * 16 + g + 8] : 0;
    for (long long kt = starts ? fl_least_lo(lo_s) / BK : 0; kt <= qt; kt++) {
        fl_load<D>(ks, kb, kt * BK, T, BK, ldi);
        fl_load<D>(vs, vb, kt * BK, T, BK, ldi);
        __syncthreads();
        fl_fwd_key_tile<D, BK, true>(o, m, l, qf, ks, vs, kt, row0, sl2, lane, lo0, lo1);
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        long long row = row0 + r * 8;
        if (row >= T) continue;
        float *yr = y + att_y(bh * T + row, T, D, H), inv = 1.0f / l[r];
#pragma unroll
        for (int d = 0; d < DT; d++) yr[d * 8 + t4 * 2] = o[d][2 * r] * inv, yr[d * 8 + t4 * 2 + 1] = o[d][2 * r + 1] * inv;
        if (ycp) { /* (y rounded to bf16 beside it, as a cast of y would) */
            uint16_t *cr = ycp + att_y(bh * T + row, T, D, H);
#pragma unroll
            for (int d = 0; d < DT; d++) *(uint32_t *)(cr + d * 8 + t4 * 2) = pack_bf16(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
        }
        if (t4 == 0) y[att_lse(bh * T + row, BH * T, D, H)] = (m[r] + log2f(l[r])) / FL_LOG2E;
    }
}

/* dq of a block's 64 query rows: over key tiles of 32, S = Q K^T and dP = dO V^T on the tensor cores,
 * dS = P (dP - rowdot) with P from the saved logsumexp, dq += dS K. */
template <int D>
__device__ __forceinline__ void flash_dq(uint16_t *sm, const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *y,
                                         const float *dy, const float *rowdot, float *out, long long BH, long long T, float scale,
                                         long long H, uint16_t *cp = nullptr, const int *starts = nullptr, long long heads = 1) {
    constexpr int LD = D + 8, BK = 32, NT = BK / 8, DT = D / 8, KS = D / 16;
    uint16_t *ks = sm, *vs = sm + FL_ROWS * LD; /* (Q and dO pass through these first) */
    long long tiles = (T + FL_ROWS - 1) / FL_ROWS, bh = blockIdx.x / tiles, qt = tiles - 1 - blockIdx.x % tiles;
    long long ldi = H ? 3 * H * D : D, ldy = H ? H * D : D + 1, hb = att_in(bh * T, T, D, H);
    const uint16_t *qb = q + hb, *kb = k + hb, *vb = v + hb;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    __shared__ int lo_s[FL_ROWS];
    fl_load<D>(ks, qb, qt * FL_ROWS, T, FL_ROWS, ldi);
    fl_load_f32<D>(vs, dy + att_y(bh * T, T, D, H), qt * FL_ROWS, T, FL_ROWS, ldy);
    if (starts) fl_row_los(lo_s, starts, bh, qt * FL_ROWS, T, heads);
    __syncthreads();
    uint32_t qf[KS][4], df[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) ldsm4(qf[kk], fl_at(ks, LD, warp * 16, kk * 16, lane)), ldsm4(df[kk], fl_at(vs, LD, warp * 16, kk * 16, lane));
    __syncthreads();
    long long row0 = qt * FL_ROWS + warp * 16 + g;
    float lse2[2], dot[2], dq[DT][4], sl2 = scale * FL_LOG2E;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        long long row = row0 + r * 8;
        lse2[r] = row < T ? y[att_lse(bh * T + row, BH * T, D, H)] * FL_LOG2E : 0.0f;
        dot[r] = row < T ? rowdot[bh * T + row] : 0.0f;
    }
#pragma unroll
    for (int d = 0; d < DT; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    long long kend = qt * FL_ROWS + FL_ROWS < T ? qt * FL_ROWS + FL_ROWS : T;
    int lo[2] = {starts ? lo_s[warp * 16 + g] : 0, starts ? lo_s[warp * 16 + g + 8] : 0};
    for (long long k0 = starts ? fl_least_lo(lo_s) / BK * BK : 0; k0 < kend; k0 += BK) {
        fl_load<D>(ks, kb, k0, T, BK, ldi);
        fl_load<D>(vs, vb, k0, T, BK, ldi);
        __syncthreads();
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) fl_s_dp(s, dp, qf[kk], df[kk], ks, vs, LD, kk, lane);
        /* the rows' last and first keys from the tile's first: 32-bit compares of the column in the tile (64-bit
         * ones of the column took 32 more registers: 3 blocks an SM, not 4) */
        int last[2] = {(int)(row0 - k0), (int)(row0 + 8 - k0)}, first[2] = {lo[0] - (int)k0, lo[1] - (int)k0};
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = n * 8 + t4 * 2 + (e & 1);
                float p = c > last[e >> 1] || c < first[e >> 1] ? 0.0f : exp2f(s[n][e] * sl2 - lse2[e >> 1]);
                s[n][e] = p * (dp[n][e] - dot[e >> 1]); /* dS / scale */
            }
        fl_acc_sb(dq, s, ks, LD, lane);
        __syncthreads();
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        long long row = row0 + r * 8;
        if (row >= T) continue;
        float *o = out + att_out(bh * T + row, 0, BH * T, T, D, H);
#pragma unroll
        for (int d = 0; d < DT; d++) o[d * 8 + t4 * 2] = scale * dq[d][2 * r], o[d * 8 + t4 * 2 + 1] = scale * dq[d][2 * r + 1];
        if (cp) { /* (dq rounded to bf16 beside the gradient, at the same place) */
            uint16_t *c = cp + att_out(bh * T + row, 0, BH * T, T, D, H);
#pragma unroll
            for (int d = 0; d < DT; d++) *(uint32_t *)(c + d * 8 + t4 * 2) = pack_bf16(scale * dq[d][2 * r], scale * dq[d][2 * r + 1]);
        }
    }
}

/* dk, dv of a block's 64 key rows: over the query tiles that see them (BQ rows, from the block's first
 * key on), S^T = K Q^T and dP^T = V dO^T, P^T from the queries' logsumexp, dS^T = P^T (dP^T - rowdot),
 * dv += P^T dO, dk += dS^T Q. */
template <int D>
__device__ __forceinline__ void flash_dkv(uint16_t *sm, const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *y,
                                          const float *dy, const float *rowdot, float *out, long long BH, long long T, float scale,
                                          long long H, uint16_t *cp = nullptr, const int *starts = nullptr, long long heads = 1) {
    constexpr int LD = D + 8, BQ = D == 64 ? 32 : 16, NT = BQ / 8, DT = D / 8, KS = D / 16;
    uint16_t *ks = sm, *vs = sm + FL_ROWS * LD, *qs = vs + FL_ROWS * LD, *dos = qs + BQ * LD;
    __shared__ float lse_s[BQ], dot_s[BQ];
    __shared__ int lo_s[BQ]; /* the query tile's first keys */
    long long tiles = (T + FL_ROWS - 1) / FL_ROWS, bh = blockIdx.x / tiles, kt = tiles - 1 - blockIdx.x % tiles;
    long long ldi = H ? 3 * H * D : D, ldy = H ? H * D : D + 1, hb = att_in(bh * T, T, D, H);
    const uint16_t *qb = q + hb, *kb = k + hb, *vb = v + hb;
    const float *dyb = dy + att_y(bh * T, T, D, H);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    fl_load<D>(ks, kb, kt * FL_ROWS, T, FL_ROWS, ldi);
    fl_load<D>(vs, vb, kt * FL_ROWS, T, FL_ROWS, ldi);
    long long key0 = kt * FL_ROWS + warp * 16 + g; /* this thread's keys: key0, key0 + 8 */
    float dk[DT][4], dv[DT][4], sl2 = scale * FL_LOG2E;
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    long long klast = (kt * FL_ROWS + FL_ROWS < T ? kt * FL_ROWS + FL_ROWS : T) - 1;
    for (long long i0 = kt * FL_ROWS; i0 < T; i0 += BQ) {
        __syncthreads(); /* (the previous tile's readers are done) */
        if (starts) { /* (a query tile none of whose rows sees the block's keys is skipped, by every thread alike) */
            int lo = (int)T;
            if (threadIdx.x < BQ && i0 + threadIdx.x < T) lo = (int)att_lo(starts, bh * T + i0 + threadIdx.x, T, heads);
            if (threadIdx.x < BQ) lo_s[threadIdx.x] = lo;
            if (!__syncthreads_or(lo <= klast)) continue;
        } else if (threadIdx.x < BQ) {
            lo_s[threadIdx.x] = 0;
        }
        fl_load<D>(qs, qb, i0, T, BQ, ldi);
        fl_load_f32<D>(dos, dyb, i0, T, BQ, ldy);
        if (threadIdx.x < BQ) {
            long long i = i0 + threadIdx.x;
            lse_s[threadIdx.x] = i < T ? y[att_lse(bh * T + i, BH * T, D, H)] * FL_LOG2E : 0.0f;
            dot_s[threadIdx.x] = i < T ? rowdot[bh * T + i] : 0.0f;
        }
        __syncthreads();
        float s[NT][4], dp[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t a[4], c[4];
            ldsm4(a, fl_at(ks, LD, warp * 16, kk * 16, lane));
            ldsm4(c, fl_at(vs, LD, warp * 16, kk * 16, lane));
            fl_s_dp(s, dp, a, c, qs, dos, LD, kk, lane);
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int ci = n * 8 + t4 * 2 + (e & 1);
                long long col = i0 + ci, key = key0 + (e >> 1) * 8;
                float p = col < key || col >= T || lo_s[ci] > key ? 0.0f : exp2f(s[n][e] * sl2 - lse_s[ci]);
                s[n][e] = p;
                dp[n][e] = p * (dp[n][e] - dot_s[ci]); /* dS^T / scale */
            }
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t a[4];
            fl_pack_a(a, s, kk);
            uint32_t c[4];
            fl_pack_a(c, dp, kk);
#pragma unroll
            for (int d = 0; d < DT; d += 2) {
                uint32_t b[4], e[4];
                ldsm4t(b, fl_at(dos, LD, kk * 16, d * 8, lane));
                ldsm4t(e, fl_at(qs, LD, kk * 16, d * 8, lane));
                mma16816(dv[d], a, b[0], b[1]);
                mma16816(dv[d + 1], a, b[2], b[3]);
                mma16816(dk[d], c, e[0], e[1]);
                mma16816(dk[d + 1], c, e[2], e[3]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        long long key = key0 + r * 8;
        if (key >= T) continue;
        float *ok = out + att_out(bh * T + key, 1, BH * T, T, D, H), *ov = out + att_out(bh * T + key, 2, BH * T, T, D, H);
#pragma unroll
        for (int d = 0; d < DT; d++) {
            ok[d * 8 + t4 * 2] = scale * dk[d][2 * r], ok[d * 8 + t4 * 2 + 1] = scale * dk[d][2 * r + 1];
            ov[d * 8 + t4 * 2] = dv[d][2 * r], ov[d * 8 + t4 * 2 + 1] = dv[d][2 * r + 1];
        }
        if (cp) { /* (dk, dv rounded to bf16 beside the gradient, at the same places) */
            uint16_t *ck = cp + att_out(bh * T + key, 1, BH * T, T, D, H), *cv = cp + att_out(bh * T + key, 2, BH * T, T, D, H);
#pragma unroll
            for (int d = 0; d < DT; d++) {
                *(uint32_t *)(ck + d * 8 + t4 * 2) = pack_bf16(scale * dk[d][2 * r], scale * dk[d][2 * r + 1]);
                *(uint32_t *)(cv + d * 8 + t4 * 2) = pack_bf16(dv[d][2 * r], dv[d][2 * r + 1]);
            }
        }
    }
}

