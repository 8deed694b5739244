/* backends/cuda_gemm_tile.cuh — one 64x64 tile of C = op(A) op(B) in f32, the GEMM fallback's (k_gemm)
 * and the grouped GEMM's (k_moe_gemm, k_moe_gemm_back_w) block: 256 threads, each computing 4x4 outputs
 * strided by 16, K in steps of 16 through shared memory. op(A)(m,k) = ta ? A[k*M+m] : A[m*K+k],
 * op(B)(k,n) = tb ? B[n*K+k] : B[k*N+n]; (m0, n0) is the tile's corner. Included by cuda_kernels.cu (and
 * by tests/moe_emu.cpp, which runs it on the CPU). */
#define GT 64
#define GK 16
__device__ __forceinline__ void gemm_tile(const float *__restrict__ Ab, const float *__restrict__ Bb, float *__restrict__ Cb, int M,
                                          int N, int K, int ta, int tb, int m0, int n0) {
    __shared__ float As[GK][GT + 4];
    __shared__ float Bs[GK][GT + 4];
    int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += GK) {
        /* 64x16 elements of each operand, 4 per thread */
#pragma unroll
        for (int l = 0; l < 4; l++) {
            int e = threadIdx.x + l * 256;
            int kk, mm;
            if (ta) { mm = e & 63; kk = e >> 6; } /* A stored [K][M]: consecutive threads read consecutive m */
            else { kk = e & 15; mm = e >> 4; }
            int gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? (ta ? Ab[(long long)gk * M + gm] : Ab[(long long)gm * K + gk]) : 0.0f;
            int nn;
            if (tb) { kk = e & 15; nn = e >> 4; }
            else { nn = e & 63; kk = e >> 6; }
            int gn = n0 + nn;
            gk = k0 + kk;
            Bs[kk][nn] = (gn < N && gk < K) ? (tb ? Bb[(long long)gn * K + gk] : Bb[(long long)gk * N + gn]) : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GK; kk++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int gm = m0 + ty + 16 * i;
        if (gm >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int gn = n0 + tx + 16 * j;
            if (gn < N) Cb[(long long)gm * N + gn] = acc[i][j];
        }
    }
}
