/* cuda_flash2.cuh — the CUDA backend's second tensor-core attention backward (path flash2), included after
 * backends/cuda_flash.cuh (whose mma, ldmatrix, fragment-address and packing helpers it uses) by
 * backends/cuda_kernels.cu for compute capability 8.0 and later, and by tests/flash_emu.cpp, which runs
 * it on the CPU with the warp-level primitives emulated (PDDE_FLASH_EMU).
 *
 * FlashAttention-2's backward schedule: one pass over the (key tile, query tile) pairs of the causal
 * triangle, where the first path (flash_dq + flash_dkv) takes two and recomputes S and dP in both.
 *  - flash2_prep, a warp per row: dO rounded to bf16 into a contiguous [rows, D] scratch (the 16-byte
 *    copies below need it; y's gradient has the logsumexp column, stride D + 1), and per row its
 *    logsumexp in base 2 and rowsum(dO * O), the softmax backward's correction.
 *  - flash2_bwd, a block of 4 warps per 64 keys of a head (16 a warp), the heavy early key tiles first:
 *    V (and at D 64 also K) as A fragments in registers, dK and dV accumulated in registers over the
 *    query tiles from the block's first key on (BQ rows each, copied with cp.async into double buffers so
 *    that the next tile's copy overlaps this tile's products). Per tile: S^T = K Q^T, dP^T = V dO^T,
 *    P^T = exp2(S^T scale log2e - lse2), dS^T = P^T (dP^T - rowdot), dV += P^T dO, dK += dS^T Q; dS^T
 *    goes to shared memory as bf16 and the block adds dQ += dS K to the f32 output with atomicAdd
 *    (the dispatcher zeroes dq first). The sum order of dq depends on timing: not bit-reproducible.
 * Shared memory stays under the 48 KiB of a static allocation: BQ is 32 at D 64, 16 at D 128.
 * The variants PDDE_FLASH2_VARIANT picks (backends/README.md): flash2_bwd with 8 warps (k128) or its dQ tile through
 * shared memory (DQS: dqsmem), and flash2_fwd_q128 (q128). */
#define FL2_KEYS 64 /* keys a block: pgd_ctx.flash_rows */

