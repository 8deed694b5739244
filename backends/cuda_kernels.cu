/* cuda_kernels.cu — the CUDA kernels of the cuda backend (backends/cuda.c), one per op family, f32.
 *
 * Built to PTX with `nvcc -ptx` (see the Makefile rule) and embedded in backends/cuda_kernels_ptx.h,
 * which is committed, so builds without nvcc still carry the kernels; the driver JITs the PTX for
 * the device at device_open. Every kernel is extern "C" so that cuModuleGetFunction finds it by its
 * plain name. The structs below are mirrored, field for field, in backends/cuda.c. */
#include <stdint.h>

#define PDDE_CU_MAX_DIMS 6

/* Broadcast / gather description: for an output of `ndim` dims and `shape`, sa/sb are the element
 * strides of the two inputs for each output dim (0 on a broadcast dim). */
struct pdde_cu_shape {
    long long ndim;
    long long shape[PDDE_CU_MAX_DIMS];
    long long sa[PDDE_CU_MAX_DIMS];
    long long sb[PDDE_CU_MAX_DIMS];
};

/* Reduction description: kept dims (the output's, with their strides in the input) and reduced
 * dims (with their strides in the input). */
struct pdde_cu_reduce {
    long long nk, nr;
    long long kshape[PDDE_CU_MAX_DIMS], kstride[PDDE_CU_MAX_DIMS];
    long long rshape[PDDE_CU_MAX_DIMS], rstride[PDDE_CU_MAX_DIMS];
};

enum { U_SCALE = 0, U_GELU, U_RELU, U_SILU, U_COPY };
enum { B_ADD = 0, B_SUB, B_MUL };

#define GRID_STRIDE(i, n) \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

enum { DT_F32 = 0, DT_F16, DT_BF16, DT_I32, DT_I64 };
#include "cuda_convert.cuh" /* f32 to and from f16 / bf16; store_out; the ld_* loaders */

__device__ __forceinline__ float gelu_f(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2/pi) */
    return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
}
__device__ __forceinline__ float gelu_back_f(float x, float dy) {
    const float k = 0.7978845608028654f;
    float u = k * (x + 0.044715f * x * x * x);
    float t = tanhf(u);
    float du = k * (1.0f + 3.0f * 0.044715f * x * x);
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float unary_f(int op, float x, float a) {
    switch (op) {
    case U_SCALE: return a * x;
    case U_GELU: return gelu_f(x);
    case U_RELU: return x > 0.0f ? x : 0.0f;
    case U_SILU: return x * sigmoid_f(x);
    default: return x;
    }
}

__device__ __forceinline__ float binary_f(int op, float a, float b) {
    switch (op) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    default: return a * b;
    }
}

/* ---- elementwise ------------------------------------------------------------------------------ */

extern "C" __global__ void k_unary(const float *__restrict__ x, float *__restrict__ y, long long n, int op, float a) {
    if ((((uintptr_t)x | (uintptr_t)y) & 15) == 0) {
        long long n4 = n / 4;
        const float4 *x4 = (const float4 *)x;
        float4 *y4 = (float4 *)y;
        GRID_STRIDE(i, n4) {
            float4 v = x4[i];
            v.x = unary_f(op, v.x, a); v.y = unary_f(op, v.y, a);
            v.z = unary_f(op, v.z, a); v.w = unary_f(op, v.w, a);
            y4[i] = v;
        }
        for (long long i = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (long long)gridDim.x * blockDim.x)
            y[i] = unary_f(op, x[i], a);
    } else {
        GRID_STRIDE(i, n) y[i] = unary_f(op, x[i], a);
    }
}

extern "C" __global__ void k_unary_back(const float *__restrict__ x, const float *__restrict__ dy,
                                        float *__restrict__ dx, long long n, int op) {
    GRID_STRIDE(i, n) {
        float v = x[i], g = dy[i], r;
        if (op == U_GELU) r = gelu_back_f(v, g);
        else if (op == U_RELU) r = v > 0.0f ? g : 0.0f;
        else { float s = sigmoid_f(v); r = g * s * (1.0f + v * (1.0f - s)); }
        dx[i] = r;
    }
}

/* y = a op b[i % nb]: same shape (nb == n) or b repeated over a's leading dims (a bias). y may be a. */
extern "C" __global__ void k_binary(const float *a, const float *b, float *y, long long n, long long nb, int op) {
    if (nb == n && (((uintptr_t)a | (uintptr_t)b | (uintptr_t)y) & 15) == 0) {
        long long n4 = n / 4;
        GRID_STRIDE(i, n4) {
            float4 u = ((const float4 *)a)[i], v = ((const float4 *)b)[i];
            u.x = binary_f(op, u.x, v.x); u.y = binary_f(op, u.y, v.y);
            u.z = binary_f(op, u.z, v.z); u.w = binary_f(op, u.w, v.w);
            ((float4 *)y)[i] = u;
        }
        for (long long i = n4 * 4 + (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
             i += (long long)gridDim.x * blockDim.x)
            y[i] = binary_f(op, a[i], b[i]);
    } else if (nb == n) {
        GRID_STRIDE(i, n) y[i] = binary_f(op, a[i], b[i]);
    } else {
        GRID_STRIDE(i, n) y[i] = binary_f(op, a[i], b[i % nb]);
    }
}

/* Index arithmetic in 32 bits where every index fits (64-bit division costs tens of instructions on
 * the GPU); the choice is uniform over the grid, made from the kernel's arguments. */
/* 2^31, so that i + grid stride never wraps in 32 bits */
#define SMALL_INDEX(limit) ((unsigned long long)(limit) < 2147483648ULL)

/* The largest element offset an output index maps to through strides st (plus one). */
__device__ __forceinline__ long long span(const struct pdde_cu_shape &s, const long long *st) {
    long long m = 1;
    for (int d = 0; d < (int)s.ndim; d++) m += (s.shape[d] - 1) * st[d];
    return m;
}

template <typename I>
__device__ __forceinline__ void bcast_body(const float *a, const float *b, float *y, long long n,
                                           const struct pdde_cu_shape &s, int op) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)n; i += (I)gridDim.x * blockDim.x) {
        I r = i, ia = 0, ib = 0;
        for (int d = (int)s.ndim - 1; d >= 0; d--) {
            I sh = (I)s.shape[d], c = r % sh;
            r /= sh;
            ia += c * (I)s.sa[d];
            ib += c * (I)s.sb[d];
        }
        y[i] = binary_f(op, a[ia], b[ib]);
    }
}

/* General numpy broadcasting of both inputs onto the output shape. */
extern "C" __global__ void k_binary_bcast(const float *a, const float *b, float *y, long long n,
                                          struct pdde_cu_shape s, int op) {
    if (SMALL_INDEX(n) && SMALL_INDEX(span(s, s.sa)) && SMALL_INDEX(span(s, s.sb)))
        bcast_body<unsigned>(a, b, y, n, s, op);
    else
        bcast_body<unsigned long long>(a, b, y, n, s, op);
}

template <typename I>
__device__ __forceinline__ void gather_body(const float *__restrict__ x, float *__restrict__ y, long long n,
                                            const struct pdde_cu_shape &s, float scale) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < (I)n; i += (I)gridDim.x * blockDim.x) {
        I r = i, ix = 0;
        for (int d = (int)s.ndim - 1; d >= 0; d--) {
            I sh = (I)s.shape[d], c = r % sh;
            r /= sh;
            ix += c * (I)s.sa[d];
        }
        y[i] = scale * x[ix];
    }
}

/* y[i] = scale * x[gather(i)]: EXPAND (broadcast) and PERMUTE (strided gather) share this. */
extern "C" __global__ void k_gather(const float *__restrict__ x, float *__restrict__ y, long long n,
                                    struct pdde_cu_shape s, float scale) {
    if (SMALL_INDEX(n) && SMALL_INDEX(span(s, s.sa))) gather_body<unsigned>(x, y, n, s, scale);
    else gather_body<unsigned long long>(x, y, n, s, scale);
}

