/* cuda_flash_f32.cuh — the CUDA backend's f32 tiled causal attention (path flash on f32 q, k, v), included
 * by backends/cuda_kernels.cu (after cuda_att_layout.cuh) and by tests/flash_emu.cpp, which runs these
 * functions on the CPU (PDDE_FLASH_EMU) against a float64 reference.
 *
 * FlashAttention-2's schedule as the bf16 kernels of backends/cuda_flash.cuh have it, in f32 FMAs on the
 * SIMT cores (no TF32: PyTorch's f32 numerics with TF32 off): the forward a block per query tile walking
 * key tiles with an online softmax, keeping each row's logsumexp; the backward dq a block per query tile
 * (over the key tiles it sees) and dk, dv a block per key tile (over the query tiles that see it), with
 * P recomputed from the logsumexp and rowsum(dO * O) from k_flash_rowdot: no atomics, deterministic.
 * Key tiles past a query tile's last row are not visited (the causal half's work is skipped).
 *
 * Every product is a small GEMM between shared-memory tiles (rows padded by 4 floats) into registers: a
 * thread takes RT consecutive rows and columns cg + CG j of a score tile (so that a quarter warp reads
 * eight different rows: no bank conflicts), and RT rows by columns in float4 chunks of an output tile;
 * operands are read 4 floats at a time along the reduction dimension, so no tile is stored transposed.
 * The threads of a row are CG consecutive lanes: row statistics combine by shuffles. Row and tile
 * counts: backends/flash_f32_tiles.h. */
#include "flash_f32_tiles.h"

#define FF_T PDDE_FF_THREADS
#define FF_LOG2E 1.4426950408889634f
/* the shared memory of each kernel (floats): forward Q [BQ], K and V [BK] rows (pitch D + 4) and P [BQ, BK + 4];
 * dq Q, dO [BQ], K, V [BK = BQ] and dS; dk, dv K, V [BK], Q, dO [BQ = BK], P^T and dS^T */
#define FF_FWD_BK(D) ((D) == 64 ? 32 : 16)
#define FF_SMEM_FWD(D) (PDDE_FF_FWD_ROWS(D) * ((D) + 4) + 2 * FF_FWD_BK(D) * ((D) + 4) + PDDE_FF_FWD_ROWS(D) * (FF_FWD_BK(D) + 4))
#define FF_SMEM_DQ(D) (4 * PDDE_FF_BWD_ROWS(D) * ((D) + 4) + PDDE_FF_BWD_ROWS(D) * (PDDE_FF_BWD_ROWS(D) + 4))
#define FF_SMEM_DKV(D) (4 * PDDE_FF_BWD_ROWS(D) * ((D) + 4) + 2 * PDDE_FF_BWD_ROWS(D) * (PDDE_FF_BWD_ROWS(D) + 4))

