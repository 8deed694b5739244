/* backends/cuda_att_layout.cuh — element offsets of the attention kernels' rows in either layout, shared
 * by backends/cuda_kernels.cu and backends/cuda_flash.cuh (and tests/flash_emu.cpp, which runs the latter
 * on the CPU). H, each attention kernel's layout argument: 0, q, k, v [BH, T, D] apart, y [BH, T, D + 1]
 * (the logsumexp in column D), the backward's out [3, BH, T, D]; H > 0 (pdde_attention_qkv), q, k, v rows
 * of qkv [B, T, H*3*D] (k and v passed D and 2D past q), y [B, T, H*D] with the logsumexp [BH, T] after
 * it, out in qkv's layout. Row r = bh * T + t. */
#ifndef PDDE_CUDA_ATT_LAYOUT_CUH
#define PDDE_CUDA_ATT_LAYOUT_CUH
__device__ __forceinline__ long long att_in(long long r, long long T, long long D, long long H) {
    if (!H) return r * D;
    long long t = r % T, bh = r / T;
    return ((bh / H) * T + t) * 3 * H * D + (bh % H) * 3 * D;
}
__device__ __forceinline__ long long att_y(long long r, long long T, long long D, long long H) {
    if (!H) return r * (D + 1);
    long long t = r % T, bh = r / T;
    return ((bh / H) * T + t) * H * D + (bh % H) * D;
}
__device__ __forceinline__ long long att_lse(long long r, long long rows, long long D, long long H) {
    return H ? rows * D + r : r * (D + 1) + D;
}
__device__ __forceinline__ long long att_out(long long r, int which, long long rows, long long T, long long D, long long H) {
    return H ? att_in(r, T, D, H) + which * D : which * rows * D + r * D;
}
/* The first key row r sees (pdde_attention_docs): starts [B, T] at its batch row bh / heads (heads: the node's heads
 * in either layout) and query t, clamped to [0, t]; 0 without starts (nullptr: plain causal attention) */
__device__ __forceinline__ long long att_lo(const int *starts, long long r, long long T, long long heads) {
    if (!starts) return 0;
    long long t = r % T, s = starts[(r / T / heads) * T + t];
    return s < 0 ? 0 : s > t ? t : s;
}
#endif