template <typename I>
__device__ __forceinline__ void copy2d_body(const float *__restrict__ src, float *__restrict__ dst, I outer, I rowlen,
                                            I sp, I soff, I dp, I doff) {
    I n = outer * rowlen;
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I o = i / rowlen, j = i - o * rowlen;
        dst[o * dp + doff + j] = src[o * sp + soff + j];
    }
}

/* Row-block copy for CONCAT / SLICE / SLICE_BACK: dst[o*dp + doff + j] = src[o*sp + soff + j]. */
extern "C" __global__ void k_copy2d(const float *__restrict__ src, float *__restrict__ dst, long long outer,
                                    long long rowlen, long long sp, long long soff, long long dp, long long doff) {
    long long pitch = sp > dp ? sp : dp, off = soff > doff ? soff : doff;
    if (SMALL_INDEX(outer * rowlen) && SMALL_INDEX(outer * pitch + off))
        copy2d_body<unsigned>(src, dst, (unsigned)outer, (unsigned)rowlen, (unsigned)sp, (unsigned)soff, (unsigned)dp,
                              (unsigned)doff);
    else
        copy2d_body<unsigned long long>(src, dst, outer, rowlen, sp, soff, dp, doff);
}

/* ---- reductions ------------------------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result. */
__device__ float block_sum(float v) {
    __shared__ float sh[32];
    __syncthreads(); /* sh may still be read by a previous call */
    v = warp_sum(v);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : 0.0f;
    return warp_sum(v);
}
__device__ float block_max(float v) {
    __shared__ float sh[32];
    __syncthreads();
    v = warp_max(v);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : -INFINITY;
    return warp_max(v);
}

/* The element offset of index i of a row-major shape [n dims] with the given strides: where output o
 * starts (the kept dims) and where reduced element r sits from there (the reduced dims). */
__device__ __forceinline__ long long strided_offset(long long i, long long n, const long long *shape, const long long *stride) {
    long long off = 0;
    for (int d = (int)n - 1; d >= 0; d--) {
        long long c = i % shape[d];
        i /= shape[d];
        off += c * stride[d];
    }
    return off;
}

/* One thread per output (coalesced when the kept dims are the innermost ones). */
extern "C" __global__ void k_reduce_thread(const float *__restrict__ x, float *__restrict__ y, long long nout,
                                           long long nred, struct pdde_cu_reduce s, float scale) {
    GRID_STRIDE(o, nout) {
        long long base = strided_offset(o, s.nk, s.kshape, s.kstride);
        float acc = 0.0f;
        for (long long r = 0; r < nred; r++) acc += x[base + strided_offset(r, s.nr, s.rshape, s.rstride)];
        y[o] = scale * acc;
    }
}

/* One block per output (coalesced when the reduced dims are the innermost ones). */
extern "C" __global__ void k_reduce_block(const float *__restrict__ x, float *__restrict__ y, long long nout,
                                          long long nred, struct pdde_cu_reduce s, float scale) {
    for (long long o = blockIdx.x; o < nout; o += gridDim.x) {
        long long base = strided_offset(o, s.nk, s.kshape, s.kstride);
        float acc = 0.0f;
        for (long long r = threadIdx.x; r < nred; r += blockDim.x) acc += x[base + strided_offset(r, s.nr, s.rshape, s.rstride)];
        acc = block_sum(acc);
        if (threadIdx.x == 0) y[o] = scale * acc;
    }
}

/* x viewed as [R, Cn]: y[c, j] = scale * sum of x[r, j] over the rows r of chunk c = blockIdx.y (rpc rows a
 * chunk; one chunk = the whole column sum). Blocks of 32 columns x blockDim.y row lanes (bias gradients). */
extern "C" __global__ void k_colsum(const void *__restrict__ xv, float *__restrict__ y, long long R, long long Cn,
                                    float scale, long long rpc, int xdt) {
    /* x of dtype xdt (0 f32, else DT_BF16 / DT_F16: the bf16 bias gradients of PDDE_BF16_GRADS) */
    __shared__ float sh[32][33];
    long long j = (long long)blockIdx.x * 32 + threadIdx.x;
    long long r0 = (long long)blockIdx.y * rpc, r1 = r0 + rpc < R ? r0 + rpc : R;
    float acc = 0.0f;
    if (j < Cn)
        for (long long r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
            long long i = r * Cn + j;
            acc += xdt == 2 ? ld_bf16::get((const unsigned short *)xv, i)
                 : xdt == 1 ? ld_f16::get((const unsigned short *)xv, i) : ((const float *)xv)[i];
        }
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < Cn) {
        float s = 0.0f;
        for (int k = 0; k < (int)blockDim.y; k++) s += sh[k][threadIdx.x];
        y[(long long)blockIdx.y * Cn + j] = scale * s;
    }
}

/* Full reduction, pass 1: each block writes the sum of (x or x^2) over its grid-stride share. */
extern "C" __global__ void k_sum_partial(const float *__restrict__ x, long long n, int square, float *__restrict__ part) {
    float acc = 0.0f;
    GRID_STRIDE(i, n) { float v = x[i]; acc += square ? v * v : v; }
    acc = block_sum(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}
/* Pass 2 (one block): y[0] = (prev ? prev[0] : 0) + scale * sum(part). */
extern "C" __global__ void k_sum_final(const float *__restrict__ part, long long np, const float *prev,
                                       float scale, float *y) {
    float acc = 0.0f;
    for (long long i = threadIdx.x; i < np; i += blockDim.x) acc += part[i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) y[0] = (prev ? prev[0] : 0.0f) + scale * acc;
}

/* ---- normalisation and softmax: one block per row of C ---------------------------------------- */

/* res (null: none): added to x first, the sum written to sum (planner/lower.c, PDDE_FUSE_ADD_LN; __fadd_rn: the
 * add's bits); each thread reads back only the columns it wrote */
extern "C" __global__ void k_layernorm(const float *__restrict__ x, const float *__restrict__ g,
                                       const float *__restrict__ b, void *__restrict__ y, long long rows,
                                       long long C, float eps, int ydt, const float *__restrict__ res, float *sum) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C;
        if (res) {
            for (long long j = threadIdx.x; j < C; j += blockDim.x) sum[r * C + j] = __fadd_rn(xr[j], res[r * C + j]);
            xr = sum + r * C;
        }
        float s = 0.0f;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) s += xr[j];
        float mean = block_sum(s) / (float)C;
        float v = 0.0f;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) { float d = xr[j] - mean; v += d * d; }
        float rstd = rsqrtf(block_sum(v) / (float)C + eps);
        for (long long j = threadIdx.x; j < C; j += blockDim.x)
            store_out(y, r * C + j, (xr[j] - mean) * rstd * g[j] + (b ? b[j] : 0.0f), ydt);
    }
}

/* dx = rstd * (dy*g - mean(dy*g) - xhat * mean(dy*g*xhat)) */
/* res (null: none): the other gradient of x, added to dx (planner/lower.c, PDDE_FUSE_ADD_LN; __fadd_rn: not
 * contracted into the product, the bits of the add it replaces); cp (null: none): dx also stored as dtype cdt
 * (a rounded copy: PDDE_BF16_GRADS) */
extern "C" __global__ void k_layernorm_back(const float *__restrict__ x, const float *__restrict__ g,
                                            const float *__restrict__ dy, float *__restrict__ dx, long long rows,
                                            long long C, float eps, const float *__restrict__ res, void *__restrict__ cp,
                                            int cdt) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C, *dr = dy + r * C;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) s += xr[j];
        float mean = block_sum(s) / (float)C;
        float v = 0.0f;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) { float d = xr[j] - mean; v += d * d; }
        float rstd = rsqrtf(block_sum(v) / (float)C + eps);
        /* dy*gamma rounded once (__fmul_rn: no FMA contraction), so that g - mean(g) is exactly 0 where
         * it should be (C = 1), as in the CPU reference */
        float s1 = 0.0f, s2 = 0.0f;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            float dg = __fmul_rn(dr[j], g[j]);
            s1 += dg;
            s2 += dg * ((xr[j] - mean) * rstd);
        }
        s1 = block_sum(s1) / (float)C;
        s2 = block_sum(s2) / (float)C;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            float xh = (xr[j] - mean) * rstd, v = rstd * (__fmul_rn(dr[j], g[j]) - s1 - xh * s2);
            float o = res ? __fadd_rn(res[r * C + j], v) : v;
            dx[r * C + j] = o;
            if (cp) store_out(cp, r * C + j, o, cdt);
        }
    }
}