#ifndef PDDE_FLASH_EMU
/* 16 bytes global -> shared, asynchronously (L2 only: the tiles are read once per block) */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem) {
    unsigned a = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
/* wait until at most N of this thread's committed groups are still in flight */
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif

/* Where head bh of q, k or v starts and its row stride (elements), in the layout H gives
 * (backends/cuda_att_layout.cuh): [BH, T, D] contiguous (H 0), or rows of packed qkv [B, T, H*3*D] (k and v
 * passed D and 2D past q). The kernels take the layout as a template argument too (PK: packed; then H > 0),
 * so that the one for q, k, v apart has its strides as constants (registers: backends/cuda_kernels.cu). */
template <int D>
__device__ __forceinline__ const uint16_t *fl2_head(const uint16_t *x, long long bh, long long T, long long H, int *stride) {
    *stride = H ? 3 * (int)H * D : D; /* (the dispatcher's shapes: under 2^31) */
    return x + att_in(bh * T, T, D, H);
}

/* rows [row0, row0 + n) of a head (row stride ld elements) into a shared tile (pitch D + 8); zeros past T; NTH: the
 * block's threads */
template <int D, int NTH = 32 * FL_WARPS>
__device__ __forceinline__ void fl2_load(uint16_t *tile, const uint16_t *head, long long ld, long long row0, long long T, int n) {
    constexpr int V = D / 8;
    for (int e = threadIdx.x; e < n * V; e += NTH) {
        int r = e / V, c = (e % V) * 8;
        long long gr = row0 + r;
        if (gr < T) cp_async16(tile + r * (D + 8) + c, head + gr * ld + c);
        else *(uint4 *)(tile + r * (D + 8) + c) = make_uint4(0, 0, 0, 0);
    }
}

/* A warp per row r of y and dy (layout H: att_y, att_lse): dob[r] = bf16(dy[r, :D]) ([rows, D] contiguous),
 * stats[r] = {lse * log2(e), dy[r, :D] . y[r, :D]}, and row r of dq (in out: att_out) zeroed for
 * flash2_bwd's atomics. Grid: rows / FL_WARPS blocks, rounded up. */
template <int D>
__device__ __forceinline__ void flash2_prep(const float *y, const float *dy, uint16_t *dob, float *stats, float *out, long long rows,
                                            long long T, long long H) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    long long r = (long long)blockIdx.x * FL_WARPS + warp;
    if (r >= rows) return; /* (the whole warp: its shuffles below stay complete) */
    long long yo = att_y(r, T, D, H);
    const float *yr = y + yo, *dr = dy + yo;
    float *dq = out + att_out(r, 0, rows, T, D, H);
    float dot = 0.0f;
#pragma unroll
    for (int d = lane * 2; d < D; d += 64) {
        float a = dr[d], b = dr[d + 1];
        dot += a * yr[d] + b * yr[d + 1];
        *(uint32_t *)(dob + r * D + d) = pack_bf16(a, b);
        dq[d] = dq[d + 1] = 0.0f;
    }
#pragma unroll
    for (int o = 16; o; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    if (lane == 0) stats[2 * r] = y[att_lse(r, rows, D, H)] * FL_LOG2E, stats[2 * r + 1] = dot;
}

/* The shared memory of flash2_bwd with W warps (bf16 elements): the key tile of 16 W keys, dS^T [16 W, BQ + 8],
 * and the double buffers of the Q and dO tiles (the V tile passes through these first: 4 BQ >= 16 W) */
#define FL2_BQ(D) ((D) == 64 ? 32 : 16)
#define FL2_SMEM_W(D, W) (16 * (W) * ((D) + 8) + 16 * (W) * (FL2_BQ(D) + 8) + 4 * FL2_BQ(D) * ((D) + 8))
#define FL2_SMEM(D) FL2_SMEM_W(D, FL_WARPS)
/* PDDE_FLASH2_VARIANT=k128's backward: 8 warps, 128 keys a block (D 64 only: at D 128 V would not fit the buffers) */
#define FL2_K128_WARPS 8
/* PDDE_FLASH2_VARIANT=dqsmem's backward (flash2_bwd's DQS): a step's dQ tile [BQ, D] f32 in shared memory (row pitch
 * D + 8 floats: the fragments' 8-byte stores without bank conflicts), added to dq by coalesced atomics */
#define FL2_DQS_LD(D) ((D) + 8)
#define FL2_DQS_SMEM(D) (FL2_BQ(D) * FL2_DQS_LD(D))

/* dq, dk, dv (f32 in out, layout H: att_out; dq zeroed before) of the 16 W keys of block blockIdx.x (W warps, 16
 * keys each; FL_WARPS: 64 keys, the default): key tile blockIdx.x / BH (tile 0, the one with the most queries,
 * first), head blockIdx.x % BH. W 8 (PDDE_FLASH2_VARIANT=k128) halves the dQ atomics and the Q, dO tile copies
 * per product: each block step's dQ tile sums 128 keys. ST (the kernels k_flash2_back*_docs): starts, each
 * query's first key at batch row bh / heads (pdde_attention_docs), as flash_dkv takes them: the pairs before it
 * masked (P and dS 0), the query tiles whose rows all start past the block's last key skipped. */
template <int D, bool PK, int W = FL_WARPS, bool DQS = false, bool ST = false>
__device__ __forceinline__ void flash2_bwd(uint16_t *sm, float *stat_s, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                           const uint16_t *dob, const float *stats, float *out, long long BH, long long T,
                                           float scale, long long Hn, float *dqs = nullptr, const int *starts = nullptr,
                                           long long heads = 1) {
    const long long H = PK ? Hn : 0;
    constexpr int LD = D + 8, BK = 16 * W, NTH = 32 * W, BQ = FL2_BQ(D), LDS = BQ + 8, NT = BQ / 8, DT = D / 8, KS = D / 16;
    constexpr bool KREG = D == 64; /* K's fragments in registers too (at D 128 they would spill) */
    /* dQ of a tile: warps split it into RG groups of 16 rows by D / CW column slices of CW */
    constexpr int RG = BQ / 16, CW = D / (W / RG);
    static_assert(4 * BQ >= BK && CW % 16 == 0, "flash2_bwd: V passes through the Q, dO buffers; dQ slices of 16 columns");
    uint16_t *ks = sm, *dss = ks + BK * LD, *qs = dss + BK * LDS, *dos = qs + 2 * BQ * LD;
    long long kt = blockIdx.x / BH, bh = blockIdx.x % BH;
    int ldq, ldk, ldv; /* (row strides of q, k, v) */
    const uint16_t *qb = fl2_head<D>(q, bh, T, H, &ldq), *kb = fl2_head<D>(k, bh, T, H, &ldk), *vb = fl2_head<D>(v, bh, T, H, &ldv);
    const uint16_t *dob_h = dob + bh * T * D;
    const float *st_h = stats + bh * T * 2;
    /* dq has q's layout (row stride ldq); packed, its offset taken from qb's (att_out(r, 0, ...) = att_in(r, ...)):
     * fewer registers */
    float *dq_h = PK ? out + (qb - q) : out + att_out(bh * T, 0, BH * T, T, D, H);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    long long k0 = kt * BK, key0 = k0 + warp * 16 + g; /* this thread's keys: key0, key0 + 8 */
    fl2_load<D, NTH>(ks, kb, ldk, k0, T, BK);
    fl2_load<D, NTH>(qs, vb, ldv, k0, T, BK); /* V through the Q / dO buffers (BK rows fit there) */
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t vf[KS][4], kf[KREG ? KS : 1][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        ldsm4(vf[kk], fl_at(qs, LD, warp * 16, kk * 16, lane));
        if constexpr (KREG) ldsm4(kf[kk], fl_at(ks, LD, warp * 16, kk * 16, lane));
    }
    __syncthreads(); /* (V read: the buffers take Q and dO now) */
    float dk[DT][4], dv[DT][4], sl2 = scale * FL_LOG2E;
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    long long steps = (T - k0 + BQ - 1) / BQ; /* the query tiles from the block's first key on */
    /* ST: row_lo, the first key of row i0 + threadIdx.x of tile s (threads < BQ; rows past T and other threads: T), goes
     * to lo_s beside the tile's statistics; a tile whose rows' first keys all lie past the block's last key klast is
     * skipped, by every thread alike (tile 0 never is: its row k0 sees key k0) */
    __shared__ int lo_s[ST ? 2 * BQ : 1];
    const int *st_b = ST ? starts + bh / heads * T : nullptr; /* (the head's batch row of starts: fewer registers than att_lo's arguments) */
    int klast = (int)((k0 + BK < T ? k0 + BK : T) - 1);
    auto row_lo = [&](long long s) {
        long long i = k0 + s * BQ + threadIdx.x;
        if (threadIdx.x >= BQ || i >= T) return (int)T;
        int lo = st_b[i];
        return lo < 0 ? 0 : lo > i ? (int)i : lo; /* (att_lo's clamp to [0, i]) */
    };
    auto next_seen = [&](int s) { /* the first tile from s on that a row sees (steps: none); a barrier a tile */
        while (s < steps && !__syncthreads_or(row_lo(s) <= klast)) s++;
        return s;
    };
    /* tile s into buffer b: Q and dO rows by cp.async, their statistics by plain loads (both seen after the next barrier) */
    auto load_tile = [&](long long s, int b) {
        long long i0 = k0 + s * BQ;
        fl2_load<D, NTH>(qs + b * BQ * LD, qb, ldq, i0, T, BQ);
        fl2_load<D, NTH>(dos + b * BQ * LD, dob_h, D, i0, T, BQ);
        cp_async_commit();
        if (threadIdx.x < 2 * BQ) {
            long long i = i0 + (threadIdx.x >> 1);
            stat_s[b * 2 * BQ + threadIdx.x] = i < T ? st_h[i0 * 2 + threadIdx.x] : 0.0f;
        }
        if constexpr (ST)
            if (threadIdx.x < BQ) lo_s[b * BQ + threadIdx.x] = row_lo(s);
    };
    load_tile(0, 0);
    int tile = 0, next = 0; /* (ST: step s's query tile and the next one seen) */
    for (long long s = 0; ST ? tile < steps : s < steps; s++) {
        int b = (int)(s & 1);
        long long i0 = k0 + (ST ? tile : s) * BQ;
        if constexpr (ST) next = next_seen(tile + 1);
        /* the other buffer was last read before the previous step's second barrier: refill it now */
        if (ST ? next < steps : s + 1 < steps) load_tile(ST ? next : s + 1, b ^ 1), cp_async_wait<1>();
        else cp_async_wait<0>();
        __syncthreads();
        const uint16_t *qt = qs + b * BQ * LD, *dt = dos + b * BQ * LD;
        const float *st = stat_s + b * 2 * BQ;
        float sc[NT][4], dp[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) sc[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t a[4];
            if constexpr (KREG) a[0] = kf[kk][0], a[1] = kf[kk][1], a[2] = kf[kk][2], a[3] = kf[kk][3];
            else ldsm4(a, fl_at(ks, LD, warp * 16, kk * 16, lane));
            fl_s_dp(sc, dp, a, vf[kk], qt, dt, LD, kk, lane);
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int ci = n * 8 + t4 * 2 + (e & 1);
                long long col = i0 + ci, key = key0 + (e >> 1) * 8;
                float p = col < key || col >= T ? 0.0f : exp2f(sc[n][e] * sl2 - st[2 * ci]);
                if constexpr (ST) p = lo_s[b * BQ + ci] > key ? 0.0f : p; /* (the pairs before the query's first key) */
                sc[n][e] = p;
                dp[n][e] = p * (dp[n][e] - st[2 * ci + 1]); /* dS^T / scale */
            }
#pragma unroll
        for (int kk = 0; kk < BQ / 16; kk++) {
            uint32_t a[4];
            fl_pack_a(a, sc, kk);
            uint32_t c[4];
            fl_pack_a(c, dp, kk);
            /* dS^T's rows warp * 16 + g (+ 8), columns kk * 16 + 2 t4 (+ 8) into shared memory for dQ */
            uint16_t *drow = dss + (warp * 16 + g) * LDS + kk * 16 + t4 * 2;
            *(uint32_t *)drow = c[0], *(uint32_t *)(drow + 8 * LDS) = c[1];
            *(uint32_t *)(drow + 8) = c[2], *(uint32_t *)(drow + 8 * LDS + 8) = c[3];
#pragma unroll
            for (int d = 0; d < DT; d += 2) {
                uint32_t bo[4], bq[4];
                ldsm4t(bo, fl_at(dt, LD, kk * 16, d * 8, lane));
                ldsm4t(bq, fl_at(qt, LD, kk * 16, d * 8, lane));
                mma16816(dv[d], a, bo[0], bo[1]);
                mma16816(dv[d + 1], a, bo[2], bo[3]);
                mma16816(dk[d], c, bq[0], bq[1]);
                mma16816(dk[d + 1], c, bq[2], bq[3]);
            }
        }
        __syncthreads(); /* dS^T complete */
        /* dQ[rows qr.., columns c0..] += dS K over the block's BK keys: A = dS from dS^T by the transposing
         * ldmatrix (its matrices 1 and 2 trade places: A's second register is rows 8-15, keys 0-7) */
        int qr = (warp % RG) * 16, c0 = (warp / RG) * CW;
        float dq[CW / 8][4];
#pragma unroll
        for (int d = 0; d < CW / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t t[4];
            ldsm4t(t, fl_at(dss, LDS, kk * 16, qr, lane));
            uint32_t a[4] = {t[0], t[2], t[1], t[3]};
#pragma unroll
            for (int d = 0; d < CW / 8; d += 2) {
                uint32_t bk[4];
                ldsm4t(bk, fl_at(ks, LD, kk * 16, c0 + d * 8, lane));
                mma16816(dq[d], a, bk[0], bk[1]);
                mma16816(dq[d + 1], a, bk[2], bk[3]);
            }
        }
        if constexpr (DQS) { /* the tile through shared memory: each atomic instruction then 32 consecutive floats */
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int d = 0; d < CW / 8; d++)
                    *(float2 *)(dqs + (qr + g + r * 8) * FL2_DQS_LD(D) + c0 + d * 8 + t4 * 2) =
                        make_float2(scale * dq[d][2 * r], scale * dq[d][2 * r + 1]);
            __syncthreads(); /* (the next writes come after the next step's first barrier) */
            constexpr int RS = NTH / D; /* rows a pass of the block */
            int r0 = threadIdx.x / D, c = threadIdx.x % D;
            float *o = dq_h + (i0 + r0) * ldq + c;
            long long left = T - i0 - r0;
#pragma unroll
            for (int j = 0; j < BQ / RS; j++)
                if (j * RS < left) atomicAdd(o + (long long)j * RS * ldq, dqs[(r0 + j * RS) * FL2_DQS_LD(D) + c]);
        } else {
#pragma unroll
            for (int r = 0; r < 2; r++) {
                long long row = i0 + qr + g + r * 8;
                if (row >= T) continue;
                float *o = dq_h + row * ldq + c0 + t4 * 2;
#pragma unroll
                for (int d = 0; d < CW / 8; d++) atomicAdd(o + d * 8, scale * dq[d][2 * r]), atomicAdd(o + d * 8 + 1, scale * dq[d][2 * r + 1]);
            }
        }
        if constexpr (ST) tile = next;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        long long key = key0 + r * 8;
        if (key >= T) continue;
        /* (packed: dk, dv D and 2D past dq in the key's row; att_out's arithmetic, with fewer registers) */
        float *ok = PK ? dq_h + key * ldq + D : out + att_out(bh * T + key, 1, BH * T, T, D, H),
              *ov = PK ? dq_h + key * ldq + 2 * D : out + att_out(bh * T + key, 2, BH * T, T, D, H);
#pragma unroll
        for (int d = 0; d < DT; d++) {
            ok[d * 8 + t4 * 2] = scale * dk[d][2 * r], ok[d * 8 + t4 * 2 + 1] = scale * dk[d][2 * r + 1];
            ov[d * 8 + t4 * 2] = dv[d][2 * r], ov[d * 8 + t4 * 2 + 1] = dv[d][2 * r + 1];
        }
    }
}

