/* cuda_rope.cuh — rotary position embedding on CUDA: k_rope, the twin of gpu_kernels.cl's (backends/cpu.c's kernel is
 * the reference). Included by cuda_kernels.cu after its loaders (ld_*), store_out and SMALL_INDEX. */

/* Mirrors pgd_rope_freqs (backends/gpu_dispatch.h): pair i's inverse frequency, computed on the host as the CPU does */
#define ROPE_HALF_MAX 128
struct pdde_cu_rope_freqs {
    float inv[ROPE_HALF_MAX];
};

/* An item per pair (i, i + half_d) of a row of x [rows = B T H, D], grid-strided; index type I (32 bits where every
 * index fits: no 64-bit divisions). The products rounded apart (_rn: no FMA contraction), as the CPU's ISO C. */
template <typename L, typename I>
__device__ __forceinline__ void rope_body(const typename L::T *__restrict__ x, void *__restrict__ y, I pairs, I T, I H, I half_d,
                                          const pdde_cu_rope_freqs &f, float sign, int dt) {
    for (I p = (I)blockIdx.x * blockDim.x + threadIdx.x; p < pairs; p += (I)gridDim.x * blockDim.x) {
        I row = p / half_d, i = p - row * half_d, e = row * 2 * half_d + i;
        float a = __fmul_rn((float)((row / H) % T), f.inv[i]), c = cosf(a), s = sign * sinf(a);
        float x0 = L::get(x, e), x1 = L::get(x, e + half_d);
        store_out(y, e, __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), dt);
        store_out(y, e + half_d, __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s)), dt);
    }
}

template <typename L>
__device__ __forceinline__ void rope_any(const void *x, void *y, long long pairs, long long T, long long H, long long half_d,
                                         const pdde_cu_rope_freqs &f, float sign, int dt) {
    const typename L::T *xt = (const typename L::T *)x;
    if (SMALL_INDEX(2 * pairs)) rope_body<L, unsigned>(xt, y, (unsigned)pairs, (unsigned)T, (unsigned)H, (unsigned)half_d, f, sign, dt);
    else rope_body<L, unsigned long long>(xt, y, pairs, T, H, half_d, f, sign, dt);
}

/* x, y [B, T, H, D] of dtype dt (0 f32, DT_F16, DT_BF16), pairs = numel / 2, half_d = D / 2: pair i of the row at position
 * t = (row / H) % T rotated by the angle t * f.inv[i] (sign -1: by minus it, the backward), in f32, stored once as dt */
extern "C" __global__ void k_rope(const void *__restrict__ x, void *__restrict__ y, long long pairs, long long T, long long H,
                                  long long half_d, struct pdde_cu_rope_freqs f, float sign, int dt) {
    if (dt == DT_BF16) rope_any<ld_bf16>(x, y, pairs, T, H, half_d, f, sign, dt);
    else if (dt == DT_F16) rope_any<ld_f16>(x, y, pairs, T, H, half_d, f, sign, dt);
    else rope_any<ld_f32>(x, y, pairs, T, H, half_d, f, sign, dt);
}
