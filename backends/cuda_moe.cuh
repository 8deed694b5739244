/* backends/cuda_moe.cuh — the Mixture-of-Experts kernels of the CUDA backend (included by cuda_kernels.cu;
 * launched by backends/gpu_moe.h), gpu_kernels.cl's k_moe_* line for line. Uses cuda_kernels.cu's
 * GRID_STRIDE, block_sum and the k_gemm tile (GT, GK). tests/moe_emu.cpp runs them on the CPU. */
/* The expert-ordered buffer as backends/cpu_moe.c lays it out: choice (n, j) of token n, expert
 * e = idx[n, j], lands on row off[e] + its rank among e's choices in (n, j) order; off[e] is the sum of
 * the counts before e (cap 0: dropless) or e * cap, and a choice ranked past cap is dropped (row -1).
 * Expert ids outside [0, E) are routed nowhere (row -1). */

/* One block: counts[E] (optional), rows[E] (at most cap), off[E] and, when row is not null, row[nk];
 * each thread owns experts tid, tid + blockDim, ... and scans the ids in order. */
extern "C" __global__ void k_moe_layout(const int *__restrict__ idx, int *counts, int *off, int *rows, int *row, long long nk,
                                        int E, int cap, long long R) {
    int lid = threadIdx.x, L = blockDim.x;
    for (int e = lid; e < E; e += L) {
        int c = 0;
        for (long long i = 0; i < nk; i++) c += idx[i] == e;
        if (counts) counts[e] = c;
        rows[e] = cap > 0 && c > cap ? cap : c;
    }
    __syncthreads();
    if (lid == 0) {
        long long total = 0;
        for (int e = 0; e < E; e++) {
            off[e] = cap > 0 ? e * cap : (int)total;
            total += rows[e];
        }
    }
    __syncthreads();
    if (!row) return;
    for (long long i = lid; i < nk; i += L)
        if (idx[i] < 0 || idx[i] >= E) row[i] = -1;
    for (int e = lid; e < E; e += L) {
        int r = 0, o = off[e], n = rows[e];
        for (long long i = 0; i < nk; i++)
            if (idx[i] == e) {
                row[i] = r < n && o + r < R ? o + r : -1;
                r++;
            }
    }
}

__device__ void moe_softmax_mz(const float *l, int E, float *m, float *z) {
    float mm = -INFINITY, zz = 0.0f;
    for (int e = 0; e < E; e++) mm = l[e] > mm ? l[e] : mm;
    for (int e = 0; e < E; e++) zz += expf(l[e] - mm);
    *m = mm, *z = zz;
}
__device__ __forceinline__ float moe_score(float l, float m, float z, int sig) { return sig ? 1.0f / (1.0f + expf(-l)) : expf(l - m) / z; }

extern "C" __global__ void k_moe_topk(const float *__restrict__ lg, const float *__restrict__ bias, int *out, long long N, int E, int k,
                                      int flags) {
    int sig = flags & 1;
    GRID_STRIDE(n, N) {
        const float *l = lg + n * E;
        int *o = out + n * k;
        float m = 0.0f, z = 1.0f;
        if (!sig) moe_softmax_mz(l, E, &m, &z);
        for (int c = 0; c < k; c++) {
            int best = -1;
            float bs = 0.0f;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int p = 0; p < c && !taken; p++) taken = o[p] == e;
                float s = moe_score(l[e], m, z, sig) + (bias ? bias[e] : 0.0f);
                if (!taken && (best < 0 || s > bs || (isnan(bs) && !isnan(s)))) best = e, bs = s;
            }
            o[c] = best;
        }
    }
}

__device__ void moe_gate_norm(const float *l, const int *id, int E, int k, int flags, float *m, float *den) {
    int sig = flags & 1, norm = !(flags & 2);
    if (!sig && !norm) { moe_softmax_mz(l, E, m, den); return; }
    float mm = -INFINITY, z = 0.0f;
    if (!sig) {
        for (int c = 0; c < k; c++) mm = l[id[c]] > mm ? l[id[c]] : mm;
        for (int c = 0; c < k; c++) z += expf(l[id[c]] - mm);
    } else {
        for (int c = 0; c < k; c++) z += 1.0f / (1.0f + expf(-l[id[c]]));
    }
    *m = mm, *den = sig && !norm ? 1.0f : z;
}
__device__ __forceinline__ float moe_gate_s(float l, float m, int sig) { return sig ? 1.0f / (1.0f + expf(-l)) : expf(l - m); }

