/* backends/cuda_embedding.cuh — the reproducible embedding backward of the CUDA backend (included by
 * cuda_kernels.cu; launched by gpu_dispatch.h under PGD_EMB_SORTED), gpu_kernels.cl's k_embedding_sort,
 * k_embedding_radix_* and k_embedding_back_rows line for line. tests/embedding_emu.cpp runs them on the CPU. */

/* One block sorts the keys id << 32 | position (bitonic, in place in global memory; n_pow2 >= n_ids a
 * power of 2, the tail padded with ~0), so each table row's positions come together in the order of the
 * ids; ids outside [0, V) get id 0xffffffff and sort last. */
extern "C" __global__ void k_embedding_sort(const int *__restrict__ ids, unsigned long long *keys, long long n_ids,
                                            long long n_pow2, long long V) {
    long long l = threadIdx.x, L = blockDim.x;
    for (long long i = l; i < n_pow2; i += L) {
        int id = i < n_ids ? ids[i] : -1;
        unsigned row = id >= 0 && id < V ? (unsigned)id : 0xffffffffu;
        keys[i] = i < n_ids ? (unsigned long long)row << 32 | (unsigned long long)i : ~0ULL;
    }
    for (long long k = 2; k <= n_pow2; k <<= 1)
        for (long long j = k >> 1; j > 0; j >>= 1) {
            __syncthreads();
            for (long long i = l; i < n_pow2 / 2; i += L) { /* pair i: a (bit j clear) and a + j */
                long long a = ((i & ~(j - 1)) << 1) | (i & (j - 1));
                unsigned long long x = keys[a], y = keys[a + j];
                if ((x > y) == ((a & k) == 0)) keys[a] = y, keys[a + j] = x;
            }
        }
}

/* The same keys by one thread, a counting sort (gpu_kernels.cl's for CPU devices; the CUDA dispatcher never
 * takes it: one thread's n_ids + V dependent steps are slow on a GPU); cnt: V + 1 counters, the last for the
 * ids outside [0, V). */
extern "C" __global__ void k_embedding_count_sort(const int *__restrict__ ids, unsigned long long *keys, int *cnt, long long n_ids,
                                                  long long V) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    for (long long v = 0; v <= V; v++) cnt[v] = 0;
    for (long long i = 0; i < n_ids; i++) cnt[ids[i] >= 0 && ids[i] < V ? ids[i] : V]++;
    for (long long v = 0, at = 0; v <= V; v++) {
        int c = cnt[v];
        cnt[v] = (int)at, at += c;
    }
    for (long long i = 0; i < n_ids; i++) {
        long long row = ids[i] >= 0 && ids[i] < V ? ids[i] : V;
        keys[cnt[row]++] = (row < V ? (unsigned long long)row : 0xffffffffULL) << 32 | (unsigned long long)i;
    }
}

/* The same keys sorted by many blocks (large n): an LSD radix sort over the row's bits, RADIX_BITS a pass,
 * gpu_kernels.cl's k_embedding_keys / k_embedding_radix_* line for line. The keys start in position order
 * and every pass is stable, so positions stay ascending within a row. A thread owns `chunk` consecutive
 * keys; cnt holds RADIX_DIGITS counters per thread, digit-major (cnt[d * threads + t]), so one exclusive
 * scan of cnt gives every thread's first slot for each digit. Rows outside [0, V) count as row V. */