extern "C" __global__ void k_rmsnorm(const float *__restrict__ x, const float *__restrict__ g, float *__restrict__ y,
                                     long long rows, long long C, float eps) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) s += xr[j] * xr[j];
        float rr = rsqrtf(block_sum(s) / (float)C + eps);
        for (long long j = threadIdx.x; j < C; j += blockDim.x) y[r * C + j] = xr[j] * rr * g[j];
    }
}

/* dx = rr * (dy*g - xhat * mean(dy*g * xhat)), the CPU reference's form and its roundings: its two row
 * sums in double, rr = 1/sqrt(mean(x^2) + eps) rounded once to f32, every product rounded (__fmul_rn: no
 * FMA contraction). With C = 1 the result is all cancellation, dy*g*rr*(1 - xhat^2) = dy*g*rr*eps/(x^2 +
 * eps), whose condition number (x^2 + eps)/eps reaches 1e5: a rounding difference of one ulp anywhere
 * (an rsqrtf, a float sum of squares, a contracted product) moves dx by up to 1e-2 relative. */
__device__ double block_sum_d(double v) {
    __shared__ double sh[32];
    __syncthreads();
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = l < nw ? sh[l] : 0.0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
extern "C" __global__ void k_rmsnorm_back(const float *__restrict__ x, const float *__restrict__ g,
                                          const float *__restrict__ dy, float *__restrict__ dx, long long rows,
                                          long long C, float eps) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C, *dr = dy + r * C;
        double s = 0.0, t = 0.0;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) s += (double)xr[j] * (double)xr[j];
        float rr = (float)(1.0 / sqrt(block_sum_d(s) / (double)C + (double)eps));
        for (long long j = threadIdx.x; j < C; j += blockDim.x) t += (double)__fmul_rn(__fmul_rn(dr[j], g[j]), __fmul_rn(xr[j], rr));
        float tm = (float)(block_sum_d(t) / (double)C);
        for (long long j = threadIdx.x; j < C; j += blockDim.x)
            dx[r * C + j] = rr * __fsub_rn(__fmul_rn(dr[j], g[j]), __fmul_rn(__fmul_rn(xr[j], rr), tm));
    }
}

/* Per-row statistics for the gamma gradients: st[2r] = mean (0 for rms), st[2r+1] = rstd. */
extern "C" __global__ void k_row_stats(const float *__restrict__ x, float *__restrict__ st, long long rows,
                                       long long C, float eps, int rms) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C;
        float mean = 0.0f;
        if (!rms) {
            float s = 0.0f;
            for (long long j = threadIdx.x; j < C; j += blockDim.x) s += xr[j];
            mean = block_sum(s) / (float)C;
        }
        float v = 0.0f;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) { float d = xr[j] - mean; v += d * d; }
        float rstd = rsqrtf(block_sum(v) / (float)C + eps);
        if (threadIdx.x == 0) { st[2 * r] = mean; st[2 * r + 1] = rstd; }
    }
}

/* dgamma_j = sum_r dy[r,j] * xhat[r,j] over the rows of chunk blockIdx.y (rpc rows a chunk), into
 * dg[blockIdx.y * C + j]: blocks of 32 columns x blockDim.y row lanes, reduced in shared memory. */
extern "C" __global__ void k_gamma_back(const float *__restrict__ x, const float *__restrict__ dy,
                                        const float *__restrict__ st, float *__restrict__ dg, long long rows,
                                        long long C, long long rpc) {
    __shared__ float sh[32][33];
    long long j = (long long)blockIdx.x * 32 + threadIdx.x;
    long long r0 = (long long)blockIdx.y * rpc, r1 = r0 + rpc < rows ? r0 + rpc : rows;
    float acc = 0.0f;
    if (j < C)
        for (long long r = r0 + threadIdx.y; r < r1; r += blockDim.y)
            acc += dy[r * C + j] * (x[r * C + j] - st[2 * r]) * st[2 * r + 1];
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && j < C) {
        float s = 0.0f;
        for (int k = 0; k < (int)blockDim.y; k++) s += sh[k][threadIdx.x];
        dg[(long long)blockIdx.y * C + j] = s;
    }
}

/* Softmax over rows of C; causal masks column j > i where i = row index within the last-but-one dim (T). */
extern "C" __global__ void k_softmax(const float *__restrict__ x, float *__restrict__ y, long long rows,
                                     long long C, long long T, int causal) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * C;
        long long lim = causal ? (r % T) + 1 : C;
        if (lim > C) lim = C;
        float m = -INFINITY;
        for (long long j = threadIdx.x; j < lim; j += blockDim.x) m = fmaxf(m, xr[j]);
        m = block_max(m);
        float s = 0.0f;
        for (long long j = threadIdx.x; j < lim; j += blockDim.x) s += expf(xr[j] - m);
        float inv = 1.0f / block_sum(s);
        for (long long j = threadIdx.x; j < C; j += blockDim.x)
            y[r * C + j] = j < lim ? expf(xr[j] - m) * inv : 0.0f;
    }
}

extern "C" __global__ void k_softmax_back(const float *__restrict__ y, const float *__restrict__ dy,
                                          float *__restrict__ dx, long long rows, long long C) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *yr = y + r * C, *dr = dy + r * C;
        float s = 0.0f;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) s += yr[j] * dr[j];
        s = block_sum(s);
        for (long long j = threadIdx.x; j < C; j += blockDim.x) dx[r * C + j] = yr[j] * (dr[j] - s);
    }
}

/* A row's loss without a class: 0 for a negative target (ignored), NaN for one >= V, which makes the loss NaN
 * so that the session's check of the loss finds the target and names it (as gpu_kernels.cl's). */
#define CE_IGNORED_LOSS(t) ((t) < 0 ? 0.0f : nanf(""))

