/* backends/cuda_norm.cuh — layernorm with a warp per row (pgd_ctx.mem_kernels PGD_MEM_LN2: PDDE_CUDA_LN2=1), included
 * by cuda_kernels.cu after its helpers (warp_sum, store_out, f32_to_bf16, f32_to_f16); gpu_kernels.cl's kernels of
 * the same names compute the same. tests/norm_emu.cpp runs them on the CPU.
 *
 * A row of C <= 32 * 4 * G columns lives in its warp's registers: lane l holds the 4-column groups u * 32 + l (u <
 * G), so the row is read from memory once, 16 bytes a load where C is a multiple of 4 and the tensors are
 * 16-byte aligned (else element by element, the same columns), and its sums are warp shuffles, with no block
 * barrier. The one-block-a-row kernels (k_layernorm, k_layernorm_back) read a row up to four times and wait at a
 * block barrier per sum; k_row_stats + k_gamma_back read x twice.
 *  - k_layernorm2: y = (x - mean) * rstd * g + b, k_layernorm's arguments (res / sum: PDDE_FUSE_ADD_LN).
 *  - k_layernorm_back2: dx, k_layernorm_back's arguments (res: PDDE_FUSE_ADD_LN; cp: the rounded copy).
 *  - k_layernorm_gamma2: block b's dgamma partial sums over rows [b * rpb, (b + 1) * rpb) into part[b * C + j], x and
 *    dy read once, each row's statistics computed on the way; k_colsum sums the partials.
 * Each is built for G = 6, 8, 13 and 16 groups a lane (rows up to 768, 1024, 1664 and 2048 columns: the names without
 * and with the suffixes _1024, _1664, _2048, PGD_LN2_WIDTHS in backends/gpu_dispatch.h); the dispatcher takes the
 * narrowest that holds the row. The launch bounds keep every instance within its registers (no spills: nvcc -Xptxas -v). */

/* columns j .. j + 3 of the row at p (0 past C) */
__device__ __forceinline__ void ln2_load(const float *__restrict__ p, long long j, long long C, bool vec, float *v) {
    if (j >= C) {
        for (int k = 0; k < 4; k++) v[k] = 0.0f;
    } else if (vec) {
        float4 q = *(const float4 *)(p + j);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else
        for (int k = 0; k < 4; k++) v[k] = j + k < C ? p[j + k] : 0.0f;
}
/* v stored at columns j .. j + 3 (those below C) of the row at p of dtype dt (0 f32, else bf16 / f16 as store_out rounds) */
__device__ __forceinline__ void ln2_store(void *p, long long j, long long C, bool vec, const float *v, int dt) {
    if (j >= C) return;
    if (!vec) {
        for (int k = 0; k < 4; k++)
            if (j + k < C) store_out(p, j + k, v[k], dt);
    } else if (dt == 0)
        *(float4 *)((float *)p + j) = make_float4(v[0], v[1], v[2], v[3]);
    else {
        unsigned h[4];
        for (int k = 0; k < 4; k++) h[k] = dt == 2 ? f32_to_bf16(v[k]) : f32_to_f16(v[k]);
        *(uint2 *)((unsigned short *)p + j) = make_uint2(h[0] | h[1] << 16, h[2] | h[3] << 16);
    }
}
__device__ __forceinline__ long long ln2_col(int u, int lane) { return (long long)(u * 32 + lane) * 4; }

/* the row's mean and rstd from its values in the warp's registers (0 past C): k_layernorm's two passes */
template <int G>
__device__ __forceinline__ void ln2_stats(const float (*v)[4], long long C, int lane, float eps, float *mean, float *rstd) {
    float s = 0.0f;
#pragma unroll
    for (int u = 0; u < G; u++) s += (v[u][0] + v[u][1]) + (v[u][2] + v[u][3]);
    float m = warp_sum(s) / (float)C, q = 0.0f;
#pragma unroll
    for (int u = 0; u < G; u++)
        for (int k = 0; k < 4; k++)
            if (ln2_col(u, lane) + k < C) {
                float d = v[u][k] - m;
                q += d * d;
            }
    *mean = m;
    *rstd = rsqrtf(warp_sum(q) / (float)C + eps);
}

template <int G>
__device__ __forceinline__ void
layernorm2(const float *__restrict__ x, const float *__restrict__ g, const float *__restrict__ b, void *__restrict__ y,
           long long rows, long long C, float eps, int ydt, const float *__restrict__ res, float *__restrict__ sum) {
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    bool vec = C % 4 == 0 && (((uintptr_t)x | (uintptr_t)g | (uintptr_t)b | (uintptr_t)y | (uintptr_t)res | (uintptr_t)sum) & 15) == 0;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        float v[G][4];
#pragma unroll
        for (int u = 0; u < G; u++) {
            long long j = ln2_col(u, lane);
            ln2_load(x + r * C, j, C, vec, v[u]);
            if (res) { /* (__fadd_rn: the bits of the add this replaces) */
                float q[4];
                ln2_load(res + r * C, j, C, vec, q);
                for (int k = 0; k < 4; k++) v[u][k] = __fadd_rn(v[u][k], q[k]);
                ln2_store(sum + r * C, j, C, vec, v[u], 0);
            }
        }
        float mean, rstd;
        ln2_stats<G>(v, C, lane, eps, &mean, &rstd);
        void *yr = ydt ? (void *)((unsigned short *)y + r * C) : (void *)((float *)y + r * C);
#pragma unroll
        for (int u = 0; u < G; u++) {
            long long j = ln2_col(u, lane);
            if (j >= C) continue;
            float gg[4], bb[4] = {0.0f, 0.0f, 0.0f, 0.0f}, o[4];
            ln2_load(g, j, C, vec, gg);
            if (b) ln2_load(b, j, C, vec, bb);
            for (int k = 0; k < 4; k++) o[k] = (v[u][k] - mean) * rstd * gg[k] + bb[k];
            ln2_store(yr, j, C, vec, o, ydt);
        }
    }
}

