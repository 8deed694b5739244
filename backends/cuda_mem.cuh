/* backends/cuda_mem.cuh — memory-bound kernels of the CUDA backend that move 16 bytes a load (included by
 * cuda_kernels.cu after its helpers: block_sum, block_max, the ld_* loaders, store_out, adamw_element,
 * store_shadow, update_skipped, clip_factor), gpu_kernels.cl's kernels of the same names step for step.
 * tests/mem_emu.cpp runs them on the CPU.
 *  - k_ce_fused: the cross-entropy's loss and dlogits in one launch (lowering's PDDE_FUSE_CE).
 *  - k_ce_staged: the same reading each row from device memory once, staged in dynamic shared memory.
 *  - k_colsum2: column sums of [R, Cn] in row chunks (a bias gradient), 4 columns a thread.
 *  - k_adamw_chunks: the multi-tensor AdamW with a block per chunk of a tensor.
 *  - k_adamw_vec: the same chunks taken by a few blocks a multiprocessor, more loads in flight.
 *  - k_bias_gelu2: bias_gelu and its backward over rows, 4 columns a thread, 4 rows in flight. */

/* 16 bytes of elements of type T (8 bf16 / f16, 4 f32) at p + i, as f32 through loader L */
template <typename L>
__device__ __forceinline__ void load16(const typename L::T *p, long long i, float *v) {
    const int W = 16 / (int)sizeof(typename L::T);
    union { uint4 q; typename L::T e[16 / sizeof(typename L::T)]; } u;
    u.q = *(const uint4 *)(p + i);
    for (int k = 0; k < W; k++) v[k] = L::get(u.e, k);
}
/* W values stored at y + i as dtype ydt (0 f32, else bf16 / f16 as store_out rounds), W * size bytes at once */
template <int W>
__device__ __forceinline__ void store_vec(void *y, long long i, const float *v, int ydt) {
    if (ydt == 0) {
        for (int k = 0; k < W; k += 4) *(float4 *)((float *)y + i + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
        return;
    }
    unsigned h[W / 2];
    for (int k = 0; k < W; k += 2) {
        unsigned short lo = ydt == 2 ? f32_to_bf16(v[k]) : f32_to_f16(v[k]), hi = ydt == 2 ? f32_to_bf16(v[k + 1]) : f32_to_f16(v[k + 1]);
        h[k / 2] = (unsigned)lo | (unsigned)hi << 16;
    }
    if (W == 8) *(uint4 *)((unsigned short *)y + i) = make_uint4(h[0], h[1 % (W / 2)], h[2 % (W / 2)], h[3 % (W / 2)]);
    else *(uint2 *)((unsigned short *)y + i) = make_uint2(h[0], h[1 % (W / 2)]);
}

#ifndef CE_IGNORED_LOSS /* (cuda_kernels.cu's: the emulation includes this file alone) */
#define CE_IGNORED_LOSS(t) ((t) < 0 ? 0.0f : nanf(""))
#endif

/* One block per row r: each thread keeps a running maximum and a sum of exponentials rescaled when the maximum
 * grows (the online softmax), so the row is read once for both; the block combines them (m, then s * e^(m_t -
 * m)); thread 0 writes the loss part[r] (CE_IGNORED_LOSS without a class) and 1/0 for a valid target in
 * part[rows + r] (k_ce_final sums them); then dlogits = (e^(x - m) / s - onehot) * dloss / count (zero on a row
 * without a class), a second read of the row (from L2). Rows of 16-byte multiples at 16-byte aligned starts move 16 bytes a load and store. */
template <typename L>
__device__ __forceinline__ void ce_fused_body(const typename L::T *__restrict__ logits, const int *__restrict__ tgt,
                                              const float *__restrict__ dloss, const float *__restrict__ cnt, float *__restrict__ part,
                                              void *__restrict__ dx, long long rows, long long V, int ydt) {
    const int W = 16 / (int)sizeof(typename L::T);
    bool vec = V % W == 0 && (unsigned long long)logits % 16 == 0 && (unsigned long long)dx % 16 == 0;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename L::T *lr = logits + r * V;
        int t = tgt[r];
        bool ok = t >= 0 && t < V;
        float m = -INFINITY, s = 0.0f;
        if (vec)
            for (long long j = (long long)threadIdx.x * W; j < V; j += (long long)blockDim.x * W) {
                float v[16 / sizeof(typename L::T)];
                load16<L>(lr, j, v);
                for (int k = 0; k < W; k++) {
                    if (v[k] > m) s = s * expf(m - v[k]) + 1.0f, m = v[k];
                    else s += expf(v[k] - m);
                }
            }
        else
            for (long long j = threadIdx.x; j < V; j += blockDim.x) {
                float x = L::get(lr, j);
                if (x > m) s = s * expf(m - x) + 1.0f, m = x;
                else s += expf(x - m);
            }
        float mb = block_max(m);
        s = block_sum(m == -INFINITY ? 0.0f : s * expf(m - mb));
        if (threadIdx.x == 0) {
            part[r] = ok ? logf(s) + mb - L::get(lr, t) : CE_IGNORED_LOSS(t);
            part[rows + r] = ok ? 1.0f : 0.0f;
        }
        float c = cnt[0] > 0.0f ? cnt[0] : 1.0f;
        float scale = dloss[0] / c, inv = 1.0f / s;
        if (vec)
            for (long long j = (long long)threadIdx.x * W; j < V; j += (long long)blockDim.x * W) {
                float v[16 / sizeof(typename L::T)];
                load16<L>(lr, j, v);
                for (int k = 0; k < W; k++) v[k] = ok ? (expf(v[k] - mb) * inv - (j + k == t ? 1.0f : 0.0f)) * scale : 0.0f;
                store_vec<16 / sizeof(typename L::T)>(dx, r * V + j, v, ydt);
            }
        else
            for (long long j = threadIdx.x; j < V; j += blockDim.x)
                store_out(dx, r * V + j, ok ? (expf(L::get(lr, j) - mb) * inv - (j == t ? 1.0f : 0.0f)) * scale : 0.0f, ydt);
    }
}
/* (logits of dtype ldt: 0 f32, 2 bf16, 1 f16; dlogits of ydt) */
extern "C" __global__ void k_ce_fused(const void *__restrict__ logits, const int *__restrict__ tgt, const float *__restrict__ dloss,
                                      const float *__restrict__ cnt, float *__restrict__ part, void *__restrict__ dx, long long rows,
                                      long long V, int ydt, int ldt) {
    if (ldt == 2) ce_fused_body<ld_bf16>((const unsigned short *)logits, tgt, dloss, cnt, part, dx, rows, V, ydt);
    else if (ldt == 1) ce_fused_body<ld_f16>((const unsigned short *)logits, tgt, dloss, cnt, part, dx, rows, V, ydt);
    else ce_fused_body<ld_f32>((const float *)logits, tgt, dloss, cnt, part, dx, rows, V, ydt);
}