/* Cross-entropy, pass 1: loss of each row (CE_IGNORED_LOSS for a row without a class) in part[r], 1/0 in part[rows + r]. */
template <typename L>
__device__ __forceinline__ void ce_rows_body(const typename L::T *__restrict__ logits, const int *__restrict__ tgt,
                                             float *__restrict__ part, long long rows, long long V) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename L::T *lr = logits + r * V;
        int t = tgt[r];
        float m = -INFINITY;
        for (long long j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, L::get(lr, j));
        m = block_max(m);
        float s = 0.0f;
        for (long long j = threadIdx.x; j < V; j += blockDim.x) s += expf(L::get(lr, j) - m);
        s = block_sum(s);
        if (threadIdx.x == 0) {
            int ok = t >= 0 && t < V;
            part[r] = ok ? (logf(s) + m - L::get(lr, t)) : CE_IGNORED_LOSS(t);
            part[rows + r] = ok ? 1.0f : 0.0f;
        }
    }
}
/* (logits of dtype ldt: 0 f32, 2 bf16, 1 f16) */
extern "C" __global__ void k_ce_rows(const void *__restrict__ logits, const int *__restrict__ tgt,
                                     float *__restrict__ part, long long rows, long long V, int ldt) {
    if (ldt == 2) ce_rows_body<ld_bf16>((const unsigned short *)logits, tgt, part, rows, V);
    else if (ldt == 1) ce_rows_body<ld_f16>((const unsigned short *)logits, tgt, part, rows, V);
    else ce_rows_body<ld_f32>((const float *)logits, tgt, part, rows, V);
}
/* Pass 2 (one block): y = sum(loss) / max(count, 1). */
extern "C" __global__ void k_ce_final(const float *__restrict__ part, long long rows, float *y) {
    float s = 0.0f, c = 0.0f;
    for (long long i = threadIdx.x; i < rows; i += blockDim.x) { s += part[i]; c += part[rows + i]; }
    s = block_sum(s);
    c = block_sum(c);
    if (threadIdx.x == 0) y[0] = c > 0.0f ? s / c : 0.0f;
}
/* Count of valid targets (one block) into cnt[0]. */
extern "C" __global__ void k_ce_count(const int *__restrict__ tgt, long long rows, long long V, float *cnt) {
    float c = 0.0f;
    for (long long i = threadIdx.x; i < rows; i += blockDim.x) c += (tgt[i] >= 0 && tgt[i] < V) ? 1.0f : 0.0f;
    c = block_sum(c);
    if (threadIdx.x == 0) cnt[0] = c;
}
/* dlogits = (softmax - onehot) * dloss / count, zero on ignored rows. */
template <typename L>
__device__ __forceinline__ void ce_back_body(const typename L::T *__restrict__ logits, const int *__restrict__ tgt,
                                             const float *__restrict__ dloss, const float *__restrict__ cnt,
                                             void *__restrict__ dx, long long rows, long long V, int ydt) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const typename L::T *lr = logits + r * V;
        int t = tgt[r];
        if (!(t >= 0 && t < V)) {
            for (long long j = threadIdx.x; j < V; j += blockDim.x) store_out(dx, r * V + j, 0.0f, ydt);
            continue;
        }
        float m = -INFINITY;
        for (long long j = threadIdx.x; j < V; j += blockDim.x) m = fmaxf(m, L::get(lr, j));
        m = block_max(m);
        float s = 0.0f;
        for (long long j = threadIdx.x; j < V; j += blockDim.x) s += expf(L::get(lr, j) - m);
        float c = cnt[0] > 0.0f ? cnt[0] : 1.0f;
        float scale = dloss[0] / c, inv = 1.0f / block_sum(s);
        for (long long j = threadIdx.x; j < V; j += blockDim.x)
            store_out(dx, r * V + j, (expf(L::get(lr, j) - m) * inv - (j == t ? 1.0f : 0.0f)) * scale, ydt);
    }
}
/* (logits of dtype ldt, as k_ce_rows) */
extern "C" __global__ void k_ce_back(const void *__restrict__ logits, const int *__restrict__ tgt,
                                     const float *__restrict__ dloss, const float *__restrict__ cnt,
                                     void *__restrict__ dx, long long rows, long long V, int ydt, int ldt) {
    if (ldt == 2) ce_back_body<ld_bf16>((const unsigned short *)logits, tgt, dloss, cnt, dx, rows, V, ydt);
    else if (ldt == 1) ce_back_body<ld_f16>((const unsigned short *)logits, tgt, dloss, cnt, dx, rows, V, ydt);
    else ce_back_body<ld_f32>((const float *)logits, tgt, dloss, cnt, dx, rows, V, ydt);
}

/* ---- embedding -------------------------------------------------------------------------------- */

template <typename I>
__device__ __forceinline__ void embedding_body(const float *__restrict__ table, const int *__restrict__ ids,
                                               float *__restrict__ y, I n, I C, long long V) {
    for (I i = (I)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (I)gridDim.x * blockDim.x) {
        I r = i / C, j = i - r * C;
        int id = ids[r];
        y[i] = (id >= 0 && id < V) ? table[(I)id * C + j] : __int_as_float(0x7fc00000); /* (NaN: the step's loss check names the id) */
    }
}

extern "C" __global__ void k_embedding(const float *__restrict__ table, const int *__restrict__ ids,
                                       float *__restrict__ y, long long n_ids, long long C, long long V) {
    if (SMALL_INDEX(n_ids * C) && SMALL_INDEX(V * C)) embedding_body<unsigned>(table, ids, y, (unsigned)(n_ids * C), (unsigned)C, V);
    else embedding_body<unsigned long long>(table, ids, y, n_ids * C, C, V);
}

extern "C" __global__ void k_embedding_back(const float *__restrict__ dy, const int *__restrict__ ids,
                                            float *__restrict__ out, long long n_ids, long long C, long long V) {
    long long n = n_ids * C;
    GRID_STRIDE(i, n) {
        long long r = i / C, j = i - r * C;
        int id = ids[r];
        if (id >= 0 && id < V) atomicAdd(&out[(long long)id * C + j], dy[i]);
    }
}

#include "cuda_embedding.cuh" /* the reproducible backward: ids sorted, each row's sum in their order */

/* ---- dropout ---------------------------------------------------------------------------------- */