__device__ __forceinline__ float4 ff_ld4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ float ff_at(const float4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

/* rows [row0, row0 + n) of a head (row stride ld floats; rows 16-byte aligned) into tile (pitch D + 4), zeros past T */
template <int D>
__device__ __forceinline__ void ff_load(float *tile, const float *head, long long ld, long long row0, long long T, int n) {
    constexpr int V = D / 4;
    for (int e = threadIdx.x; e < n * V; e += FF_T) {
        int r = e / V, c = (e % V) * 4;
        long long gr = row0 + r;
        float4 x = gr < T ? ff_ld4(head + gr * ld + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(float4 *)(tile + r * (D + 4) + c) = x;
    }
}
/* the same a float at a time, for rows that are not 16-byte aligned (y's gradient: row stride D + 1 apart) */
template <int D>
__device__ __forceinline__ void ff_load1(float *tile, const float *head, long long ld, long long row0, long long T, int n) {
    for (int e = threadIdx.x; e < n * D; e += FF_T) {
        int r = e / D, c = e % D;
        long long gr = row0 + r;
        tile[r * (D + 4) + c] = gr < T ? head[gr * ld + c] : 0.0f;
    }
}

/* acc[i][j] += sum_{d < K} a[i lda + d] b[j sb + d] (the thread's rows of a and of b) */
template <int R, int C, int K>
__device__ __forceinline__ void ff_nt(float (&acc)[R][C], const float *a, int lda, const float *b, int sb) {
#pragma unroll 4
    for (int d = 0; d < K; d += 4) {
        float4 x[R], y[C];
#pragma unroll
        for (int i = 0; i < R; i++) x[i] = ff_ld4(a + i * lda + d);
#pragma unroll
        for (int j = 0; j < C; j++) y[j] = ff_ld4(b + j * sb + d);
#pragma unroll
        for (int i = 0; i < R; i++)
#pragma unroll
            for (int j = 0; j < C; j++) {
                float s = acc[i][j];
                s = fmaf(x[i].x, y[j].x, s), s = fmaf(x[i].y, y[j].y, s);
                s = fmaf(x[i].z, y[j].z, s), s = fmaf(x[i].w, y[j].w, s);
                acc[i][j] = s;
            }
    }
}
/* acc[i][4 c + e] += sum_{k < K} a[i lda + k] b[k ldb + c cs + e] (b's columns in NC chunks of 4, cs apart) */
template <int R, int NC, int K>
__device__ __forceinline__ void ff_nn(float (&acc)[R][4 * NC], const float *a, int lda, const float *b, int ldb, int cs) {
#pragma unroll 2
    for (int k = 0; k < K; k += 4) {
        float4 x[R];
#pragma unroll
        for (int i = 0; i < R; i++) x[i] = ff_ld4(a + i * lda + k);
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int c = 0; c < NC; c++) {
                float4 y = ff_ld4(b + (k + kk) * ldb + c * cs);
#pragma unroll
                for (int i = 0; i < R; i++) {
                    float s = ff_at(x[i], kk);
                    acc[i][4 * c] = fmaf(s, y.x, acc[i][4 * c]), acc[i][4 * c + 1] = fmaf(s, y.y, acc[i][4 * c + 1]);
                    acc[i][4 * c + 2] = fmaf(s, y.z, acc[i][4 * c + 2]), acc[i][4 * c + 3] = fmaf(s, y.w, acc[i][4 * c + 3]);
                }
            }
    }
}

/* acc[i][4 c + e] += sum_{k < K} a[k lda + i] b[k ldb + c cs + e] (a stored transposed: its rows are the reduction's) */
template <int R, int NC, int K>
__device__ __forceinline__ void ff_tn(float (&acc)[R][4 * NC], const float *a, int lda, const float *b, int ldb, int cs) {
#pragma unroll 4
    for (int k = 0; k < K; k++) {
        float x[R];
#pragma unroll
        for (int i = 0; i < R; i++) x[i] = a[k * lda + i];
#pragma unroll
        for (int c = 0; c < NC; c++) {
            float4 y = ff_ld4(b + k * ldb + c * cs);
#pragma unroll
            for (int i = 0; i < R; i++) {
                acc[i][4 * c] = fmaf(x[i], y.x, acc[i][4 * c]), acc[i][4 * c + 1] = fmaf(x[i], y.y, acc[i][4 * c + 1]);
                acc[i][4 * c + 2] = fmaf(x[i], y.z, acc[i][4 * c + 2]), acc[i][4 * c + 3] = fmaf(x[i], y.w, acc[i][4 * c + 3]);
            }
        }
    }
}

/* a thread's accumulator tile set to zero */
template <int R, int C>
__device__ __forceinline__ void ff_zero(float (&acc)[R][C]) {
#pragma unroll
    for (int i = 0; i < R; i++)
#pragma unroll
        for (int j = 0; j < C; j++) acc[i][j] = 0.0f;
}

/* A backward step's two score tiles, the thread's RT rows (from rg RT on) by SC columns (cg + CG j): s = A B^T
 * and dp = dA dB^T, a, da and b, db tiles of pitch D + 4 (dq's S = Q K^T and dP = dO V^T; dk and dv's
 * S^T = K Q^T and dP^T = V dO^T) */
template <int RT, int SC, int CG, int D>
__device__ __forceinline__ void ff_s_dp(float (&s)[RT][SC], float (&dp)[RT][SC], const float *a, const float *da, const float *b,
                                        const float *db, int rg, int cg) {
    constexpr int LD = D + 4;
    ff_zero(s), ff_zero(dp);
    ff_nt<RT, SC, D>(s, a + rg * RT * LD, LD, b + cg * LD, CG * LD);
    ff_nt<RT, SC, D>(dp, da + rg * RT * LD, LD, db + cg * LD, CG * LD);
}

/* y (and its logsumexp: att_y, att_lse) of the query tile of block blockIdx.x (the late, heavy tiles first) */
template <int D>
__device__ __forceinline__ void ff_fwd(float *sm, const float *q, const float *k, const float *v, float *y, long long BH, long long T,
                                       float scale, long long H) {
    constexpr int BQ = PDDE_FF_FWD_ROWS(D), BK = FF_FWD_BK(D), RT = 4, RG = BQ / RT, CG = FF_T / RG, SC = BK / CG,
                  NC = D / (4 * CG), LD = D + 4, LP = BK + 4;
    static_assert(RG * CG == FF_T && SC * CG == BK && NC * 4 * CG == D && CG <= 32, "the forward's thread layout");
    float *qs = sm, *ks = qs + BQ * LD, *vs = ks + BK * LD, *ps = vs + BK * LD;
    long long tiles = (T + BQ - 1) / BQ, bh = blockIdx.x / tiles, qt = tiles - 1 - blockIdx.x % tiles;
    long long ldi = H ? 3 * H * D : D, hb = att_in(bh * T, T, D, H);
    const float *qb = q + hb, *kb = k + hb, *vb = v + hb;
    int rg = threadIdx.x / CG, cg = threadIdx.x % CG;
    long long q0 = qt * BQ, row0 = q0 + rg * RT, kend = q0 + BQ < T ? q0 + BQ : T;
    ff_load<D>(qs, qb, ldi, q0, T, BQ);
    float o[RT][4 * NC], m[RT], l[RT], sl2 = scale * FF_LOG2E;
    ff_zero(o);
#pragma unroll
    for (int i = 0; i < RT; i++) m[i] = -INFINITY, l[i] = 0.0f;
    for (long long k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads(); /* (the previous tile's readers are done) */
        ff_load<D>(ks, kb, ldi, k0, T, BK);
        ff_load<D>(vs, vb, ldi, k0, T, BK);
        __syncthreads();
        float s[RT][SC];
        ff_zero(s);
        ff_nt<RT, SC, D>(s, qs + rg * RT * LD, LD, ks + cg * LD, CG * LD);
#pragma unroll
        for (int i = 0; i < RT; i++) {
            float mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < SC; j++) {
                long long col = k0 + cg + CG * j;
                s[i][j] = col > row0 + i ? -INFINITY : s[i][j] * sl2; /* causal (and every key past T is past the row) */
                mx = fmaxf(mx, s[i][j]);
            }
#pragma unroll
            for (int off = 1; off < CG; off <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            float mn = fmaxf(m[i], mx), alpha = exp2f(m[i] - mn); /* (key 0 is in every row's first tile: mn is finite) */
            m[i] = mn, l[i] *= alpha;
#pragma unroll
            for (int c = 0; c < 4 * NC; c++) o[i][c] *= alpha;
#pragma unroll
            for (int j = 0; j < SC; j++) {
                float p = exp2f(s[i][j] - mn);
                l[i] += p;
                ps[(rg * RT + i) * LP + cg + CG * j] = p;
            }
        }
        __syncthreads();
        ff_nn<RT, NC, BK>(o, ps + rg * RT * LP, LP, vs + cg * 4, LD, 4 * CG);
    }
#pragma unroll
    for (int i = 0; i < RT; i++) {
#pragma unroll
        for (int off = 1; off < CG; off <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], off);
        long long row = row0 + i;
        if (row >= T) continue;
        float *yr = y + att_y(bh * T + row, T, D, H), inv = 1.0f / l[i];
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) yr[c * 4 * CG + cg * 4 + e] = o[i][4 * c + e] * inv;
        if (cg == 0) y[att_lse(bh * T + row, BH * T, D, H)] = (m[i] + log2f(l[i])) / FF_LOG2E;
    }
}