/* dx = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)) [+ res], as k_layernorm_back (dy*g rounded once) */
template <int G>
__device__ __forceinline__ void
layernorm_back2(const float *__restrict__ x, const float *__restrict__ g, const float *__restrict__ dy, float *__restrict__ dx,
                long long rows, long long C, float eps, const float *__restrict__ res, void *__restrict__ cp, int cdt) {
    int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;
    bool vec = C % 4 == 0 && (((uintptr_t)x | (uintptr_t)g | (uintptr_t)dy | (uintptr_t)dx | (uintptr_t)res | (uintptr_t)cp) & 15) == 0;
    for (long long r = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += (long long)gridDim.x * wpb) {
        float v[G][4], d[G][4];
#pragma unroll
        for (int u = 0; u < G; u++) {
            long long j = ln2_col(u, lane);
            float gg[4];
            ln2_load(x + r * C, j, C, vec, v[u]);
            ln2_load(dy + r * C, j, C, vec, d[u]);
            ln2_load(g, j, C, vec, gg);
            for (int k = 0; k < 4; k++) d[u][k] = __fmul_rn(d[u][k], gg[k]);
        }
        float mean, rstd;
        ln2_stats<G>(v, C, lane, eps, &mean, &rstd);
        float s1 = 0.0f, s2 = 0.0f; /* (0 past C: d is 0 there) */
#pragma unroll
        for (int u = 0; u < G; u++)
            for (int k = 0; k < 4; k++) {
                s1 += d[u][k];
                s2 += d[u][k] * ((v[u][k] - mean) * rstd);
            }
        s1 = warp_sum(s1) / (float)C;
        s2 = warp_sum(s2) / (float)C;
        void *cr = cdt ? (void *)((unsigned short *)cp + r * C) : NULL;
#pragma unroll
        for (int u = 0; u < G; u++) {
            long long j = ln2_col(u, lane);
            if (j >= C) continue;
            float o[4], q[4];
            if (res) ln2_load(res + r * C, j, C, vec, q);
            for (int k = 0; k < 4; k++) {
                float xh = (v[u][k] - mean) * rstd, w = rstd * (d[u][k] - s1 - xh * s2);
                o[k] = res ? __fadd_rn(q[k], w) : w;
            }
            ln2_store(dx + r * C, j, C, vec, o, 0);
            if (cr) ln2_store(cr, j, C, vec, o, cdt);
        }
    }
}

