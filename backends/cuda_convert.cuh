/* cuda_convert.cuh — f32 to and from f16 and bf16 as the CUDA kernels store and read them (round to nearest
 * even; NaN stays a quiet NaN, overflow becomes infinity), and the kernels' typed stores and loads built on
 * them. Included first by cuda_kernels.cu and, compiled for the host, by the emulation tests
 * (tests/mem_emu.cpp and the others), so that they check these very functions. */
__device__ unsigned short f32_to_f16(float f) {
    unsigned int u = __float_as_uint(f);
    unsigned int sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
    if (absu < 0x38800000u) {
        if (absu < 0x33000000u) return (unsigned short)sign;
        unsigned int mant = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23); /* value = mant * 2^(e-150), f16 unit = 2^-24 */
        unsigned int half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (unsigned short)(sign | half);
    }
    unsigned int h = ((absu >> 13) - (112u << 10)), rem = absu & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (unsigned short)(sign | h);
}
__device__ float f16_to_f32(unsigned short h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (m == 0) u = sign;
        else {
            e = 113;
            while (!(m & 0x400u)) { m <<= 1; e--; }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) u = sign | 0x7f800000u | (m << 13);
    else u = sign | ((e + 112) << 23) | (m << 13);
    return __uint_as_float(u);
}
__device__ unsigned short f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

/* An f32 result stored as the output's dtype (ydt: 0 f32, 1 f16, 2 bf16, as k_cast rounds): an op whose only
 * reader is a cast to bf16 writes bf16 itself (planner/lower.c, the casts folded into their producers). */
__device__ __forceinline__ void store_out(void *y, long long i, float v, int ydt) {
    if (ydt == 2) ((unsigned short *)y)[i] = f32_to_bf16(v);
    else if (ydt == 1) ((unsigned short *)y)[i] = f32_to_f16(v);
    else ((float *)y)[i] = v;
}
/* An input element read as f32 (the bf16 logits of the cross-entropy: planner/lower.c, PDDE_BF16_LOGITS),
 * by the element type a kernel body was instantiated for. */
struct ld_f32 { typedef float T; static __device__ __forceinline__ float get(const float *p, long long i) { return p[i]; } };
struct ld_bf16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float get(const unsigned short *p, long long i) { return __uint_as_float((unsigned)p[i] << 16); }
};
struct ld_f16 {
    typedef unsigned short T;
    static __device__ __forceinline__ float get(const unsigned short *p, long long i) { return f16_to_f32(p[i]); }
};