/* Must match the CPU backend's dropout_hash bit for bit: keep element i when h >= threshold (p * 2^32). */
__device__ __forceinline__ unsigned int dropout_hash(unsigned int lo, unsigned int hi, unsigned int counter,
                                                     unsigned long long i) {
    unsigned long long z = (((unsigned long long)hi << 32) | lo) ^ (0x9E3779B97F4A7C15ULL * (unsigned long long)(counter + 1u)) ^
                           (i * 0xD1B54A32D192ED03ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return (unsigned int)((z ^ (z >> 31)) >> 32);
}
extern "C" __global__ void k_dropout(const float *__restrict__ x, float *__restrict__ y, long long n,
                                     unsigned int threshold, float scale, unsigned int seed_lo, unsigned int seed_hi,
                                     unsigned int counter) {
    GRID_STRIDE(i, n) y[i] = dropout_hash(seed_lo, seed_hi, counter, (unsigned long long)i) >= threshold ? x[i] * scale : 0.0f;
}

/* ---- casts ------------------------------------------------------------------------------------ */

extern "C" __global__ void k_cast(const void *__restrict__ src, void *__restrict__ dst, long long n, int sdt, int ddt) {
    GRID_STRIDE(i, n) {
        if ((sdt == DT_I32 || sdt == DT_I64) && (ddt == DT_I32 || ddt == DT_I64)) {
            long long v = sdt == DT_I32 ? (long long)((const int *)src)[i] : ((const long long *)src)[i];
            if (ddt == DT_I32) ((int *)dst)[i] = (int)v;
            else ((long long *)dst)[i] = v;
            continue;
        }
        float v;
        switch (sdt) {
        case DT_F32: v = ((const float *)src)[i]; break;
        case DT_F16: v = f16_to_f32(((const unsigned short *)src)[i]); break;
        case DT_BF16: v = __uint_as_float((unsigned int)((const unsigned short *)src)[i] << 16); break;
        case DT_I32: v = (float)((const int *)src)[i]; break;
        default: v = (float)((const long long *)src)[i]; break;
        }
        switch (ddt) {
        case DT_F32: ((float *)dst)[i] = v; break;
        case DT_F16: ((unsigned short *)dst)[i] = f32_to_f16(v); break;
        case DT_BF16: ((unsigned short *)dst)[i] = f32_to_bf16(v); break;
        case DT_I32: ((int *)dst)[i] = (int)v; break;
        default: ((long long *)dst)[i] = (long long)v; break;
        }
    }
}

/* ---- optimizers ------------------------------------------------------------------------------- */

/* A squared norm that is not finite (a NaN or an overflow in some gradient) makes an update a no-op:
 * parameter, state and gradient stay as they are, and the host, reading the norm once after the
 * step's work, reports it (or, under loss scaling, skips the step) without a wait before the update. */
__device__ __forceinline__ bool update_skipped(const float *gnorm_sq) { return gnorm_sq && !isfinite(gnorm_sq[0]); }

/* The factor that clips the gradient to clip_norm given the (scaled) squared norm. */
__device__ __forceinline__ float clip_factor(const float *gnorm_sq, float clip) {
    if (!gnorm_sq || clip <= 0.0f) return 1.0f;
    float nrm = sqrtf(gnorm_sq[0]);
    return nrm > clip ? clip / (nrm + 1e-6f) : 1.0f;
}

/* The parameter's bf16/f16 copy (sdt; 0: none) of its new value: the rounding its cast would make. */
__device__ __forceinline__ void store_shadow(void *sh, long long i, float v, int sdt) {
    if (sdt == DT_BF16) ((unsigned short *)sh)[i] = f32_to_bf16(v);
    else if (sdt == DT_F16) ((unsigned short *)sh)[i] = f32_to_f16(v);
}

extern "C" __global__ void k_sgd(float *__restrict__ p, float *__restrict__ g, float *__restrict__ mom,
                                 const float *gnorm_sq, long long n, float lr, float momentum, float wd,
                                 float clip, float gscale, void *sh, int sdt) {
    if (update_skipped(gnorm_sq)) return;
    float f = gscale * clip_factor(gnorm_sq, clip);
    GRID_STRIDE(i, n) {
        float gi = g[i] * f + wd * p[i];
        float v = gi;
        if (mom) { float b = momentum * mom[i] + gi; mom[i] = b; if (momentum > 0.0f) v = b; }
        p[i] -= lr * v;
        g[i] = 0.0f;
        if (sdt) store_shadow(sh, i, p[i], sdt);
    }
}

/* One element of an AdamW step (f: the gradient's scale, clipping included). */
__device__ __forceinline__ void adamw_element(float *p, float *g, float *m, float *v, float f, float lr, float b1, float b2,
                                              float eps, float wd, float bc1, float bc2) {
    float gi = *g * f;
    float mi = b1 * *m + (1.0f - b1) * gi;
    float vi = b2 * *v + (1.0f - b2) * gi * gi;
    *m = mi;
    *v = vi;
    float mh = mi / bc1, vh = vi / bc2;
    *p -= lr * (mh / (sqrtf(vh) + eps) + wd * *p);
    *g = 0.0f;
}

extern "C" __global__ void k_adamw(float *__restrict__ p, float *__restrict__ g, float *__restrict__ m,
                                   float *__restrict__ v, const float *gnorm_sq, long long n, float lr, float b1,
                                   float b2, float eps, float wd, float clip, float gscale, float bc1, float bc2,
                                   void *sh, int sdt) {
    if (update_skipped(gnorm_sq)) return;
    float f = gscale * clip_factor(gnorm_sq, clip);
    GRID_STRIDE(i, n) {
        adamw_element(p + i, g + i, m + i, v + i, f, lr, b1, b2, eps, wd, bc1, bc2);
        if (sdt) store_shadow(sh, i, p[i], sdt);
    }
}

/* ---- GEMM fallback (when cuBLAS is absent) ----------------------------------------------------- */

#include "cuda_gemm_tile.cuh"
/* C[b] (MxN, row-major) = op(A[b]) op(B[b]) (op as gemm_tile's); blocks: 64x64 tiles (x columns, y rows), z the batch */
extern "C" __global__ void __launch_bounds__(256) k_gemm(const float *__restrict__ A, const float *__restrict__ B,
                                                         float *__restrict__ Cm, int M, int N, int K, int ta, int tb,
                                                         long long sA, long long sB, long long sC) {
    gemm_tile(A + (long long)blockIdx.z * sA, B + (long long)blockIdx.z * sB, Cm + (long long)blockIdx.z * sC, M, N, K, ta, tb,
              blockIdx.y * GT, blockIdx.x * GT);
}

/* ---- fused causal attention (backends/gpu_kernels.cl has the same kernels, commented there) ------ */

#define PGD_ATT_DMAX 128 /* the largest head dim (backends/gpu_dispatch.h sends larger ones to the CPU) */

#include "cuda_att_layout.cuh"

extern "C" __global__ void k_attention(const float *__restrict__ q, const float *__restrict__ k,
                                       const float *__restrict__ v, float *__restrict__ y, long long BH, long long T,
                                       long long D, float scale, long long H, const int *__restrict__ starts, long long heads) {
    GRID_STRIDE(r, BH * T) {
        long long i = r % T;
        float qr[PGD_ATT_DMAX], acc[PGD_ATT_DMAX];
        for (long long d = 0; d < D; d++) qr[d] = q[att_in(r, T, D, H) + d], acc[d] = 0.0f;
        float m = -INFINITY, l = 0.0f;
        for (long long j = att_lo(starts, r, T, heads); j <= i; j++) {
            const float *kj = k + att_in(r - i + j, T, D, H), *vj = v + att_in(r - i + j, T, D, H);
            float s = 0.0f;
            for (long long d = 0; d < D; d++) s += qr[d] * kj[d];
            s *= scale;
            if (s > m) {
                float a = expf(m - s);
                l *= a;
                for (long long d = 0; d < D; d++) acc[d] *= a;
                m = s;
            }
            float p = expf(s - m);
            l += p;
            for (long long d = 0; d < D; d++) acc[d] += p * vj[d];
        }
        float *yr = y + att_y(r, T, D, H);
        for (long long d = 0; d < D; d++) yr[d] = acc[d] / l;
        y[att_lse(r, BH * T, D, H)] = m + logf(l);
    }
}

extern "C" __global__ void k_attention_back_q(const float *__restrict__ q, const float *__restrict__ k,
                                              const float *__restrict__ v, const float *__restrict__ y,
                                              const float *__restrict__ dy, float *__restrict__ rowdot,
                                              float *__restrict__ out, long long BH, long long T, long long D, float scale,
                                              long long H, const int *__restrict__ starts, long long heads) {
    GRID_STRIDE(r, BH * T) {
        long long i = r % T, yo = att_y(r, T, D, H);
        float qr[PGD_ATT_DMAX], dor[PGD_ATT_DMAX], dq[PGD_ATT_DMAX];
        float dot = 0.0f;
        for (long long d = 0; d < D; d++) {
            qr[d] = q[att_in(r, T, D, H) + d], dor[d] = dy[yo + d], dq[d] = 0.0f;
            dot += dor[d] * y[yo + d];
        }
        rowdot[r] = dot;
        float lse = y[att_lse(r, BH * T, D, H)];
        for (long long j = att_lo(starts, r, T, heads); j <= i; j++) {
            const float *kj = k + att_in(r - i + j, T, D, H), *vj = v + att_in(r - i + j, T, D, H);
            float s = 0.0f, dp = 0.0f;
            for (long long d = 0; d < D; d++) s += qr[d] * kj[d], dp += dor[d] * vj[d];
            float ds = expf(s * scale - lse) * (dp - dot);
            for (long long d = 0; d < D; d++) dq[d] += ds * kj[d];
        }
        for (long long d = 0; d < D; d++) out[att_out(r, 0, BH * T, T, D, H) + d] = scale * dq[d];
    }
}

extern "C" __global__ void k_attention_back_kv(const float *__restrict__ q, const float *__restrict__ k,
                                               const float *__restrict__ v, const float *__restrict__ y,
                                               const float *__restrict__ dy, float *__restrict__ rowdot,
                                               float *__restrict__ out, long long BH, long long T, long long D,
                                               float scale, long long H, const int *__restrict__ starts, long long heads) {
    GRID_STRIDE(r, BH * T) {
        long long j = r % T, rows = BH * T, ko = att_in(r, T, D, H);
        float kr[PGD_ATT_DMAX], vr[PGD_ATT_DMAX], dk[PGD_ATT_DMAX], dv[PGD_ATT_DMAX];
        for (long long d = 0; d < D; d++) kr[d] = k[ko + d], vr[d] = v[ko + d], dk[d] = 0.0f, dv[d] = 0.0f;
        for (long long ri = r; ri < r - j + T; ri++) {
            if (att_lo(starts, ri, T, heads) > j) continue;
            const float *qi = q + att_in(ri, T, D, H), *doi = dy + att_y(ri, T, D, H);
            float s = 0.0f, dp = 0.0f;
            for (long long d = 0; d < D; d++) s += qi[d] * kr[d], dp += doi[d] * vr[d];
            float p = expf(s * scale - y[att_lse(ri, rows, D, H)]), ds = p * (dp - rowdot[ri]);
            for (long long d = 0; d < D; d++) dv[d] += p * doi[d], dk[d] += ds * qi[d];
        }
        for (long long d = 0; d < D; d++)
            out[att_out(r, 1, rows, T, D, H) + d] = scale * dk[d], out[att_out(r, 2, rows, T, D, H) + d] = dv[d];
    }
}

/* ---- multi-tensor AdamW: up to MULTI_MAX tensors in one launch ------------------------------------ */

/* Mirrors pgd_multi (backends/gpu_dispatch.h): tensor k's element count, and the element offsets of
 * its parameter, gradient and moments from their buffer's start (and of its bf16/f16 copy, in 2-byte
 * elements; -1: none), with its weight decay. */
#define MULTI_MAX 16
struct pdde_cu_multi {
    long long n[MULTI_MAX], p[MULTI_MAX], g[MULTI_MAX], m[MULTI_MAX], v[MULTI_MAX], s[MULTI_MAX];
    float wd[MULTI_MAX];
};

/* Tensor k = block row k (blockIdx.y); gradients in gbase, the rest in base. */
extern "C" __global__ void k_adamw_multi(float *base, float *gbase, const float *gnorm_sq, struct pdde_cu_multi t, float lr,
                                         float b1, float b2, float eps, float clip, float gscale, float bc1, float bc2,
                                         int sdt) {
    if (update_skipped(gnorm_sq)) return;
    int k = blockIdx.y;
    float f = gscale * clip_factor(gnorm_sq, clip);
    float *p = base + t.p[k], *g = gbase + t.g[k], *m = base + t.m[k], *v = base + t.v[k];
    unsigned short *sh = (unsigned short *)base + (t.s[k] >= 0 ? t.s[k] : 0);
    int sk = t.s[k] >= 0 ? sdt : 0; /* (-1: no copy) */
    GRID_STRIDE(i, t.n[k]) {
        adamw_element(p + i, g + i, m + i, v + i, f, lr, b1, b2, eps, t.wd[k], bc1, bc2);
        if (sk) store_shadow(sh, i, p[i], sk);
    }
}

#include "cuda_mem.cuh" /* the fused cross-entropy, column sums in two levels, AdamW in chunks */
#include "cuda_norm.cuh" /* layernorm with a warp per row (PDDE_CUDA_LN2) */
#include "cuda_rope.cuh" /* rotary position embedding (PDDE_CUDA_ROPE) */

/* ---- fused kernels ---------------------------------------------------------------------------- */

/* bias_gelu (back = 0): y = gelu(x + bias[i % nb]); its backward (back = 1): y = dy * gelu'(x + bias) */
extern "C" __global__ void k_bias_gelu(const float *__restrict__ x, const float *__restrict__ bias,
                                       const float *__restrict__ dy, void *__restrict__ y, long long n, long long nb,
                                       int back, int ydt) {
    GRID_STRIDE(i, n) {
        float v = x[i] + bias[i % nb];
        store_out(y, i, back ? gelu_back_f(v, dy[i]) : gelu_f(v), ydt);
    }
}

/* ---- attention, unfused inside the node (backends/gpu_dispatch.h, pgd_attention_unfused) ------- */

/* Rows of S [rows, T] (row r is query r % T of its head; the attention's row r0 + r): P = causal softmax(scale *
 * S) over the row's keys lo .. t (att_lo of starts; lo 0 without), 0 elsewhere, as f32 or bf16 (pdt: the dtype
 * enum) and each row's logsumexp over those keys into lse[r * ls]; from_lse: P = exp(scale * S - lse) from a saved
 * logsumexp (one pass). Reads S only over those keys. */
extern "C" __global__ void k_att_softmax(const float *__restrict__ s, void *__restrict__ p, float *__restrict__ lse,
                                         long long rows, long long T, float scale, long long ls, int from_lse, int pdt,
                                         const int *__restrict__ starts, long long r0, long long heads) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *sr = s + r * T;
        long long lim = r % T + 1, lo = att_lo(starts, r0 + r, T, heads);
        float m, inv = 1.0f;
        if (from_lse) {
            m = lse[r * ls];
        } else {
            m = -INFINITY;
            for (long long j = lo + threadIdx.x; j < lim; j += blockDim.x) m = fmaxf(m, scale * sr[j]);
            m = block_max(m);
            float z = 0.0f;
            for (long long j = lo + threadIdx.x; j < lim; j += blockDim.x) z += expf(scale * sr[j] - m);
            z = block_sum(z);
            inv = 1.0f / z;
            if (threadIdx.x == 0) lse[r * ls] = m + logf(z);
        }
        for (long long j = threadIdx.x; j < T; j += blockDim.x) {
            float v = j < lim && j >= lo ? expf(scale * sr[j] - m) * inv : 0.0f;
            if (pdt == DT_BF16) ((unsigned short *)p)[r * T + j] = f32_to_bf16(v);
            else ((float *)p)[r * T + j] = v;
        }
    }
}