extern "C" __global__ void k_moe_gate(const float *__restrict__ lg, const int *__restrict__ idx, const float *__restrict__ dw,
                                      float *out, long long N, int E, int k, int flags, int back) {
    int sig = flags & 1, norm = !(flags & 2);
    GRID_STRIDE(n, N) {
        const float *l = lg + n * E;
        const int *id = idx + n * k;
        int ok = 1;
        for (int c = 0; c < k; c++) ok &= id[c] >= 0 && id[c] < E;
        float m = 0.0f, den = 1.0f;
        if (ok) moe_gate_norm(l, id, E, k, flags, &m, &den);
        if (!back) {
            for (int c = 0; c < k; c++) out[n * k + c] = ok ? moe_gate_s(l[id[c]], m, sig) / den : 0.0f;
        } else {
            const float *d = dw + n * k;
            float *dl = out + n * E;
            float wdw = 0.0f;
            for (int c = 0; c < k && ok; c++) wdw += moe_gate_s(l[id[c]], m, sig) / den * d[c];
            for (int e = 0; e < E; e++) dl[e] = ok && !sig && !norm ? -(expf(l[e] - m) / den) * wdw : 0.0f;
            for (int c = 0; c < k && ok; c++) {
                float s = moe_gate_s(l[id[c]], m, sig), w = s / den;
                if (!sig && norm) dl[id[c]] += w * (d[c] - wdw);
                else if (!sig) dl[id[c]] += d[c] * w;
                else dl[id[c]] += (norm ? (d[c] - wdw) / den : d[c]) * s * (1.0f - s);
            }
        }
    }
}

/* An element of f32 or bf16 data (dt: the dtype enum, 2 bf16) as f32, and a value stored so (bf16: rounded
 * as k_cast rounds) */
__device__ __forceinline__ float moe_ld(const void *p, long long i, int dt) {
    return dt == 2 ? __uint_as_float((unsigned int)((const unsigned short *)p)[i] << 16) : ((const float *)p)[i];
}
__device__ __forceinline__ void moe_st(void *p, long long i, float v, int dt) {
    if (dt == 2) ((unsigned short *)p)[i] = f32_to_bf16(v);
    else ((float *)p)[i] = v;
}

/* x and y f32 or bf16 (xdt, ydt): a bf16 row moved as it is, else computed in f32 and stored as a cast rounds */
extern "C" __global__ void k_moe_dispatch(const void *__restrict__ x, const float *__restrict__ w, const int *__restrict__ row, void *y,
                                          long long nk, int k, long long C, int xdt, int ydt) {
    GRID_STRIDE(i, nk * C) {
        long long ch = i / C, col = i - ch * C, src = (ch / k) * C + col;
        int r = row[ch];
        if (r >= 0 && !w && xdt == 2 && ydt == 2) ((unsigned short *)y)[(long long)r * C + col] = ((const unsigned short *)x)[src];
        else if (r >= 0) moe_st(y, (long long)r * C + col, (w ? w[ch] : 1.0f) * moe_ld(x, src, xdt), ydt);
    }
}

extern "C" __global__ void k_moe_combine(const void *__restrict__ ye, const int *__restrict__ row, const float *__restrict__ w, float *y,
                                         long long N, int k, long long C, int edt) {
    GRID_STRIDE(i, N * C) {
        long long n = i / C, col = i - n * C;
        float acc = 0.0f;
        for (int c = 0; c < k; c++) {
            int r = row[n * k + c];
            if (r >= 0) acc += (w ? w[n * k + c] : 1.0f) * moe_ld(ye, (long long)r * C + col, edt);
        }
        y[i] = acc;
    }
}