/* dq (out, att_out 0) of the query tile of block blockIdx.x: over the key tiles it sees, S = Q K^T and
 * dP = dO V^T, P = exp2(S scale log2e - lse log2e), dS = P (dP - rowdot), dq += dS K (scaled at the end) */
template <int D>
__device__ __forceinline__ void ff_dq(float *sm, const float *q, const float *k, const float *v, const float *y, const float *dy,
                                      const float *rowdot, float *out, long long BH, long long T, float scale, long long H) {
    constexpr int BQ = PDDE_FF_BWD_ROWS(D), BK = BQ, RT = D == 64 ? 4 : 2, RG = BQ / RT, CG = FF_T / RG, SC = BK / CG,
                  NC = D / (4 * CG), LD = D + 4, LP = BK + 4;
    static_assert(RG * CG == FF_T && SC * CG == BK && NC * 4 * CG == D && CG <= 32, "dq's thread layout");
    float *qs = sm, *dos = qs + BQ * LD, *ks = dos + BQ * LD, *vs = ks + BK * LD, *dss = vs + BK * LD;
    long long tiles = (T + BQ - 1) / BQ, bh = blockIdx.x / tiles, qt = tiles - 1 - blockIdx.x % tiles;
    long long ldi = H ? 3 * H * D : D, ldy = H ? H * D : D + 1, hb = att_in(bh * T, T, D, H);
    const float *qb = q + hb, *kb = k + hb, *vb = v + hb;
    int rg = threadIdx.x / CG, cg = threadIdx.x % CG;
    long long q0 = qt * BQ, row0 = q0 + rg * RT, kend = q0 + BQ < T ? q0 + BQ : T;
    ff_load<D>(qs, qb, ldi, q0, T, BQ);
    ff_load1<D>(dos, dy + att_y(bh * T, T, D, H), ldy, q0, T, BQ);
    float lse2[RT], dot[RT], dq[RT][4 * NC], sl2 = scale * FF_LOG2E;
    ff_zero(dq);
#pragma unroll
    for (int i = 0; i < RT; i++) {
        long long row = row0 + i;
        lse2[i] = row < T ? y[att_lse(bh * T + row, BH * T, D, H)] * FF_LOG2E : 0.0f;
        dot[i] = row < T ? rowdot[bh * T + row] : 0.0f;
    }
    for (long long k0 = 0; k0 < kend; k0 += BK) {
        __syncthreads();
        ff_load<D>(ks, kb, ldi, k0, T, BK);
        ff_load<D>(vs, vb, ldi, k0, T, BK);
        __syncthreads();
        float s[RT][SC], dp[RT][SC];
        ff_s_dp<RT, SC, CG, D>(s, dp, qs, dos, ks, vs, rg, cg);
#pragma unroll
        for (int i = 0; i < RT; i++)
#pragma unroll
            for (int j = 0; j < SC; j++) {
                long long col = k0 + cg + CG * j;
                float p = col > row0 + i ? 0.0f : exp2f(s[i][j] * sl2 - lse2[i]);
                dss[(rg * RT + i) * LP + cg + CG * j] = p * (dp[i][j] - dot[i]); /* dS / scale */
            }
        __syncthreads();
        ff_nn<RT, NC, BK>(dq, dss + rg * RT * LP, LP, ks + cg * 4, LD, 4 * CG);
    }
#pragma unroll
    for (int i = 0; i < RT; i++) {
        long long row = row0 + i;
        if (row >= T) continue;
        float *o = out + att_out(bh * T + row, 0, BH * T, T, D, H);
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[c * 4 * CG + cg * 4 + e] = scale * dq[i][4 * c + e];
    }
}