/* dS = scale * P (dP - rowsum(P dP)) with P = exp(scale * S - lse) recomputed, over the keys each row sees
 * (k_att_softmax's; 0 elsewhere), as f32 or bf16 (dsdt). The row sum is taken over the same dP (rather than dO . O),
 * so that it cancels exactly where it should (one key: dS = 0) whatever the GEMMs rounded. */
extern "C" __global__ void k_att_dsoftmax(const float *__restrict__ s, const float *__restrict__ dp, const float *__restrict__ lse,
                                          void *__restrict__ ds, long long rows, long long T, float scale, long long ls, int dsdt,
                                          const int *__restrict__ starts, long long r0, long long heads) {
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *sr = s + r * T, *dr = dp + r * T;
        long long lim = r % T + 1, lo = att_lo(starts, r0 + r, T, heads);
        float m = lse[r * ls], t = 0.0f;
        for (long long j = lo + threadIdx.x; j < lim; j += blockDim.x) t += expf(scale * sr[j] - m) * dr[j];
        t = block_sum(t);
        for (long long j = threadIdx.x; j < T; j += blockDim.x) {
            float v = j < lim && j >= lo ? scale * (expf(scale * sr[j] - m) * (dr[j] - t)) : 0.0f;
            if (dsdt == DT_BF16) ((unsigned short *)ds)[r * T + j] = f32_to_bf16(v);
            else ((float *)ds)[r * T + j] = v;
        }
    }
}

/* ---- tiled causal attention (backends/gpu_kernels.cl has the same schedule, commented there) ----- */

/* rowdot[r] = dO_r . O_r (y and dy [rows, D + 1]: the output columns) */
extern "C" __global__ void k_flash_rowdot(const float *__restrict__ y, const float *__restrict__ dy, float *__restrict__ rowdot,
                                          long long rows, long long D, long long T, long long H) {
    GRID_STRIDE(r, rows) {
        float dot = 0.0f;
        long long o = att_y(r, T, D, H);
        for (long long d = 0; d < D; d++) dot += dy[o + d] * y[o + d];
        rowdot[r] = dot;
    }
}

extern "C" __global__ void k_att_repack(void *packed, void *flat, long long r0, long long n, long long T, long long D,
                                        long long H, int which, int esz, int to_flat) {
    GRID_STRIDE(e, n * D) {
        long long r = r0 + e / D, d = e % D, po = (which < 0 ? att_y(r, T, D, H) : att_in(r, T, D, H) + which * D) + d;
        if (esz == 2 && to_flat) ((unsigned short *)flat)[e] = ((const unsigned short *)packed)[po];
        else if (esz == 2) ((unsigned short *)packed)[po] = ((const unsigned short *)flat)[e];
        else if (to_flat) ((float *)flat)[e] = ((const float *)packed)[po];
        else ((float *)packed)[po] = ((const float *)flat)[e];
    }
}

#include "cuda_flash_f32.cuh"

/* f32 q, k, v (backends/cuda_flash_f32.cuh; the dispatcher sends them only where a tiled path is named:
 * PGD_FLASH_F32_NAMED, and never a node with starts): the arguments of k_flash_* (D, bf16, starts, heads and cp
 * unused), a kernel per head size, in
 * both modules (SIMT FMAs only: no compute capability 8.0 instruction); k_flash_f32_back2: flash2's
 * one-pass backward (dk, dv and dq by atomics) */