extern "C" __global__ void k_moe_combine_back_w(const void *__restrict__ ye, const int *__restrict__ row, const void *__restrict__ dy,
                                                float *dw, long long nk, int k, long long C, int edt, int ddt) {
    GRID_STRIDE(ch, nk) {
        int r = row[ch];
        float d = 0.0f;
        if (r >= 0)
            for (long long i = 0; i < C; i++) d += moe_ld(dy, (ch / k) * C + i, ddt) * moe_ld(ye, (long long)r * C + i, edt);
        dw[ch] = d;
    }
}

/* The grouped GEMM, one launch over all experts (gpu_kernels.cl's k_moe_gemm): blocks (y) are 64-row
 * tiles of the experts in turn, 64 columns each (x); the tile as k_gemm's. */
extern "C" __global__ void __launch_bounds__(256) k_moe_gemm(const float *__restrict__ A, const float *__restrict__ W, float *__restrict__ Y,
                                                             const int *__restrict__ off, const int *__restrict__ rows, int E, int S, int K,
                                                             int N, int tb) {
    int t = blockIdx.y, e = 0, M = 0;
    for (; e < E; e++) { /* the expert of this row tile (the same for the whole block: the return is uniform) */
        M = off ? rows[e] : S;
        int tiles = (M + GT - 1) / GT;
        if (t < tiles) break;
        t -= tiles;
    }
    if (e >= E) return;
    long long o = off ? off[e] : (long long)e * S;
    const float *Ab = A + o * K;
    const float *Bb = W + (long long)e * K * N;
    float *Cb = Y + o * N;
    gemm_tile(Ab, Bb, Cb, M, N, K, 0, tb, t * GT, blockIdx.x * GT);
}

/* dW_e [K, N] = A_e^T B_e over expert e's rows; blocks: 64 x 64 tiles of dW_e (x columns, y rows), z the expert */
extern "C" __global__ void __launch_bounds__(256) k_moe_gemm_back_w(const float *__restrict__ A, const float *__restrict__ B,
                                                                    float *__restrict__ dW, const int *__restrict__ off,
                                                                    const int *__restrict__ rows, int S, int K, int N) {
    int e = blockIdx.z, R = off ? rows[e] : S;
    long long o = off ? off[e] : (long long)e * S;
    const float *Ab = A + o * K;
    const float *Bb = B + o * N;
    float *Cb = dW + (long long)e * K * N;
    gemm_tile(Ab, Bb, Cb, K, N, R, 1, 0, blockIdx.y * GT, blockIdx.x * GT); /* (op(A) = A_e^T: ta) */
}

extern "C" __global__ void k_moe_aux_loss(const float *__restrict__ lg, const int *__restrict__ cnt, float *y, long long N, int E) {
    float total = 0.0f, acc = 0.0f;
    for (int e = 0; e < E; e++) total += (float)cnt[e];
    for (long long n = threadIdx.x; n < N; n += blockDim.x) {
        const float *l = lg + n * E;
        float m, z, pf = 0.0f;
        moe_softmax_mz(l, E, &m, &z);
        for (int e = 0; e < E; e++) pf += expf(l[e] - m) / z * (total > 0.0f ? (float)cnt[e] / total : 0.0f);
        acc += pf;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) y[0] = N ? (float)E * acc / (float)N : 0.0f;
}

extern "C" __global__ void k_moe_aux_loss_back(const float *__restrict__ lg, const int *__restrict__ cnt, const float *__restrict__ dloss,
                                               float *d, long long N, int E) {
    float total = 0.0f, dl = dloss[0] * (float)E / (float)(N ? N : 1);
    for (int e = 0; e < E; e++) total += (float)cnt[e];
    GRID_STRIDE(n, N) {
        const float *l = lg + n * E;
        float m, z, pf = 0.0f;
        moe_softmax_mz(l, E, &m, &z);
        for (int e = 0; e < E; e++) pf += expf(l[e] - m) / z * (total > 0.0f ? (float)cnt[e] / total : 0.0f);
        for (int e = 0; e < E; e++) d[n * E + e] = dl * (expf(l[e] - m) / z) * ((total > 0.0f ? (float)cnt[e] / total : 0.0f) - pf);
    }
}