#define RADIX_BITS 4
#define RADIX_DIGITS 16
#define RADIX_GROUP 256 /* the largest block of the count and scatter kernels (their counters in shared memory) */
static __device__ unsigned radix_digit(unsigned long long key, long long V, int shift) {
    unsigned long long row = key >> 32;
    return (unsigned)((row < (unsigned long long)V ? row : (unsigned long long)V) >> shift) & (RADIX_DIGITS - 1);
}
extern "C" __global__ void k_embedding_keys(const int *__restrict__ ids, unsigned long long *__restrict__ keys, long long n_ids,
                                            long long V) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n_ids; i += (long long)gridDim.x * blockDim.x) {
        int id = ids[i];
        unsigned row = id >= 0 && id < V ? (unsigned)id : 0xffffffffu;
        keys[i] = (unsigned long long)row << 32 | (unsigned long long)i;
    }
}
/* cnt[d * threads + t]: how many of thread t's keys have digit d */
extern "C" __global__ void k_embedding_radix_count(const unsigned long long *__restrict__ keys, int *__restrict__ cnt, long long n_ids,
                                                   long long chunk, long long V, int shift) {
    __shared__ int c[RADIX_DIGITS * RADIX_GROUP];
    long long l = threadIdx.x, L = blockDim.x, t = (long long)blockIdx.x * blockDim.x + threadIdx.x, T = (long long)gridDim.x * blockDim.x;
    for (int d = 0; d < RADIX_DIGITS; d++) c[d * L + l] = 0;
    long long end = (t + 1) * chunk < n_ids ? (t + 1) * chunk : n_ids;
    for (long long i = t * chunk; i < end; i++) c[radix_digit(keys[i], V, shift) * L + l]++;
    for (int d = 0; d < RADIX_DIGITS; d++) cnt[d * T + t] = c[d * L + l];
}
/* cnt[0, m) replaced by its exclusive prefix sums, by one block (a thread a segment, then the segments'
 * totals scanned in shared memory) */
extern "C" __global__ void k_embedding_radix_scan(int *cnt, long long m) {
    __shared__ int part[RADIX_GROUP];
    long long l = threadIdx.x, L = blockDim.x, seg = (m + L - 1) / L;
    long long lo = l * seg < m ? l * seg : m, hi = lo + seg < m ? lo + seg : m;
    int sum = 0;
    for (long long i = lo; i < hi; i++) sum += cnt[i];
    part[l] = sum;
    for (long long off = 1; off < L; off <<= 1) { /* inclusive scan of the totals */
        __syncthreads();
        int v = l >= off ? part[l - off] : 0;
        __syncthreads();
        part[l] += v;
    }
    __syncthreads();
    int at = l > 0 ? part[l - 1] : 0;
    for (long long i = lo; i < hi; i++) {
        int c = cnt[i];
        cnt[i] = at, at += c;
    }
}
/* each thread's keys, in order, to their slots: out[cnt[d * threads + t]++] */
extern "C" __global__ void k_embedding_radix_scatter(const unsigned long long *__restrict__ keys, unsigned long long *__restrict__ out,
                                                     const int *__restrict__ cnt, long long n_ids, long long chunk, long long V, int shift) {
    __shared__ int c[RADIX_DIGITS * RADIX_GROUP];
    long long l = threadIdx.x, L = blockDim.x, t = (long long)blockIdx.x * blockDim.x + threadIdx.x, T = (long long)gridDim.x * blockDim.x;
    for (int d = 0; d < RADIX_DIGITS; d++) c[d * L + l] = cnt[d * T + t];
    long long end = (t + 1) * chunk < n_ids ? (t + 1) * chunk : n_ids;
    for (long long i = t * chunk; i < end; i++) {
        unsigned long long key = keys[i];
        out[c[radix_digit(key, V, shift) * L + l]++] = key;
    }
}

/* A block per run of equal ids in the sorted keys (blocks stride over the positions; a run's first
 * position does the run): out[id] += dy[r] for the run's positions r in order, a thread a column. */
extern "C" __global__ void k_embedding_back_rows(const float *__restrict__ dy, const unsigned long long *__restrict__ keys,
                                                 float *__restrict__ out, long long n_ids, long long C, long long V) {
    for (long long k = blockIdx.x; k < n_ids; k += gridDim.x) {
        unsigned long long id = keys[k] >> 32;
        if (id >= (unsigned long long)V || (k > 0 && keys[k - 1] >> 32 == id)) continue;
        for (long long j = threadIdx.x; j < C; j += blockDim.x) {
            float acc = out[(long long)id * C + j];
            for (long long m = k; m < n_ids && keys[m] >> 32 == id; m++) acc += dy[(long long)(unsigned)keys[m] * C + j];
            out[(long long)id * C + j] = acc;
        }
    }
}