#define FF_MINBLOCKS 3 /* (the registers of three blocks an SM; without it ptxas caps sm_90's forward at 128 and spills) */
#define FF_KERNELS(D, sfx)                                                                                             \
    extern "C" __global__ void __launch_bounds__(FF_T, FF_MINBLOCKS) k_flash_f32_fwd##sfx(                                          \
        const void *q, const void *k, const void *v, float *y, long long BH, long long T, long long Dn, float scale,    \
        int bf16, long long H, const int *starts, long long heads, void *cp) {                                         \
        __shared__ __align__(16) float sm[FF_SMEM_FWD(D)];                                                             \
        (void)Dn, (void)bf16, (void)starts, (void)heads, (void)cp;                                                                                \
        ff_fwd<D>(sm, (const float *)q, (const float *)k, (const float *)v, y, BH, T, scale, H);                       \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FF_T, FF_MINBLOCKS) k_flash_f32_back_dq##sfx(                                      \
        const void *q, const void *k, const void *v, const float *y, const float *dy, const float *rowdot, float *out,  \
        long long BH, long long T, long long Dn, float scale, int bf16, long long H, const int *starts, long long heads,  \
        void *cp) {                                                                                                    \
        __shared__ __align__(16) float sm[FF_SMEM_DQ(D)];                                                              \
        (void)Dn, (void)bf16, (void)starts, (void)heads, (void)cp;                                                                                \
        ff_dq<D>(sm, (const float *)q, (const float *)k, (const float *)v, y, dy, rowdot, out, BH, T, scale, H);       \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FF_T, FF_MINBLOCKS) k_flash_f32_back_dkv##sfx(                                     \
        const void *q, const void *k, const void *v, const float *y, const float *dy, const float *rowdot, float *out,  \
        long long BH, long long T, long long Dn, float scale, int bf16, long long H, const int *starts, long long heads,  \
        void *cp) {                                                                                                    \
        __shared__ __align__(16) float sm[FF_SMEM_DKV(D)];                                                             \
        (void)Dn, (void)bf16, (void)starts, (void)heads, (void)cp;                                                                                \
        ff_dkv<D, false>(sm, (const float *)q, (const float *)k, (const float *)v, y, dy, rowdot, out, BH, T, scale, H); \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(FF_T, FF_MINBLOCKS) k_flash_f32_back2##sfx(                          \
        const void *q, const void *k, const void *v, const float *y, const float *dy, const float *rowdot, float *out,  \
        long long BH, long long T, long long Dn, float scale, int bf16, long long H, const int *starts, long long heads,  \
        void *cp) {                                                                                                    \
        __shared__ __align__(16) float sm[FF_SMEM_DKV(D)];                                                             \
        (void)Dn, (void)bf16, (void)starts, (void)heads, (void)cp;                                                                                \
        ff_dkv<D, true>(sm, (const float *)q, (const float *)k, (const float *)v, y, dy, rowdot, out, BH, T, scale, H);  \
    }
FF_KERNELS(64, )
FF_KERNELS(128, _d128)
/* dq's rows (out, att_out 0) zeroed for k_flash_f32_back2's atomics */
extern "C" __global__ void k_flash_f32_zero_dq(float *out, long long rows, long long D, long long T, long long H) {
    GRID_STRIDE(e, rows * D) out[att_out(e / D, 0, rows, T, D, H) + e % D] = 0.0f;
}

/* the further parameters of flash2's kernels that take starts (*_docs: backends/cuda_flash2.cuh's ST), and their arguments */
#define FL2_DOCS_PARAMS , const int *starts, long long heads
#define FL2_DOCS_ARGS , starts, heads
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#include "cuda_flash.cuh"

/* bf16 q, k, v only (the dispatcher sends nothing else here: pgd_ctx.has_flash); a kernel per head size,
 * each with the registers and shared memory its own needs (D 64: about 135 registers, three blocks an SM).
 * starts (nullptr: plain causal), each query's first key at batch row bh / heads (pdde_attention_docs).
 * cp (NULL: none; the CUDA kernels' last argument, PGD_FLASH_COPY): the output also stored rounded to bf16
 * there, at the output's indices (its node memory at pdde_lowp_copy_offset: lowering's PDDE_ATT_LOWP) */
#define FL_KERNELS(D, sfx)                                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * FL_WARPS) k_flash_fwd##sfx(                                     \
        const void *q, const void *k, const void *v, float *y, long long BH, long long T, long long Dn, float scale,    \
        int bf16, long long H, const int *starts, long long heads, void *cp) {                                         \
        __shared__ __align__(16) uint16_t sm[FL_SMEM(D)];                                                              \
        (void)Dn, (void)bf16;                                                                                          \
        flash_fwd<D>(sm, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, y, BH, T, scale, H,            \
                     (uint16_t *)cp, starts, heads);                                                                   \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * FL_WARPS) k_flash_back_dq##sfx(                                 \
        const void *q, const void *k, const void *v, const float *y, const float *dy, const float *rowdot, float *out,  \
        long long BH, long long T, long long Dn, float scale, int bf16, long long H, const int *starts, long long heads,  \
        void *cp) {                                                                                                    \
        __shared__ __align__(16) uint16_t sm[FL_SMEM(D)];                                                              \
        (void)Dn, (void)bf16;                                                                                          \
        flash_dq<D>(sm, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, y, dy, rowdot, out, BH, T,      \
                    scale, H, (uint16_t *)cp, starts, heads);                                                          \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * FL_WARPS) k_flash_back_dkv##sfx(                                \
        const void *q, const void *k, const void *v, const float *y, const float *dy, const float *rowdot, float *out,  \
        long long BH, long long T, long long Dn, float scale, int bf16, long long H, const int *starts, long long heads,  \
        void *cp) {                                                                                                    \
        __shared__ __align__(16) uint16_t sm[FL_SMEM(D)];                                                              \
        (void)Dn, (void)bf16;                                                                                          \
        flash_dkv<D>(sm, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, y, dy, rowdot, out, BH, T,     \
                     scale, H, (uint16_t *)cp, starts, heads);                                                         \
    }
FL_KERNELS(64, )
FL_KERNELS(128, _d128)

#include "cuda_flash2.cuh"

/* The flash2 backward (backends/cuda_flash2.cuh): the preprocessing, then one pass with dq by atomicAdd.
 * At D 64 three blocks an SM (168 registers, 12-20 bytes spilled: ptxas -v, sm_90); at D 128 one (255, 24-56 bytes).
 * Each flash2 kernel but the preprocessing has a twin named *_docs, its ST instance: the same arguments and then
 * starts and heads (each query's first key at batch row bh / heads: pdde_attention_docs): the kernels without
 * starts carry none of their code (no registers, no branches). */
