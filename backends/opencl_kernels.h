/* opencl_kernels.h — the OpenCL C source of every pdde op (f32 data, i32 ids and targets), embedded as one
 * string so that `cc -c pdde.c` still builds the whole library. Included by backends/opencl.c only.
 *
 * Conventions: every kernel takes its buffers as (pointer, offset in elements) pairs, because tensors
 * live at byte offsets inside arena buffers and sub-buffers have alignment limits. Shapes handed to the
 * generic index helper are padded on the left with 1s to 6 dims and travel as int8 (s0..s5 used).
 * Row kernels run one work-group per row; the local size is a power of two chosen by the host and
 * kept fixed per device (PoCL compiles one work-group function per local size).
 *
 * The source is written through a stringifying macro: no preprocessor lines and no character literals
 * inside; build options (-D) carry whatever needs the preprocessor. */
#ifndef PDDE_OPENCL_KERNELS_H
#define PDDE_OPENCL_KERNELS_H

#define PDDE_OCL_STR(...) #__VA_ARGS__

static const char pdde_ocl_source[] = PDDE_OCL_STR(

/* offset of element i of a tensor of shape shp (row-major) in a tensor whose dims have strides str */
inline long bidx(long i, int8 shp, int8 str) {
    int s[8], t[8];
    vstore8(shp, 0, s);
    vstore8(str, 0, t);
    long off = 0;
    for (int d = 5; d >= 0; d--) {
        long c = i % s[d];
        i /= s[d];
        off += c * t[d];
    }
    return off;
}

inline float wg_sum(float v, __local float *buf) {
    int l = get_local_id(0), n = get_local_size(0);
    buf[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] += buf[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

inline float wg_max(float v, __local float *buf) {
    int l = get_local_id(0), n = get_local_size(0);
    buf[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (l < s) buf[l] = fmax(buf[l], buf[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float r = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

__kernel void k_fill(__global float *y, long yo, long n, float v) {
    long i = get_global_id(0);
    if (i < n) y[yo + i] = v;
}

/* rows x cols block copy between two row-major matrices with leading dims xld and yld */
__kernel void k_copy2d(__global const float *x, long xo, long xld, __global float *y, long yo, long yld,
                       long rows, long cols) {
    long i = get_global_id(0);
    if (i >= rows * cols) return;
    long r = i / cols, c = i % cols;
    y[yo + r * yld + c] = x[xo + r * xld + c];
}

/* op 0 add, 1 sub, 2 mul. mode 0: b has a's shape; 1: b repeats every nb elements; 2: general
 * broadcasting (shp = a's shape, bstr = b's strides, 0 on broadcast dims). y may alias a. */
__kernel void k_binary(int op, __global const float *a, long ao, __global const float *b, long bo,
                       __global float *y, long yo, long n, int mode, long nb, int8 shp, int8 bstr) {
    long i = get_global_id(0);
    if (i >= n) return;
    long bi = mode == 0 ? i : mode == 1 ? i % nb : bidx(i, shp, bstr);
    float u = a[ao + i], v = b[bo + bi];
    y[yo + i] = op == 0 ? u + v : op == 1 ? u - v : u * v;
}

inline float gelu_f(float x) {
    float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanh(u));
}

/* op 0 scale by f, 1 gelu, 2 relu, 3 silu */
__kernel void k_unary(int op, __global const float *x, long xo, __global float *y, long yo, long n, float f) {
    long i = get_global_id(0);
    if (i >= n) return;
    float v = x[xo + i], r;
    if (op == 0) r = f * v;
    else if (op == 1) r = gelu_f(v);
    else if (op == 2) r = v > 0.0f ? v : 0.0f;
    else r = v / (1.0f + exp(-v));
    y[yo + i] = r;
}

/* dx from x and dy. op 1 gelu, 2 relu, 3 silu */
__kernel void k_unary_back(int op, __global const float *x, long xo, __global const float *dy, long dyo,
                           __global float *y, long yo, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    float v = x[xo + i], g = dy[dyo + i], d;
    if (op == 1) {
        float s = 0.7978845608028654f;
        float u = s * (v + 0.044715f * v * v * v);
        float t = tanh(u);
        d = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * s * (1.0f + 3.0f * 0.044715f * v * v);
    } else if (op == 2) {
        d = v > 0.0f ? 1.0f : 0.0f;
    } else {
        float sg = 1.0f / (1.0f + exp(-v));
        d = sg * (1.0f + v * (1.0f - sg));
    }
    y[yo + i] = g * d;
}

/* rms = 1: RMSNorm (no mean, no beta) */
__kernel void k_norm(int rms, __global const float *x, long xo, __global const float *g, long go,
                     __global const float *b, long bo, __global float *y, long yo, int C, float eps,
                     __local float *buf) {
    long row = get_group_id(0);
    int l = get_local_id(0), L = get_local_size(0);
    __global const float *xr = x + xo + row * C;
    __global float *yr = y + yo + row * C;
    float mean = 0.0f, s = 0.0f;
    if (!rms) {
        for (int c = l; c < C; c += L) s += xr[c];
        mean = wg_sum(s, buf) / C;
    }
    s = 0.0f;
    for (int c = l; c < C; c += L) { float d = xr[c] - mean; s += d * d; }
    float rstd = 1.0f / sqrt(wg_sum(s, buf) / C + eps);
    for (int c = l; c < C; c += L) {
        float v = (xr[c] - mean) * rstd * g[go + c];
        yr[c] = rms ? v : v + b[bo + c];
    }
}

__kernel void k_norm_back(int rms, __global const float *x, long xo, __global const float *g, long go,
                          __global const float *dy, long dyo, __global float *y, long yo, int C, float eps,
                          __local float *buf) {
    long row = get_group_id(0);
    int l = get_local_id(0), L = get_local_size(0);
    __global const float *xr = x + xo + row * C;
    __global const float *dr = dy + dyo + row * C;
    __global float *yr = y + yo + row * C;
    float mean = 0.0f, s = 0.0f;
    if (!rms) {
        for (int c = l; c < C; c += L) s += xr[c];
        mean = wg_sum(s, buf) / C;
    }
    s = 0.0f;
    for (int c = l; c < C; c += L) { float d = xr[c] - mean; s += d * d; }
    float rstd = 1.0f / sqrt(wg_sum(s, buf) / C + eps);
    float s1 = 0.0f, s2 = 0.0f;
    for (int c = l; c < C; c += L) {
        float dg = dr[c] * g[go + c];
        s1 += dg;
        s2 += dg * (xr[c] - mean) * rstd;
    }
    s1 = rms ? 0.0f : wg_sum(s1, buf) / C;
    s2 = wg_sum(s2, buf) / C;
    for (int c = l; c < C; c += L) {
        float xh = (xr[c] - mean) * rstd;
        yr[c] = rstd * (dr[c] * g[go + c] - s1 - xh * s2);
    }
}

/* per row: st[2 row] = mean (0 for rms), st[2 row + 1] = 1/std */
__kernel void k_row_stats(int rms, __global const float *x, long xo, __global float *st, int C, float eps,
                          __local float *buf) {
    long row = get_group_id(0);
    int l = get_local_id(0), L = get_local_size(0);
    __global const float *xr = x + xo + row * C;
    float mean = 0.0f, s = 0.0f;
    if (!rms) {
        for (int c = l; c < C; c += L) s += xr[c];
        mean = wg_sum(s, buf) / C;
    }
    s = 0.0f;
    for (int c = l; c < C; c += L) { float d = xr[c] - mean; s += d * d; }
    float rstd = 1.0f / sqrt(wg_sum(s, buf) / C + eps);
    if (l == 0) { st[2 * row] = mean; st[2 * row + 1] = rstd; }
}

/* dgamma[c] = sum over rows of dy * (x - mean) * rstd; one work-item per column */
__kernel void k_norm_back_gamma(__global const float *x, long xo, __global const float *dy, long dyo,
                                __global const float *st, __global float *y, long yo, long N, int C) {
    int c = get_global_id(0);
    if (c >= C) return;
    float s = 0.0f;
    for (long n = 0; n < N; n++)
        s += dy[dyo + n * C + c] * (x[xo + n * C + c] - st[2 * n]) * st[2 * n + 1];
    y[yo + c] = s;
}

/* causal: row i of the last-but-one dim (T rows) sees columns j <= i */
__kernel void k_softmax(__global const float *x, long xo, __global float *y, long yo, int C, int causal,
                        int T, __local float *buf) {
    long row = get_group_id(0);
    int l = get_local_id(0), L = get_local_size(0);
    __global const float *xr = x + xo + row * C;
    __global float *yr = y + yo + row * C;
    int lim = C;
    if (causal) { int i = (int)(row % T); lim = i + 1 < C ? i + 1 : C; }
    float m = -INFINITY;
    for (int c = l; c < lim; c += L) m = fmax(m, xr[c]);
    m = wg_max(m, buf);
    float s = 0.0f;
    for (int c = l; c < lim; c += L) s += exp(xr[c] - m);
    s = wg_sum(s, buf);
    float inv = 1.0f / s;
    for (int c = l; c < C; c += L) yr[c] = c < lim ? exp(xr[c] - m) * inv : 0.0f;
}

__kernel void k_softmax_back(__global const float *yv, long yvo, __global const float *dy, long dyo,
                             __global float *y, long yo, int C, __local float *buf) {
    long row = get_group_id(0);
    int l = get_local_id(0), L = get_local_size(0);
    __global const float *pr = yv + yvo + row * C;
    __global const float *dr = dy + dyo + row * C;
    float s = 0.0f;
    for (int c = l; c < C; c += L) s += pr[c] * dr[c];
    s = wg_sum(s, buf);
    for (int c = l; c < C; c += L) y[yo + row * C + c] = pr[c] * (dr[c] - s);
}

/* per row: st[2 row] = loss of the row (0 if its target is ignored), st[2 row + 1] = 1 if counted */
__kernel void k_ce_rows(__global const float *x, long xo, __global const int *t, long to, __global float *st,
                        int V, __local float *buf) {
    long row = get_group_id(0);
    int l = get_local_id(0), L = get_local_size(0);
    __global const float *xr = x + xo + row * V;
    int tg = t[to + row];
    float m = -INFINITY;
    for (int c = l; c < V; c += L) m = fmax(m, xr[c]);
    m = wg_max(m, buf);
    float s = 0.0f;
    for (int c = l; c < V; c += L) s += exp(xr[c] - m);
    s = wg_sum(s, buf);
    if (l == 0) {
        int ok = tg >= 0 && tg < V;
        st[2 * row] = ok ? log(s) + m - xr[tg] : 0.0f;
        st[2 * row + 1] = ok ? 1.0f : 0.0f;
    }
}

/* one work-group: y = sum(loss) / count (0 when nothing is counted) */
__kernel void k_ce_reduce(__global const float *st, long N, __global float *y, long yo, __local float *buf) {
    int l = get_local_id(0), L = get_local_size(0);
    float s = 0.0f, c = 0.0f;
    for (long n = l; n < N; n += L) { s += st[2 * n]; c += st[2 * n + 1]; }
    s = wg_sum(s, buf);
    c = wg_sum(c, buf);
    if (l == 0) y[yo] = c > 0.0f ? s / c : 0.0f;
}

/* one work-group: st[0] = number of counted targets */
__kernel void k_ce_count(__global const int *t, long to, long N, int V, __global float *st, __local float *buf) {
    int l = get_local_id(0), L = get_local_size(0);
    float c = 0.0f;
    for (long n = l; n < N; n += L) { int tg = t[to + n]; c += (tg >= 0 && tg < V) ? 1.0f : 0.0f; }
    c = wg_sum(c, buf);
    if (l == 0) st[0] = c;
}

__kernel void k_ce_back(__global const float *x, long xo, __global const int *t, long to,
                        __global const float *dl, long dlo, __global const float *st, __global float *y, long yo,
                        int V, __local float *buf) {
    long row = get_group_id(0);
    int l = get_local_id(0), L = get_local_size(0);
    __global const float *xr = x + xo + row * V;
    __global float *yr = y + yo + row * V;
    int tg = t[to + row];
    float m = -INFINITY;
    for (int c = l; c < V; c += L) m = fmax(m, xr[c]);
    m = wg_max(m, buf);
    float s = 0.0f;
    for (int c = l; c < V; c += L) s += exp(xr[c] - m);
    s = wg_sum(s, buf);
    int ok = tg >= 0 && tg < V && st[0] > 0.0f;
    float k = ok ? dl[dlo] / st[0] : 0.0f, inv = 1.0f / s;
    for (int c = l; c < V; c += L) yr[c] = k * (exp(xr[c] - m) * inv - (c == tg ? 1.0f : 0.0f));
}

__kernel void k_embedding(__global const float *w, long wo, __global const int *ids, long io, __global float *y,
                          long yo, long n, int C, int V) {
    long i = get_global_id(0);
    if (i >= n) return;
    long r = i / C;
    int c = (int)(i % C), id = ids[io + r];
    y[yo + i] = (id >= 0 && id < V) ? w[wo + (long)id * C + c] : 0.0f;
}

/* one work-item per column, rows in order: deterministic, no atomics */
__kernel void k_embedding_back(__global const int *ids, long io, __global const float *dy, long dyo,
                               __global float *y, long yo, long N, int C, int V) {
    int c = get_global_id(0);
    if (c >= C) return;
    for (long n = 0; n < N; n++) {
        int id = ids[io + n];
        if (id >= 0 && id < V) y[yo + (long)id * C + c] += dy[dyo + n * C + c];
    }
}

/* y[i] = f * x[bidx(i)]: permute (str = permuted strides) and expand (str = 0 on broadcast dims) */
__kernel void k_gather(__global const float *x, long xo, __global float *y, long yo, long n, int8 shp, int8 str,
                       float f) {
    long i = get_global_id(0);
    if (i >= n) return;
    y[yo + i] = f * x[xo + bidx(i, shp, str)];
}

/* one work-group per row of L: y[row] = (has_add ? add[0] : 0) + scale * sum(x or x^2) */
__kernel void k_reduce_rows(__global const float *x, long xo, __global float *y, long yo, long L, float scale,
                            int sq, __global const float *add, long addo, int has_add, __local float *buf) {
    long row = get_group_id(0);
    int l = get_local_id(0), LS = get_local_size(0);
    __global const float *xr = x + xo + row * L;
    float s = 0.0f;
    for (long j = l; j < L; j += LS) { float v = xr[j]; s += sq ? v * v : v; }
    s = wg_sum(s, buf);
    if (l == 0) y[yo + row] = (has_add ? add[addo] : 0.0f) + scale * s;
}

/* first pass of a long reduction: partial sum of chunk g of x (or of x^2) into st[g] */
__kernel void k_sum_chunks(__global const float *x, long xo, long n, long chunk, int sq, __global float *st,
                           __local float *buf) {
    long g = get_group_id(0);
    int l = get_local_id(0), LS = get_local_size(0);
    long b = g * chunk, e = b + chunk < n ? b + chunk : n;
    float s = 0.0f;
    for (long j = b + l; j < e; j += LS) { float v = x[xo + j]; s += sq ? v * v : v; }
    s = wg_sum(s, buf);
    if (l == 0) st[g] = s;
}

/* [outer, L, inner] -> [outer, inner]: one work-item per output */
__kernel void k_reduce_mid(__global const float *x, long xo, __global float *y, long yo, long outer, long L,
                           long inner, float scale) {
    long i = get_global_id(0);
    if (i >= outer * inner) return;
    long o = i / inner, in = i % inner;
    __global const float *p = x + xo + o * L * inner + in;
    float s = 0.0f;
    for (long j = 0; j < L; j++) s += p[j * inner];
    y[yo + i] = scale * s;
}

/* general reduction to a broadcast-compatible shape: output i starts at bidx(i, oshp, str) and sums
 * the R positions bidx(r, rshp, str) over the reduced dims */
__kernel void k_reduce_gen(__global const float *x, long xo, __global float *y, long yo, long n, long R,
                           int8 oshp, int8 rshp, int8 str, float scale) {
    long i = get_global_id(0);
    if (i >= n) return;
    long base = xo + bidx(i, oshp, str);
    float s = 0.0f;
    for (long r = 0; r < R; r++) s += x[base + bidx(r, rshp, str)];
    y[yo + i] = scale * s;
}

/* round to nearest even, the same bit manipulation as pdde_f32_to_f16 / pdde_f32_to_bf16 */
inline ushort f32_to_f16(float f) {
    uint u = as_uint(f);
    uint sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (ushort)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (ushort)(sign | 0x7c00u);
    if (absu < 0x38800000u) {
        if (absu < 0x33000000u) return (ushort)sign;
        uint mant = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23); /* value = mant 2^(e - 150), the f16 unit is 2^-24 */
        uint hv = mant >> shift, rem = mant & ((1u << shift) - 1u), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (hv & 1u))) hv++;
        return (ushort)(sign | hv);
    }
    uint h = (absu >> 13) - (112u << 10), rem = absu & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (ushort)(sign | h);
}

inline float f16_to_f32(ushort hh) {
    uint h = hh;
    uint sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0) {
        if (m == 0) u = sign;
        else {
            e = 113;
            while (!(m & 0x400u)) { m <<= 1; e--; }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) u = sign | 0x7f800000u | (m << 13);
    else u = sign | ((e + 112) << 23) | (m << 13);
    return as_float(u);
}

inline ushort f32_to_bf16(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}

/* dtypes as in pdde_dtype: 0 f32, 1 f16, 2 bf16, 3 i32, 4 i64; offsets in elements of each dtype */
__kernel void k_cast(__global const uchar *x, long xo, int st, __global uchar *y, long yo, int dt, long n) {
    long i = get_global_id(0);
    if (i >= n) return;
    float v;
    int iv = 0; long lv = 0; int is_int = 0, is_long = 0;
    if (st == 0) v = ((__global const float *)x)[xo + i];
    else if (st == 1) v = f16_to_f32(((__global const ushort *)x)[xo + i]);
    else if (st == 2) v = as_float((uint)((__global const ushort *)x)[xo + i] << 16);
    else if (st == 3) { iv = ((__global const int *)x)[xo + i]; v = (float)iv; is_int = 1; lv = iv; }
    else { lv = ((__global const long *)x)[xo + i]; v = (float)lv; is_long = 1; }
    if (dt == 0) ((__global float *)y)[yo + i] = v;
    else if (dt == 1) ((__global ushort *)y)[yo + i] = f32_to_f16(v);
    else if (dt == 2) ((__global ushort *)y)[yo + i] = f32_to_bf16(v);
    else if (dt == 3) ((__global int *)y)[yo + i] = (is_int || is_long) ? (int)lv : convert_int_sat_rtz(v);
    else ((__global long *)y)[yo + i] = (is_int || is_long) ? lv : convert_long_sat_rtz(v);
}

/* fallback GEMM (no CLBlast): C[b] = op(A[b]) op(B[b]), 16x16 tiles, row-major, batch strides in elements */
__kernel __attribute__((reqd_work_group_size(16, 16, 1)))
void k_gemm(__global const float *a, long ao, long lda, long sa, int ta, __global const float *b, long bo, long ldb,
            long sb, int tb, __global float *c, long co, long ldc, long sc, int M, int N, int K) {
    __local float As[16][17], Bs[16][17];
    int col = get_global_id(0), row = get_global_id(1), bt = get_global_id(2);
    int lx = get_local_id(0), ly = get_local_id(1);
    __global const float *A = a + ao + bt * sa;
    __global const float *B = b + bo + bt * sb;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        int ar = get_group_id(1) * 16 + ly, ak = k0 + lx;
        As[ly][lx] = (ar < M && ak < K) ? (ta ? A[(long)ak * lda + ar] : A[(long)ar * lda + ak]) : 0.0f;
        int bk = k0 + ly, bc = get_group_id(0) * 16 + lx;
        Bs[ly][lx] = (bk < K && bc < N) ? (tb ? B[(long)bc * ldb + bk] : B[(long)bk * ldb + bc]) : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < 16; k++) acc += As[ly][k] * Bs[k][lx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (row < M && col < N) c[co + bt * sc + (long)row * ldc + col] = acc;
}

);

/* Dropout and the optimizer updates: the parts whose exact arithmetic must follow the CPU backend. */
static const char pdde_ocl_source_train[] = PDDE_OCL_STR(

/* the CPU backend's counter-based hash (backends/cpu.c dropout_hash): the same mask on every backend */
inline uint dropout_hash(uint seed_lo, uint seed_hi, uint counter, ulong i) {
    ulong z = (((ulong)seed_hi << 32) | seed_lo) ^ (0x9E3779B97F4A7C15UL * (ulong)(counter + 1u)) ^ (i * 0xD1B54A32D192ED03UL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
    return (uint)((z ^ (z >> 31)) >> 32);
}

/* keep(i) = hash(seed, counter, i) >= threshold (= p * 2^32); kept values are scaled by keep_scale */
__kernel void k_dropout(__global const float *x, long xo, __global float *y, long yo, long n, uint threshold,
                        float keep_scale, uint seed_lo, uint seed_hi, uint counter) {
    long i = get_global_id(0);
    if (i >= n) return;
    uint h = dropout_hash(seed_lo, seed_hi, counter, (ulong)i);
    y[yo + i] = h >= threshold ? x[xo + i] * keep_scale : 0.0f;
}

inline float clip_factor(__global const float *gn, long gno, int has_gn, float clip) {
    if (!has_gn || clip <= 0.0f) return 1.0f;
    float norm = sqrt(gn[gno]);
    return norm > clip ? clip / (norm + 1e-6f) : 1.0f;
}

/* p -= lr * m, m = mom * m + (g * scale * clip + wd * p); the gradient is zeroed */
__kernel void k_sgd(__global float *p, long po, __global float *g, long go, __global float *m, long mo,
                    __global const float *gn, long gno, int has_gn, long n, float lr, float mom, float wd,
                    float clip, float scale) {
    long i = get_global_id(0);
    if (i >= n) return;
    float c = clip_factor(gn, gno, has_gn, clip);
    float w = p[po + i];
    float gr = g[go + i] * scale * c + wd * w;
    float v = mom * m[mo + i] + gr;
    m[mo + i] = v;
    p[po + i] = w - lr * (mom > 0.0f ? v : gr);
    g[go + i] = 0.0f;
}

/* AdamW with bias correction (bc1 = 1 - beta1^t, bc2 = 1 - beta2^t) and decoupled weight decay */
__kernel void k_adamw(__global float *p, long po, __global float *g, long go, __global float *m, long mo,
                      __global float *v, long vo, __global const float *gn, long gno, int has_gn, long n, float lr,
                      float b1, float b2, float eps, float wd, float clip, float scale, float bc1, float bc2) {
    long i = get_global_id(0);
    if (i >= n) return;
    float c = clip_factor(gn, gno, has_gn, clip);
    float gr = g[go + i] * scale * c;
    float mm = b1 * m[mo + i] + (1.0f - b1) * gr;
    float vv = b2 * v[vo + i] + (1.0f - b2) * gr * gr;
    m[mo + i] = mm;
    v[vo + i] = vv;
    float w = p[po + i];
    p[po + i] = w - lr * ((mm / bc1) / (sqrt(vv / bc2) + eps) + wd * w);
    g[go + i] = 0.0f;
}

);

#endif