/* 16 bytes q as W values of type L::T, in f32 */
template <typename L>
__device__ __forceinline__ void unpack16(uint4 q, float *v) {
    union { uint4 q; typename L::T e[16 / sizeof(typename L::T)]; } u;
    u.q = q;
    for (int k = 0; k < 16 / (int)sizeof(typename L::T); k++) v[k] = L::get(u.e, k);
}
template <typename L>
__device__ __forceinline__ float max16(uint4 q) {
    float v[16 / sizeof(typename L::T)], m = -INFINITY;
    unpack16<L>(q, v);
    for (int k = 0; k < 16 / (int)sizeof(typename L::T); k++) m = fmaxf(m, v[k]);
    return m;
}

/* k_ce_fused's loss and dlogits reading each row from device memory once (PGD_MEM_CE1): a block per row copies it
 * into row (the block's dynamic shared memory, V elements of the logits' dtype, 16-byte aligned) as it takes the
 * maximum, 4 16-byte loads in flight a thread; then the sum of e^(x - m) and dlogits = (e^(x - m) / s - onehot) *
 * dloss / count from there, 16-byte stores. Each thread reads back only the elements it wrote, so the row needs no
 * barrier; thread 0 reads the target's logit from device memory. An ignored row writes zeros without reading. */
template <typename L>
__device__ __forceinline__ void ce_staged_body(const typename L::T *__restrict__ logits, const int *__restrict__ tgt,
                                               const float *__restrict__ dloss, const float *__restrict__ cnt, float *__restrict__ part,
                                               void *__restrict__ dx, long long rows, long long V, int ydt, typename L::T *row) {
    const int W = 16 / (int)sizeof(typename L::T);
    bool vec = V % W == 0 && (unsigned long long)logits % 16 == 0 && (unsigned long long)dx % 16 == 0;
    long long nb = blockDim.x, nq = V / W;
    float c = cnt[0] > 0.0f ? cnt[0] : 1.0f, scale = dloss[0] / c;
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename L::T *lr = logits + r * V;
        int t = tgt[r];
        if (t < 0 || t >= V) { /* (the same for every thread of the block) */
            float z[16 / sizeof(typename L::T)] = {};
            if (vec)
                for (long long q = threadIdx.x; q < nq; q += nb) store_vec<16 / sizeof(typename L::T)>(dx, r * V + q * W, z, ydt);
            else
                for (long long j = threadIdx.x; j < V; j += nb) store_out(dx, r * V + j, 0.0f, ydt);
            if (threadIdx.x == 0) part[r] = CE_IGNORED_LOSS(t), part[rows + r] = 0.0f;
            continue;
        }
        float m = -INFINITY;
        const uint4 *src = (const uint4 *)lr;
        uint4 *st = (uint4 *)row;
        if (vec) {
            long long q = threadIdx.x;
            for (; q + 3 * nb < nq; q += 4 * nb) {
                uint4 a0 = src[q], a1 = src[q + nb], a2 = src[q + 2 * nb], a3 = src[q + 3 * nb];
                st[q] = a0, st[q + nb] = a1, st[q + 2 * nb] = a2, st[q + 3 * nb] = a3;
                m = fmaxf(m, fmaxf(fmaxf(max16<L>(a0), max16<L>(a1)), fmaxf(max16<L>(a2), max16<L>(a3))));
            }
            for (; q < nq; q += nb) {
                uint4 a = src[q];
                st[q] = a;
                m = fmaxf(m, max16<L>(a));
            }
        } else
            for (long long j = threadIdx.x; j < V; j += nb) {
                row[j] = lr[j];
                m = fmaxf(m, L::get(row, j));
            }
        m = block_max(m);
        float s = 0.0f;
        if (vec)
            for (long long q = threadIdx.x; q < nq; q += nb) {
                float v[16 / sizeof(typename L::T)];
                unpack16<L>(st[q], v);
                for (int k = 0; k < W; k++) s += expf(v[k] - m);
            }
        else
            for (long long j = threadIdx.x; j < V; j += nb) s += expf(L::get(row, j) - m);
        s = block_sum(s);
        if (threadIdx.x == 0) part[r] = logf(s) + m - L::get(lr, t), part[rows + r] = 1.0f;
        float inv = 1.0f / s;
        if (vec)
            for (long long q = threadIdx.x; q < nq; q += nb) {
                float v[16 / sizeof(typename L::T)];
                unpack16<L>(st[q], v);
                for (int k = 0; k < W; k++) v[k] = (expf(v[k] - m) * inv - (q * W + k == t ? 1.0f : 0.0f)) * scale;
                store_vec<16 / sizeof(typename L::T)>(dx, r * V + q * W, v, ydt);
            }
        else
            for (long long j = threadIdx.x; j < V; j += nb) store_out(dx, r * V + j, (expf(L::get(row, j) - m) * inv - (j == t ? 1.0f : 0.0f)) * scale, ydt);
    }
}
/* (k_ce_fused's arguments; launched with V elements of the logits' dtype of dynamic shared memory, at most 512 threads) */
#ifndef CE_STAGED_ROW
#define CE_STAGED_ROW(name) extern __shared__ uint4 name[]
#endif
extern "C" __global__ void __launch_bounds__(512) k_ce_staged(const void *__restrict__ logits, const int *__restrict__ tgt,
                                                              const float *__restrict__ dloss, const float *__restrict__ cnt,
                                                              float *__restrict__ part, void *__restrict__ dx, long long rows, long long V,
                                                              int ydt, int ldt) {
    CE_STAGED_ROW(ce_row);
    if (ldt == 2) ce_staged_body<ld_bf16>((const unsigned short *)logits, tgt, dloss, cnt, part, dx, rows, V, ydt, (unsigned short *)ce_row);
    else if (ldt == 1) ce_staged_body<ld_f16>((const unsigned short *)logits, tgt, dloss, cnt, part, dx, rows, V, ydt, (unsigned short *)ce_row);
    else ce_staged_body<ld_f32>((const float *)logits, tgt, dloss, cnt, part, dx, rows, V, ydt, (float *)ce_row);
}