/* flash2's forward at D 64: flash_fwd's key-tile step (fl_fwd_key_tile, backends/cuda_flash.cuh) with the K and V tiles copied
 * by cp.async into double buffers (the next tile's copy overlaps this tile's products) and the blocks
 * tile-major, the query tiles that see the most keys first (query tile tiles - 1 - blockIdx.x / BH, head
 * blockIdx.x % BH). Layout H as flash_fwd's; ycp (NULL: none): y also stored rounded to bf16 there, at
 * y's indices. At D 128 two K, V buffers do not fit in 48 KiB: flash2 runs flash_fwd there. ST (the kernels
 * k_flash2_fwd*_docs): starts, each query's first key at batch row bh / heads (pdde_attention_docs), as flash_fwd
 * takes them: the pairs before it masked, the key tiles before the block's least first key skipped. */
#define FL2_FWD_SMEM(D) (4 * FL2_KEYS * ((D) + 8))
template <int D, bool PK, bool ST = false>
__device__ __forceinline__ void flash2_fwd(uint16_t *sm, const uint16_t *q, const uint16_t *k, const uint16_t *v, float *y,
                                           long long BH, long long T, float scale, long long Hn, uint16_t *ycp = nullptr,
                                           const int *starts = nullptr, long long heads = 1) {
    const long long H = PK ? Hn : 0;
    constexpr int LD = D + 8, BK = FL2_KEYS, DT = D / 8, KS = D / 16;
    long long tiles = (T + FL_ROWS - 1) / FL_ROWS, qt = tiles - 1 - blockIdx.x / BH, bh = blockIdx.x % BH;
    int ldq, ldk, ldv;
    const uint16_t *qb = fl2_head<D>(q, bh, T, H, &ldq), *kb = fl2_head<D>(k, bh, T, H, &ldk), *vb = fl2_head<D>(v, bh, T, H, &ldv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    __shared__ int lo_s[ST ? FL_ROWS : 1]; /* (ST: the rows' first keys) */
    /* buffer b: K at sm + 2 b BK LD, V after it; Q passes through buffer 1 */
    fl2_load<D>(sm + 2 * BK * LD, qb, ldq, qt * FL_ROWS, T, FL_ROWS);
    cp_async_commit();
    long long kt0 = 0; /* the first key tile (ST: the one of the block's least first key; BK = FL_ROWS, so kt0 <= qt) */
    if constexpr (ST) {
        fl_row_los(lo_s, starts, bh, qt * FL_ROWS, T, heads);
        __syncthreads();
        kt0 = fl_least_lo(lo_s) / BK;
    }
    fl2_load<D>(sm, kb, ldk, kt0 * BK, T, BK);
    fl2_load<D>(sm + BK * LD, vb, ldv, kt0 * BK, T, BK);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; kk++) ldsm4(qf[kk], fl_at(sm + 2 * BK * LD, LD, warp * 16, kk * 16, lane));
    __syncthreads(); /* (Q read: buffer 1 takes the next K, V tile) */
    float o[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, sl2 = scale * FL_LOG2E;
#pragma unroll
    for (int d = 0; d < DT; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    long long row0 = qt * FL_ROWS + warp * 16 + g; /* this thread's rows: row0, row0 + 8 */
    int lo0 = ST ? lo_s[warp * 16 + g] : 0, lo1 = ST ? lo_s[warp * 16 + g + 8] : 0;
    for (long long kt = kt0; kt <= qt; kt++) {
        int b = (int)((kt - kt0) & 1);
        if (kt < qt) { /* the other buffer was last read before the previous tile's second barrier */
            fl2_load<D>(sm + 2 * (b ^ 1) * BK * LD, kb, ldk, (kt + 1) * BK, T, BK);
            fl2_load<D>(sm + (2 * (b ^ 1) + 1) * BK * LD, vb, ldv, (kt + 1) * BK, T, BK);
            cp_async_commit();
            cp_async_wait<1>();
        } else cp_async_wait<0>();
        __syncthreads();
        const uint16_t *ks = sm + 2 * b * BK * LD, *vs = ks + BK * LD;
        fl_fwd_key_tile<D, BK, ST>(o, m, l, qf, ks, vs, kt, row0, sl2, lane, lo0, lo1);
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
        if (PK && ycp) { /* (y rounded to bf16 beside it, as a cast of y would: packed nodes only have one) */
            uint16_t *cr = ycp + att_y(bh * T + row, T, D, H);
#pragma unroll
            for (int d = 0; d < DT; d++) *(uint32_t *)(cr + d * 8 + t4 * 2) = pack_bf16(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
        }
        if (t4 == 0) y[att_lse(bh * T + row, BH * T, D, H)] = (m[r] + log2f(l[r])) / FL_LOG2E;
    }
}

/* PDDE_FLASH2_VARIANT=q128's forward (D 64): 128 query rows a block of 4 warps, 32 a warp (two m-tiles of 16), so that
 * each K and V fragment read by ldmatrix feeds two products (flash2_fwd: one); the K, V tiles of 64 keys double
 * buffered as there, Q through buffer 1 (128 rows fit). */
#define FL2_Q128_ROWS 128
#define FL2_Q128_MINBLOCKS 2 /* (about 200 registers: two blocks an SM) */

/* fl_fwd_key_tile for MR m-tiles a warp (this thread's rows row0 + 16 mr, + 8): the same arithmetic, each K and V
 * fragment loaded once for the MR tiles; DOCS: also the keys before the rows' first keys masked, lo[16 mr] and
 * lo[16 mr + 8] (in shared memory: registers are short here) */
template <int D, int BK, int MR, bool DOCS = false>
__device__ __forceinline__ void fl2_fwd_key_tile_m(float (&o)[MR][D / 8][4], float (&m)[MR][2], float (&l)[MR][2],
                                                   const uint32_t (&qf)[MR][D / 16][4], const uint16_t *ks, const uint16_t *vs,
                                                   long long kt, long long row0, float sl2, int lane, const int *lo = nullptr) {
    constexpr int LD = D + 8, NT = BK / 8, DT = D / 8, KS = D / 16;
    int t4 = lane & 3;
    float s[MR][NT][4];
#pragma unroll
    for (int mr = 0; mr < MR; mr++)
#pragma unroll
        for (int n = 0; n < NT; n++) s[mr][n][0] = s[mr][n][1] = s[mr][n][2] = s[mr][n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            uint32_t b[4];
            ldsm4(b, fl_at(ks, LD, n * 8, kk * 16, lane));
#pragma unroll
            for (int mr = 0; mr < MR; mr++) mma16816(s[mr][n], qf[mr][kk], b[0], b[2]), mma16816(s[mr][n + 1], qf[mr][kk], b[1], b[3]);
        }
#pragma unroll
    for (int mr = 0; mr < MR; mr++) {
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                long long col = kt * BK + n * 8 + t4 * 2 + (e & 1), row = row0 + mr * 16 + (e >> 1) * 8;
                float x = s[mr][n][e] * sl2;
                s[mr][n][e] = col > row || (DOCS && col < lo[mr * 16 + (e >> 1) * 8]) ? -INFINITY : x;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[mr][n][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[mr][r], mx[r]), alpha = exp2f(m[mr][r] - (DOCS && mn == -INFINITY ? 0.0f : mn)); /* (m = -inf at first: alpha 0) */
            m[mr][r] = mn;
            l[mr][r] *= alpha;
#pragma unroll
            for (int d = 0; d < DT; d++) o[mr][d][2 * r] *= alpha, o[mr][d][2 * r + 1] *= alpha;
        }
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                /* (DOCS: 0 subtracted while a row has seen no key yet: -inf - -inf would be NaN) */
                s[mr][n][e] = exp2f(s[mr][n][e] - (DOCS && m[mr][e >> 1] == -INFINITY ? 0.0f : m[mr][e >> 1]));
                l[mr][e >> 1] += s[mr][n][e];
            }
    }
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) { /* o += P V */
        uint32_t a[MR][4];
#pragma unroll
        for (int mr = 0; mr < MR; mr++) fl_pack_a(a[mr], s[mr], kk);
#pragma unroll
        for (int d = 0; d < DT; d += 2) {
            uint32_t b[4];
            ldsm4t(b, fl_at(vs, LD, kk * 16, d * 8, lane));
#pragma unroll
            for (int mr = 0; mr < MR; mr++) mma16816(o[mr][d], a[mr], b[0], b[1]), mma16816(o[mr][d + 1], a[mr], b[2], b[3]);
        }
    }
}