/* part[blockIdx.x * C + j] = the sum of dy[r, j] * xhat[r, j] over the block's rows (rpb a block), the warps' sums added
 * in warp order (the same bits every run) */
template <int G>
__device__ __forceinline__ void
layernorm_gamma2(const float *__restrict__ x, const float *__restrict__ dy, float *__restrict__ part, long long rows,
                 long long C, float eps, long long rpb) {
    __shared__ float sh[32 * 4 * G];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, wpb = blockDim.x >> 5;
    bool vec = C % 4 == 0 && (((uintptr_t)x | (uintptr_t)dy) & 15) == 0;
    long long r0 = (long long)blockIdx.x * rpb, r1 = r0 + rpb < rows ? r0 + rpb : rows;
    float acc[G][4];
#pragma unroll
    for (int u = 0; u < G; u++)
        for (int k = 0; k < 4; k++) acc[u][k] = 0.0f;
    for (long long r = r0 + w; r < r1; r += wpb) {
        float v[G][4], d[G][4];
#pragma unroll
        for (int u = 0; u < G; u++) {
            ln2_load(x + r * C, ln2_col(u, lane), C, vec, v[u]);
            ln2_load(dy + r * C, ln2_col(u, lane), C, vec, d[u]);
        }
        float mean, rstd;
        ln2_stats<G>(v, C, lane, eps, &mean, &rstd);
#pragma unroll
        for (int u = 0; u < G; u++)
            for (int k = 0; k < 4; k++) acc[u][k] += d[u][k] * ((v[u][k] - mean) * rstd);
    }
    for (int k = 0; k < wpb; k++) {
        if (w == k)
#pragma unroll
            for (int u = 0; u < G; u++)
                for (int e = 0; e < 4; e++) {
                    long long j = ln2_col(u, lane) + e;
                    if (j < C) sh[j] = k ? sh[j] + acc[u][e] : acc[u][e];
                }
        __syncthreads();
    }
    for (long long j = threadIdx.x; j < C; j += blockDim.x) part[(long long)blockIdx.x * C + j] = sh[j];
}

/* the instances: name suffix, groups a lane, and the least blocks of 256 threads a multiprocessor keeps (the register
 * cap: 65536 / (256 * blocks), rounded down to 8) for the forward, dx and dgamma kernels */
#define LN2_INSTANCE(suffix, groups, fwd_blocks, back_blocks, gamma_blocks)                                                    \
    extern "C" __global__ void __launch_bounds__(256, fwd_blocks)                                                             \
    k_layernorm2##suffix(const float *__restrict__ x, const float *__restrict__ g, const float *__restrict__ b, void *__restrict__ y, \
                         long long rows, long long C, float eps, int ydt, const float *__restrict__ res, float *__restrict__ sum) { \
        layernorm2<groups>(x, g, b, y, rows, C, eps, ydt, res, sum);                                                           \
    }                                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, back_blocks)                                                            \
    k_layernorm_back2##suffix(const float *__restrict__ x, const float *__restrict__ g, const float *__restrict__ dy,          \
                              float *__restrict__ dx, long long rows, long long C, float eps, const float *__restrict__ res,   \
                              void *__restrict__ cp, int cdt) {                                                                \
        layernorm_back2<groups>(x, g, dy, dx, rows, C, eps, res, cp, cdt);                                                     \
    }                                                                                                                          \
    extern "C" __global__ void __launch_bounds__(256, gamma_blocks)                                                           \
    k_layernorm_gamma2##suffix(const float *__restrict__ x, const float *__restrict__ dy, float *__restrict__ part,            \
                               long long rows, long long C, float eps, long long rpb) {                                        \
        layernorm_gamma2<groups>(x, dy, part, rows, C, eps, rpb);                                                              \
    }
LN2_INSTANCE(, 6, 3, 2, 2)
LN2_INSTANCE(_1024, 8, 2, 1, 2)
LN2_INSTANCE(_1664, 13, 2, 1, 1)
LN2_INSTANCE(_2048, 16, 1, 1, 1)