/* x viewed as [R, Cn] (Cn a multiple of 4, x 16-byte aligned for f32, 8 for bf16 / f16): y[c, j] = scale * the
 * sum of x[r, j] over the rows of chunk c = blockIdx.y (rpc rows a chunk). A block of 256 threads: 32 lanes of 4
 * columns (a warp reads 16 (f32) or 8 bytes a lane of one row: 512 / 256 contiguous bytes) x 8 row lanes,
 * each with 4 rows' loads in flight; the 8 lanes' sums added in shared memory. */
#define CS2_COLS 128
extern "C" __global__ void __launch_bounds__(256) k_colsum2(const void *__restrict__ xv, float *__restrict__ y, long long R,
                                                            long long Cn, float scale, long long rpc, int xdt) {
    __shared__ float sh[8][CS2_COLS + 4];
    int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    long long j = (long long)blockIdx.x * CS2_COLS + tx * 4;
    long long r0 = (long long)blockIdx.y * rpc, r1 = r0 + rpc < R ? r0 + rpc : R;
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (j < Cn) {
        long long r = r0 + ty;
        if (xdt == 0) {
            const float *x = (const float *)xv;
            for (; r + 24 < r1; r += 32) { /* (4 rows a step: their loads in flight together) */
                float4 q0 = *(const float4 *)(x + r * Cn + j), q1 = *(const float4 *)(x + (r + 8) * Cn + j);
                float4 q2 = *(const float4 *)(x + (r + 16) * Cn + j), q3 = *(const float4 *)(x + (r + 24) * Cn + j);
                a[0] += q0.x + q1.x + (q2.x + q3.x), a[1] += q0.y + q1.y + (q2.y + q3.y);
                a[2] += q0.z + q1.z + (q2.z + q3.z), a[3] += q0.w + q1.w + (q2.w + q3.w);
            }
            for (; r < r1; r += 8) {
                float4 q = *(const float4 *)(x + r * Cn + j);
                a[0] += q.x, a[1] += q.y, a[2] += q.z, a[3] += q.w;
            }
        } else {
            const unsigned short *x = (const unsigned short *)xv;
            for (; r < r1; r += 8) {
                uint2 q = *(const uint2 *)(x + r * Cn + j);
                unsigned short e[4] = {(unsigned short)(q.x & 0xffffu), (unsigned short)(q.x >> 16), (unsigned short)(q.y & 0xffffu),
                                       (unsigned short)(q.y >> 16)};
                for (int k = 0; k < 4; k++) a[k] += xdt == 2 ? ld_bf16::get(e, k) : ld_f16::get(e, k);
            }
        }
    }
    for (int k = 0; k < 4; k++) sh[ty][tx * 4 + k] = a[k];
    __syncthreads();
    if (ty == 0 && j < Cn)
        for (int k = 0; k < 4; k++) {
            float s = 0.0f;
            for (int l = 0; l < 8; l++) s += sh[l][tx * 4 + k];
            y[(long long)blockIdx.y * Cn + j + k] = scale * s;
        }
}