/* flash2_fwd with 128 query rows a block (query tile tiles - 1 - blockIdx.x / BH of 128 rows, head blockIdx.x % BH;
 * tiles = ceil(T / 128)): the key tiles of 64 up to the tile's last row (ST: from the block's least first key's).
 * Shared memory FL2_FWD_SMEM(64). */
template <int D, bool PK, bool ST = false>
__device__ __forceinline__ void flash2_fwd_q128(uint16_t *sm, const uint16_t *q, const uint16_t *k, const uint16_t *v, float *y,
                                                long long BH, long long T, float scale, long long Hn, uint16_t *ycp = nullptr,
                                                const int *starts = nullptr, long long heads = 1) {
    const long long H = PK ? Hn : 0;
    constexpr int LD = D + 8, BK = FL2_KEYS, BQ = FL2_Q128_ROWS, MR = BQ / (16 * FL_WARPS), DT = D / 8, KS = D / 16;
    static_assert(BQ <= 2 * BK && BQ <= 32 * FL_WARPS, "flash2_fwd_q128: Q passes through the second K, V buffer; a thread a row's first key");
    long long tiles = (T + BQ - 1) / BQ, qt = tiles - 1 - blockIdx.x / BH, bh = blockIdx.x % BH;
    int ldq, ldk, ldv;
    const uint16_t *qb = fl2_head<D>(q, bh, T, H, &ldq), *kb = fl2_head<D>(k, bh, T, H, &ldk), *vb = fl2_head<D>(v, bh, T, H, &ldv);
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    __shared__ int lo_s[ST ? BQ : 1]; /* (ST: the rows' first keys) */
    fl2_load<D>(sm + 2 * BK * LD, qb, ldq, qt * BQ, T, BQ);
    cp_async_commit();
    long long kt0 = 0; /* the first key tile (ST: the one of the block's least first key) */
    if constexpr (ST) {
        fl_row_los<BQ>(lo_s, starts, bh, qt * BQ, T, heads);
        __syncthreads();
        kt0 = fl_least_lo<BQ>(lo_s) / BK;
    }
    fl2_load<D>(sm, kb, ldk, kt0 * BK, T, BK);
    fl2_load<D>(sm + BK * LD, vb, ldv, kt0 * BK, T, BK);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t qf[MR][KS][4];
#pragma unroll
    for (int mr = 0; mr < MR; mr++)
#pragma unroll
        for (int kk = 0; kk < KS; kk++) ldsm4(qf[mr][kk], fl_at(sm + 2 * BK * LD, LD, warp * 16 * MR + mr * 16, kk * 16, lane));
    __syncthreads(); /* (Q read: buffer 1 takes the next K, V tile) */
    float o[MR][DT][4], m[MR][2], l[MR][2], sl2 = scale * FL_LOG2E;
#pragma unroll
    for (int mr = 0; mr < MR; mr++) {
        m[mr][0] = m[mr][1] = -INFINITY, l[mr][0] = l[mr][1] = 0.0f;
#pragma unroll
        for (int d = 0; d < DT; d++) o[mr][d][0] = o[mr][d][1] = o[mr][d][2] = o[mr][d][3] = 0.0f;
    }
    long long row0 = qt * BQ + warp * 16 * MR + g; /* this thread's rows: row0 + 16 mr, + 8 */
    long long last = (qt * BQ + BQ - 1) / BK, klast = (T - 1) / BK; /* (the key tiles up to the tile's last row, within T) */
    if (klast < last) last = klast;
    for (long long kt = kt0; kt <= last; kt++) {
        int b = (int)((kt - kt0) & 1);
        if (kt < last) { /* the other buffer was last read before the previous tile's second barrier */
            fl2_load<D>(sm + 2 * (b ^ 1) * BK * LD, kb, ldk, (kt + 1) * BK, T, BK);
            fl2_load<D>(sm + (2 * (b ^ 1) + 1) * BK * LD, vb, ldv, (kt + 1) * BK, T, BK);
            cp_async_commit();
            cp_async_wait<1>();
        } else cp_async_wait<0>();
        __syncthreads();
        const uint16_t *ks = sm + 2 * b * BK * LD, *vs = ks + BK * LD;
        fl2_fwd_key_tile_m<D, BK, MR, ST>(o, m, l, qf, ks, vs, kt, row0, sl2, lane, lo_s + (row0 - qt * BQ));
        __syncthreads();
    }
#pragma unroll
    for (int mr = 0; mr < MR; mr++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            l[mr][r] += __shfl_xor_sync(0xffffffffu, l[mr][r], 1);
            l[mr][r] += __shfl_xor_sync(0xffffffffu, l[mr][r], 2);
            long long row = row0 + mr * 16 + r * 8;
            if (row >= T) continue;
            float *yr = y + att_y(bh * T + row, T, D, H), inv = 1.0f / l[mr][r];
#pragma unroll
            for (int d = 0; d < DT; d++) yr[d * 8 + t4 * 2] = o[mr][d][2 * r] * inv, yr[d * 8 + t4 * 2 + 1] = o[mr][d][2 * r + 1] * inv;
            if (PK && ycp) { /* (y rounded to bf16 beside it, as a cast of y would: packed nodes only have one) */
                uint16_t *cr = ycp + att_y(bh * T + row, T, D, H);
#pragma unroll
                for (int d = 0; d < DT; d++) *(uint32_t *)(cr + d * 8 + t4 * 2) = pack_bf16(o[mr][d][2 * r] * inv, o[mr][d][2 * r + 1] * inv);
            }
            if (t4 == 0) y[att_lse(bh * T + row, BH * T, D, H)] = (m[mr][r] + log2f(l[mr][r])) / FL_LOG2E;
        }
}