/* dk, dv (out, att_out 1 and 2) of the key tile of block blockIdx.x: over the query tiles from its first key
 * on, S^T = K Q^T and dP^T = V dO^T, P^T from the queries' logsumexp, dS^T = P^T (dP^T - rowdot),
 * dv += P^T dO, dk += dS^T Q (scaled at the end). ONEPASS (path flash2): also dq += dS K of each query tile,
 * added to out (att_out 0, zeroed before: k_flash_f32_zero_dq) with atomicAdd, so that no dq kernel
 * recomputes S and dP (five products instead of seven; dq's sum order then depends on timing); blocks
 * tile-major (key tile blockIdx.x / BH, the one with the most queries first), the heads of a tile apart. */
template <int D, bool ONEPASS>
__device__ __forceinline__ void ff_dkv(float *sm, const float *q, const float *k, const float *v, const float *y, const float *dy,
                                       const float *rowdot, float *out, long long BH, long long T, float scale, long long H) {
    constexpr int BK = PDDE_FF_BWD_ROWS(D), BQ = BK, RT = D == 64 ? 4 : 2, RG = BK / RT, CG = FF_T / RG, SC = BQ / CG,
                  NC = D / (4 * CG), LD = D + 4, LP = BQ + 4;
    static_assert(RG * CG == FF_T && SC * CG == BQ && NC * 4 * CG == D && CG <= 32, "dk, dv's thread layout");
    float *ks = sm, *vs = ks + BK * LD, *qs = vs + BK * LD, *dos = qs + BQ * LD, *pss = dos + BQ * LD, *dss = pss + BK * LP;
    __shared__ float lse_s[BQ], dot_s[BQ];
    long long tiles = (T + BK - 1) / BK, bh = ONEPASS ? blockIdx.x % BH : blockIdx.x / tiles;
    long long kt = ONEPASS ? blockIdx.x / BH : tiles - 1 - blockIdx.x % tiles;
    long long ldi = H ? 3 * H * D : D, ldy = H ? H * D : D + 1, hb = att_in(bh * T, T, D, H);
    const float *qb = q + hb, *kb = k + hb, *vb = v + hb, *dyb = dy + att_y(bh * T, T, D, H);
    int rg = threadIdx.x / CG, cg = threadIdx.x % CG;
    long long k0 = kt * BK, key0 = k0 + rg * RT;
    ff_load<D>(ks, kb, ldi, k0, T, BK);
    ff_load<D>(vs, vb, ldi, k0, T, BK);
    float dk[RT][4 * NC], dv[RT][4 * NC], sl2 = scale * FF_LOG2E;
    ff_zero(dk), ff_zero(dv);
    for (long long i0 = k0; i0 < T; i0 += BQ) {
        __syncthreads(); /* (the previous tile's readers are done) */
        ff_load<D>(qs, qb, ldi, i0, T, BQ);
        ff_load1<D>(dos, dyb, ldy, i0, T, BQ);
        if (threadIdx.x < BQ) {
            long long r = i0 + threadIdx.x;
            lse_s[threadIdx.x] = r < T ? y[att_lse(bh * T + r, BH * T, D, H)] * FF_LOG2E : 0.0f;
            dot_s[threadIdx.x] = r < T ? rowdot[bh * T + r] : 0.0f;
        }
        __syncthreads();
        float s[RT][SC], dp[RT][SC];
        ff_s_dp<RT, SC, CG, D>(s, dp, ks, vs, qs, dos, rg, cg);
#pragma unroll
        for (int i = 0; i < RT; i++)
#pragma unroll
            for (int j = 0; j < SC; j++) {
                int ci = cg + CG * j;
                long long col = i0 + ci;
                float p = col < key0 + i || col >= T ? 0.0f : exp2f(s[i][j] * sl2 - lse_s[ci]);
                pss[(rg * RT + i) * LP + ci] = p;
                dss[(rg * RT + i) * LP + ci] = p * (dp[i][j] - dot_s[ci]); /* dS^T / scale */
            }
        __syncthreads();
        ff_nn<RT, NC, BQ>(dv, pss + rg * RT * LP, LP, dos + cg * 4, LD, 4 * CG);
        ff_nn<RT, NC, BQ>(dk, dss + rg * RT * LP, LP, qs + cg * 4, LD, 4 * CG);
        if constexpr (ONEPASS) { /* dq of queries i0 + rg RT + i: sum over the tile's keys of dS^T[key][query] K[key] */
            float dq[RT][4 * NC];
            ff_zero(dq);
            ff_tn<RT, NC, BK>(dq, dss + rg * RT, LP, ks + cg * 4, LD, 4 * CG);
#pragma unroll
            for (int i = 0; i < RT; i++) {
                long long r = i0 + rg * RT + i;
                if (r >= T) continue;
                float *o = out + att_out(bh * T + r, 0, BH * T, T, D, H);
#pragma unroll
                for (int c = 0; c < NC; c++)
#pragma unroll
                    for (int e = 0; e < 4; e++) atomicAdd(o + c * 4 * CG + cg * 4 + e, scale * dq[i][4 * c + e]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < RT; i++) {
        long long key = key0 + i;
        if (key >= T) continue;
        float *ok = out + att_out(bh * T + key, 1, BH * T, T, D, H), *ov = out + att_out(bh * T + key, 2, BH * T, T, D, H);
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int e = 0; e < 4; e++) ok[c * 4 * CG + cg * 4 + e] = scale * dk[i][4 * c + e], ov[c * 4 * CG + cg * 4 + e] = dv[i][4 * c + e];
    }
}