/* Multi-tensor AdamW in chunks: block b takes chunk b - (the chunks of the tensors before k) of tensor k, ADAMW_CHUNK
 * elements (the tensors' chunks counted in order: at most MULTI_MAX steps). A tensor whose parameter, gradient and
 * moments start at multiples of 4 elements (and its copy at a multiple of 4: 8 bytes) moves 16 bytes a load, each
 * thread 4 elements a step; the others, and a tensor's last n % 4 elements, one at a time. The arithmetic is
 * adamw_element's. */
#define ADAMW_CHUNK 4096
/* Chunk c's tensor (from tensor *k, whose first chunk is *first: c only grows, so a walk goes on from where the last
 * stopped) and its span: its pointers, its copy (sk: its dtype, 0 none), elements [i0, i1), and vec: 16 bytes a load */
struct adamw_span {
    float *p, *g, *m, *v;
    unsigned short *sh;
    int sk;
    long long i0, i1;
    bool vec;
};
__device__ __forceinline__ bool adamw_chunk(long long c, int *k, long long *first, const struct pdde_cu_multi &t, int count, float *base,
                                            float *gbase, int sdt, adamw_span *s) {
    for (; *k < count; ++*k) {
        long long nc = (t.n[*k] + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
        if (c < *first + nc) break;
        *first += nc;
    }
    if (*k == count) return false;
    int j = *k;
    s->p = base + t.p[j], s->g = gbase + t.g[j], s->m = base + t.m[j], s->v = base + t.v[j];
    s->sh = (unsigned short *)base + (t.s[j] >= 0 ? t.s[j] : 0);
    s->sk = t.s[j] >= 0 ? sdt : 0; /* (-1: no copy) */
    s->i0 = (c - *first) * ADAMW_CHUNK, s->i1 = s->i0 + ADAMW_CHUNK < t.n[j] ? s->i0 + ADAMW_CHUNK : t.n[j];
    s->vec = (t.p[j] | t.g[j] | t.m[j] | t.v[j]) % 4 == 0 && (!s->sk || t.s[j] % 4 == 0) && (unsigned long long)base % 16 == 0 &&
             (unsigned long long)gbase % 16 == 0;
    return true;
}
extern "C" __global__ void __launch_bounds__(256) k_adamw_chunks(float *base, float *gbase, const float *gnorm_sq, struct pdde_cu_multi t,
                                                                 int count, float lr, float b1, float b2, float eps, float clip,
                                                                 float gscale, float bc1, float bc2, int sdt) {
    if (update_skipped(gnorm_sq)) return;
    long long first = 0;
    int k = 0;
    adamw_span sp;
    if (!adamw_chunk(blockIdx.x, &k, &first, t, count, base, gbase, sdt, &sp)) return;
    float f = gscale * clip_factor(gnorm_sq, clip), wd = t.wd[k];
    float *p = sp.p, *g = sp.g, *m = sp.m, *v = sp.v;
    unsigned short *sh = sp.sh;
    int sk = sp.sk;
    long long i0 = sp.i0, i1 = sp.i1;
    long long iv = sp.vec ? i0 + (i1 - i0) / 4 * 4 : i0; /* (i0 is a multiple of 4) */
    for (long long i = i0 + (long long)threadIdx.x * 4; i < iv; i += (long long)blockDim.x * 4) {
        float4 P = *(float4 *)(p + i), G = *(float4 *)(g + i), M = *(float4 *)(m + i), Vv = *(float4 *)(v + i);
        float pe[4] = {P.x, P.y, P.z, P.w}, ge[4] = {G.x, G.y, G.z, G.w}, me[4] = {M.x, M.y, M.z, M.w}, ve[4] = {Vv.x, Vv.y, Vv.z, Vv.w};
        for (int e = 0; e < 4; e++) adamw_element(pe + e, ge + e, me + e, ve + e, f, lr, b1, b2, eps, wd, bc1, bc2);
        *(float4 *)(p + i) = make_float4(pe[0], pe[1], pe[2], pe[3]);
        *(float4 *)(g + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        *(float4 *)(m + i) = make_float4(me[0], me[1], me[2], me[3]);
        *(float4 *)(v + i) = make_float4(ve[0], ve[1], ve[2], ve[3]);
        if (sk) store_vec<4>(sh, i, pe, sk);
    }
    for (long long i = iv + threadIdx.x; i < i1; i += blockDim.x) {
        adamw_element(p + i, g + i, m + i, v + i, f, lr, b1, b2, eps, wd, bc1, bc2);
        if (sk) store_shadow(sh, i, p[i], sk);
    }
}

/* AdamW on 4 elements at i whose parameter, gradient and moments were loaded (P, G, M, Vv): adamw_element's
 * operations, the results stored 16 bytes at a time (and the copy 8) */
__device__ __forceinline__ void adamw_quad(float4 P, float4 G, float4 M, float4 Vv, float *p, float *g, float *m, float *v, unsigned short *sh,
                                           long long i, int sk, float f, float lr, float b1, float b2, float eps, float wd, float bc1, float bc2) {
    float pe[4] = {P.x, P.y, P.z, P.w}, ge[4] = {G.x, G.y, G.z, G.w}, me[4] = {M.x, M.y, M.z, M.w}, ve[4] = {Vv.x, Vv.y, Vv.z, Vv.w};
    for (int e = 0; e < 4; e++) adamw_element(pe + e, ge + e, me + e, ve + e, f, lr, b1, b2, eps, wd, bc1, bc2);
    *(float4 *)(p + i) = make_float4(pe[0], pe[1], pe[2], pe[3]);
    *(float4 *)(g + i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    *(float4 *)(m + i) = make_float4(me[0], me[1], me[2], me[3]);
    *(float4 *)(v + i) = make_float4(ve[0], ve[1], ve[2], ve[3]);
    if (sk) store_vec<4>(sh, i, pe, sk);
}

/* k_adamw_chunks's chunks and arithmetic (its arguments) by a grid of a few blocks a multiprocessor (PGD_MEM_ADAMW_VEC):
 * block b takes chunks b, b + gridDim.x, ... in order, so the norm is read and the clip factor taken once a block,
 * not once a chunk before its loads can start; each thread has 2 groups of 4 elements of the parameter, gradient
 * and both moments in flight (8 16-byte loads), where k_adamw_chunks has 1; 3 blocks of 256 a multiprocessor (80
 * registers a thread at most: the launch's grid). */
extern "C" __global__ void __launch_bounds__(256, 3) k_adamw_vec(float *base, float *gbase, const float *gnorm_sq, struct pdde_cu_multi t,
                                                                 int count, float lr, float b1, float b2, float eps, float clip, float gscale,
                                                                 float bc1, float bc2, int sdt) {
    if (update_skipped(gnorm_sq)) return;
    float f = gscale * clip_factor(gnorm_sq, clip);
    long long first = 0, nb = blockDim.x;
    int k = 0;
    for (long long c = blockIdx.x;; c += gridDim.x) { /* (c grows: the tensor of chunk c is k or one after it) */
        adamw_span sp;
        if (!adamw_chunk(c, &k, &first, t, count, base, gbase, sdt, &sp)) return;
        float wd = t.wd[k];
        float *p = sp.p, *g = sp.g, *m = sp.m, *v = sp.v;
        unsigned short *sh = sp.sh;
        int sk = sp.sk;
        long long i0 = sp.i0, i1 = sp.i1;
        long long iv = sp.vec ? i0 + (i1 - i0) / 4 * 4 : i0, i = i0 + (long long)threadIdx.x * 4;
        for (; i + nb * 4 < iv; i += nb * 8) { /* (both groups' loads before either's arithmetic) */
            long long j = i + nb * 4;
            float4 P0 = *(float4 *)(p + i), G0 = *(float4 *)(g + i), M0 = *(float4 *)(m + i), V0 = *(float4 *)(v + i);
            float4 P1 = *(float4 *)(p + j), G1 = *(float4 *)(g + j), M1 = *(float4 *)(m + j), V1 = *(float4 *)(v + j);
            adamw_quad(P0, G0, M0, V0, p, g, m, v, sh, i, sk, f, lr, b1, b2, eps, wd, bc1, bc2);
            adamw_quad(P1, G1, M1, V1, p, g, m, v, sh, j, sk, f, lr, b1, b2, eps, wd, bc1, bc2);
        }
        for (; i < iv; i += nb * 4)
            adamw_quad(*(float4 *)(p + i), *(float4 *)(g + i), *(float4 *)(m + i), *(float4 *)(v + i), p, g, m, v, sh, i, sk, f, lr, b1, b2, eps,
                       wd, bc1, bc2);
        for (long long e = iv + threadIdx.x; e < i1; e += nb) {
            adamw_element(p + e, g + e, m + e, v + e, f, lr, b1, b2, eps, wd, bc1, bc2);
            if (sk) store_shadow(sh, e, p[e], sk);
        }
    }
}

/* bias_gelu (back 0) and its backward (back 1), k_bias_gelu's arguments and values, over x viewed as [n / nb, nb]
 * (PGD_MEM_GELU2: nb a multiple of 4, x, bias and dy 16-byte aligned, y 8-byte for bf16 / f16 and 16 for f32): a
 * thread takes 4 columns (its 4 biases loaded once: no index modulo a element) of rows blockIdx.y, + gridDim.y, ...,
 * 4 rows' 16-byte loads in flight, y stored 8 (bf16, f16) or 16 (f32) bytes at once (58-62 registers: 4 blocks an SM). */
extern "C" __global__ void __launch_bounds__(256) k_bias_gelu2(const float *__restrict__ x, const float *__restrict__ bias,
                                                               const float *__restrict__ dy, void *__restrict__ y, long long n, long long nb,
                                                               int back, int ydt) {
    long long j = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 4, rows = n / nb, step = gridDim.y, r = blockIdx.y;
    if (j >= nb) return;
    float4 B = *(const float4 *)(bias + j);
    const float b[4] = {B.x, B.y, B.z, B.w};
    for (; r + 3 * step < rows; r += 4 * step) {
        float4 X[4], D[4];
#pragma unroll
        for (int u = 0; u < 4; u++) X[u] = *(const float4 *)(x + (r + u * step) * nb + j);
        if (back)
#pragma unroll
            for (int u = 0; u < 4; u++) D[u] = *(const float4 *)(dy + (r + u * step) * nb + j);
#pragma unroll
        for (int u = 0; u < 4; u++) {
            float xv[4] = {X[u].x, X[u].y, X[u].z, X[u].w}, v[4];
            if (back) {
                float dv[4] = {D[u].x, D[u].y, D[u].z, D[u].w};
                for (int k = 0; k < 4; k++) v[k] = gelu_back_f(xv[k] + b[k], dv[k]);
            } else
                for (int k = 0; k < 4; k++) v[k] = gelu_f(xv[k] + b[k]);
            store_vec<4>(y, (r + u * step) * nb + j, v, ydt);
        }
    }
    for (; r < rows; r += step) {
        float4 X = *(const float4 *)(x + r * nb + j);
        float xv[4] = {X.x, X.y, X.z, X.w}, v[4];
        if (back) {
            float4 D = *(const float4 *)(dy + r * nb + j);
            float dv[4] = {D.x, D.y, D.z, D.w};
            for (int k = 0; k < 4; k++) v[k] = gelu_back_f(xv[k] + b[k], dv[k]);
        } else
            for (int k = 0; k < 4; k++) v[k] = gelu_f(xv[k] + b[k]);
        store_vec<4>(y, r * nb + j, v, ydt);
    }
}