#define FL2_MINBLOCKS(D) ((D) == 64 ? 3 : 1)
#define FL2_KERNELS(D, sfx)                                                                                            \
    extern "C" __global__ void __launch_bounds__(32 * FL_WARPS) k_flash2_prep##sfx(                                   \
        const float *y, const float *dy, void *dob, float *stats, float *out, long long rows, long long T, long long H) { \
        flash2_prep<D>(y, dy, (uint16_t *)dob, stats, out, rows, T, H);                                                \
    }                                                                                                                  \
    FL2_BACK(D, false, false, sfx, , )                                                                                 \
    FL2_BACK(D, true, false, _qkv##sfx, , )                                                                            \
    FL2_BACK(D, false, true, sfx##_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)                                              \
    FL2_BACK(D, true, true, _qkv##sfx##_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
/* the backward for q, k, v apart (PK false: H ignored) and packed in qkv (_qkv: H > 0); ST: with starts (XP, XA:
 * the further parameters and arguments) */
#define FL2_BACK(D, PK, ST, sfx, XP, XA)                                                                               \
    extern "C" __global__ void __launch_bounds__(32 * FL_WARPS, FL2_MINBLOCKS(D)) k_flash2_back##sfx(                 \
        const void *q, const void *k, const void *v, const void *dob, const float *stats, float *out, long long BH,     \
        long long T, float scale, long long H XP) {                                                                    \
        __shared__ __align__(16) uint16_t sm[FL2_SMEM(D)];                                                             \
        __shared__ float stat_s[4 * FL2_BQ(D)];                                                                        \
        flash2_bwd<D, PK, FL_WARPS, false, ST>(sm, stat_s, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, \
                                               (const uint16_t *)dob, stats, out, BH, T, scale, H, nullptr XA);        \
    }
FL2_KERNELS(64, )
FL2_KERNELS(128, _d128)
#define FL2_FWD(PK, ST, sfx, XP, XA)                                                                                   \
    extern "C" __global__ void __launch_bounds__(32 * FL_WARPS, 3) k_flash2_fwd##sfx(                                 \
        const void *q, const void *k, const void *v, float *y, long long BH, long long T, float scale, long long H,     \
        void *cp XP) {                                                                                                 \
        __shared__ __align__(16) uint16_t sm[FL2_FWD_SMEM(64)];                                                        \
        flash2_fwd<64, PK, ST>(sm, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, y, BH, T, scale, H,  \
                               (uint16_t *)cp XA);                                                                     \
    }
FL2_FWD(false, false, , , )
FL2_FWD(true, false, _qkv, , )
FL2_FWD(false, true, _docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
FL2_FWD(true, true, _qkv_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
/* The variants PDDE_FLASH2_VARIANT picks (backends/cuda_flash2.cuh; ptxas -v: no spills): k128 (D 64), the backward
 * with 128 keys a block of 8 warps (194-235 registers: one block an SM); q128 (D 64), the forward with 128 query
 * rows a block, 32 a warp (240-255 registers: two blocks an SM) */
#define FL2_BACK_K128(PK, ST, sfx, XP, XA)                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * FL2_K128_WARPS, 1) k_flash2_back##sfx(                          \
        const void *q, const void *k, const void *v, const void *dob, const float *stats, float *out, long long BH,     \
        long long T, float scale, long long H XP) {                                                                    \
        __shared__ __align__(16) uint16_t sm[FL2_SMEM_W(64, FL2_K128_WARPS)];                                          \
        __shared__ float stat_s[4 * FL2_BQ(64)];                                                                       \
        flash2_bwd<64, PK, FL2_K128_WARPS, false, ST>(sm, stat_s, (const uint16_t *)q, (const uint16_t *)k,            \
                                                      (const uint16_t *)v, (const uint16_t *)dob, stats, out, BH, T,   \
                                                      scale, H, nullptr XA);                                           \
    }
FL2_BACK_K128(false, false, _k128, , )
FL2_BACK_K128(true, false, _qkv_k128, , )
FL2_BACK_K128(false, true, _k128_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
FL2_BACK_K128(true, true, _qkv_k128_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
/* dqsmem: the backward's dQ tile through shared memory, added by coalesced atomics (flash2_bwd's DQS) */
#define FL2_DQS_MINBLOCKS(D) ((D) == 64 ? 2 : 1)
#define FL2_BACK_DQS(D, PK, ST, sfx, XP, XA)                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * FL_WARPS, FL2_DQS_MINBLOCKS(D)) k_flash2_back##sfx(             \
        const void *q, const void *k, const void *v, const void *dob, const float *stats, float *out, long long BH,     \
        long long T, float scale, long long H XP) {                                                                    \
        __shared__ __align__(16) uint16_t sm[FL2_SMEM(D)];                                                             \
        __shared__ float stat_s[4 * FL2_BQ(D)];                                                                        \
        __shared__ __align__(16) float dqs[FL2_DQS_SMEM(D)];                                                           \
        flash2_bwd<D, PK, FL_WARPS, true, ST>(sm, stat_s, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, \
                                              (const uint16_t *)dob, stats, out, BH, T, scale, H, dqs XA);             \
    }
FL2_BACK_DQS(64, false, false, _dqs, , )
FL2_BACK_DQS(64, true, false, _qkv_dqs, , )
FL2_BACK_DQS(128, false, false, _d128_dqs, , )
FL2_BACK_DQS(128, true, false, _qkv_d128_dqs, , )
FL2_BACK_DQS(64, false, true, _dqs_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
FL2_BACK_DQS(64, true, true, _qkv_dqs_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
FL2_BACK_DQS(128, false, true, _d128_dqs_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
FL2_BACK_DQS(128, true, true, _qkv_d128_dqs_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
#define FL2_FWD_Q128(PK, ST, sfx, XP, XA)                                                                              \
    extern "C" __global__ void __launch_bounds__(32 * FL_WARPS, FL2_Q128_MINBLOCKS) k_flash2_fwd##sfx(                \
        const void *q, const void *k, const void *v, float *y, long long BH, long long T, float scale, long long H,     \
        void *cp XP) {                                                                                                 \
        __shared__ __align__(16) uint16_t sm[FL2_FWD_SMEM(64)];                                                        \
        flash2_fwd_q128<64, PK, ST>(sm, (const uint16_t *)q, (const uint16_t *)k, (const uint16_t *)v, y, BH, T, scale, \
                                    H, (uint16_t *)cp XA);                                                             \
    }
FL2_FWD_Q128(false, false, _q128, , )
FL2_FWD_Q128(true, false, _qkv_q128, , )
FL2_FWD_Q128(false, true, _q128_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
FL2_FWD_Q128(true, true, _qkv_q128_docs, FL2_DOCS_PARAMS, FL2_DOCS_ARGS)
#else
/* Before compute capability 8.0 there is no bf16 mma: the kernels exist (the module has every name) but
 * the backend never launches them (pgd_ctx.has_flash is 0 there). */
#define FL_STUBS(sfx)                                                                                                  \
    extern "C" __global__ void k_flash_fwd##sfx(const void *q, const void *k, const void *v, float *y, long long BH,    \
                                                long long T, long long D, float scale, int bf16, long long H,          \
                                                const int *starts, long long heads, void *cp) {}                                                           \
    extern "C" __global__ void k_flash_back_dq##sfx(const void *q, const void *k, const void *v, const float *y,        \
                                                    const float *dy, const float *rowdot, float *out, long long BH,    \
                                                    long long T, long long D, float scale, int bf16, long long H,      \
                                                    const int *starts, long long heads, void *cp) {}                                                       \
    extern "C" __global__ void k_flash_back_dkv##sfx(const void *q, const void *k, const void *v, const float *y,       \
                                                     const float *dy, const float *rowdot, float *out, long long BH,   \
                                                     long long T, long long D, float scale, int bf16, long long H,     \
                                                     const int *starts, long long heads, void *cp) {}
FL_STUBS()
FL_STUBS(_d128)
#define FL2_STUBS(sfx)                                                                                                 \
    extern "C" __global__ void k_flash2_prep##sfx(const float *y, const float *dy, void *dob, float *stats, float *out, \
                                                  long long rows, long long T, long long H) {}
FL2_STUBS()
FL2_STUBS(_d128)
#define FL2_STUB_FWD(name, XP)                                                                                         \
    extern "C" __global__ void name(const void *q, const void *k, const void *v, float *y, long long BH, long long T,  \
                                    float scale, long long H, void *cp XP) {}
#define FL2_STUB_BACK(name, XP)                                                                                        \
    extern "C" __global__ void name(const void *q, const void *k, const void *v, const void *dob, const float *stats, float *out, \
                                    long long BH, long long T, float scale, long long H XP) {}
/* each with its twin that takes starts (*_docs) */
#define FL2_STUB_FWD2(name) FL2_STUB_FWD(name, ) FL2_STUB_FWD(name##_docs, FL2_DOCS_PARAMS)
#define FL2_STUB_BACK2(name) FL2_STUB_BACK(name, ) FL2_STUB_BACK(name##_docs, FL2_DOCS_PARAMS)
FL2_STUB_BACK2(k_flash2_back)
FL2_STUB_BACK2(k_flash2_back_qkv)
FL2_STUB_BACK2(k_flash2_back_d128)
FL2_STUB_BACK2(k_flash2_back_qkv_d128)
FL2_STUB_FWD2(k_flash2_fwd)
FL2_STUB_FWD2(k_flash2_fwd_qkv)
FL2_STUB_BACK2(k_flash2_back_k128)
FL2_STUB_BACK2(k_flash2_back_qkv_k128)
FL2_STUB_BACK2(k_flash2_back_dqs)
FL2_STUB_BACK2(k_flash2_back_qkv_dqs)
FL2_STUB_BACK2(k_flash2_back_d128_dqs)
FL2_STUB_BACK2(k_flash2_back_qkv_d128_dqs)
FL2_STUB_FWD2(k_flash2_fwd_q128)
FL2_STUB_FWD2(k_flash2_fwd_qkv_q128)
#endif

#include "cuda_moe.cuh" /* Mixture-of-Experts */
