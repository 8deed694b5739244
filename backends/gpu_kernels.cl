/* gpu_kernels.cl — the kernels of the OpenCL and Level Zero backends, OpenCL C (1.2, and 2.0 for SPIR-V).
 *
 * One source, two ways in:
 *  - Level Zero: compiled to SPIR-V at build time (clang -target spir64, then llvm-spirv; see the
 *    Makefile) into backends/gpu_kernels_spv.h; pointer arguments are device (USM) pointers.
 *  - OpenCL: built from source at run time by the device's driver (the text is embedded as
 *    backends/gpu_kernels_cl.h) with -DPGD_BUFFER_OFFSETS; OpenCL 1.2 has no device pointers on the
 *    host side, so every pointer argument is a buffer and a byte offset (PTR / BIND below).
 * The kernels, their names and their argument lists are those of backends/cuda_kernels.cu, so one
 * dispatcher (backends/gpu_dispatch.h) drives the three backends. Work-groups are powers of 2 of at
 * most 1024 items (the reductions rely on it). */

/* no a*b+c contraction into an FMA: the CPU reference (ISO C11) does not contract either */
#pragma OPENCL FP_CONTRACT OFF

#ifdef PGD_BUFFER_OFFSETS
#define PTR(T, p) __global T *p##_buf, ulong p##_off
#define BIND(T, p) __global T *p = p##_buf ? (__global T *)((__global const char *)p##_buf + p##_off) : 0
#else
#define PTR(T, p) __global T *p
#define BIND(T, p)
#endif

#define MAX_DIMS 6
#define MAX_GROUP 1024

/* Mirrors pgd_shape / pgd_reduce_desc (backends/gpu_dispatch.h). */
typedef struct {
    long ndim;
    long shape[MAX_DIMS];
    long sa[MAX_DIMS];
    long sb[MAX_DIMS];
} pgd_shape;
typedef struct {
    long nk, nr;
    long kshape[MAX_DIMS], kstride[MAX_DIMS];
    long rshape[MAX_DIMS], rstride[MAX_DIMS];
} pgd_reduce_desc;

enum { U_SCALE = 0, U_GELU, U_RELU, U_SILU };
enum { B_ADD = 0, B_SUB, B_MUL };

/* Elementwise loops. Built with PGD_ITEM_PER_ELEMENT (OpenCL on a CPU, where the driver vectorises
 * across work-items, which a loop inside an item defeats) the grid covers every element and an item
 * takes one; otherwise grids are sized to the device and each item strides over the elements. */
#ifdef PGD_ITEM_PER_ELEMENT
#define GRID_STRIDE(i, n) long i = get_global_id(0); if (i < (n))
#else
#define GRID_STRIDE(i, n) for (long i = get_global_id(0); i < (n); i += get_global_size(0))
#endif

static ushort f32_to_f16(float f);
static ushort f32_to_bf16(float f);
/* An f32 result stored as the output's dtype (ydt: 0 f32, else DT_BF16 / DT_F16 as k_cast rounds): an op
 * whose only reader is a cast to bf16 writes bf16 itself (planner/lower.c, the casts folded into their
 * producers). */
static void store_out(__global void *y, long i, float v, int ydt) {
    if (ydt == 2) ((__global ushort *)y)[i] = f32_to_bf16(v);
    else if (ydt == 1) ((__global ushort *)y)[i] = f32_to_f16(v);
    else ((__global float *)y)[i] = v;
}
/* ...and an input of dtype xdt (0 f32, DT_BF16, DT_F16) read as f32: the bf16 logits of the cross-entropy
 * (planner/lower.c, PDDE_BF16_LOGITS) */
static float f16_to_f32(ushort h);
static float load_in(__global const void *x, long i, int xdt) {
    if (xdt == 2) return as_float((uint)((__global const ushort *)x)[i] << 16);
    if (xdt == 1) return f16_to_f32(((__global const ushort *)x)[i]);
    return ((__global const float *)x)[i];
}

static float gelu_f(float x) {
    const float k = 0.7978845608028654f;
    return 0.5f * x * (1.0f + tanh(k * (x + 0.044715f * x * x * x)));
}
static float gelu_back_f(float x, float dy) {
    const float k = 0.7978845608028654f;
    float u = k * (x + 0.044715f * x * x * x);
    float t = tanh(u);
    float du = k * (1.0f + 3.0f * 0.044715f * x * x);
    return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
}
static float sigmoid_f(float x) { return 1.0f / (1.0f + exp(-x)); }

/* if chains, not switches: a CPU driver vectorises across work-items only through if-conversion */
static float unary_f(int op, float x, float a) {
    if (op == U_SCALE) return a * x;
    if (op == U_GELU) return gelu_f(x);
    if (op == U_RELU) return x > 0.0f ? x : 0.0f;
    return x * sigmoid_f(x);
}
static float binary_f(int op, float a, float b) {
    if (op == B_ADD) return a + b;
    if (op == B_SUB) return a - b;
    return a * b;
}

/* Sum / max over the work-group (a power of 2 in size); every item gets the result. */
static float group_sum(float v, __local float *sh) {
    int l = get_local_id(0) + get_local_id(1) * get_local_size(0);
    int n = get_local_size(0) * get_local_size(1);
    barrier(CLK_LOCAL_MEM_FENCE);
    sh[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (l < s) sh[l] += sh[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return sh[0];
}
static float group_max(float v, __local float *sh) {
    int l = get_local_id(0);
    int n = get_local_size(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    sh[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = n / 2; s > 0; s >>= 1) {
        if (l < s) sh[l] = fmax(sh[l], sh[l + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return sh[0];
}

/* ---- elementwise ------------------------------------------------------------------------------ */

__kernel void k_unary(PTR(const float, x), PTR(float, y), long n, int op, float a) {
    BIND(const float, x); BIND(float, y);
    GRID_STRIDE(i, n) y[i] = unary_f(op, x[i], a);
}

__kernel void k_unary_back(PTR(const float, x), PTR(const float, dy), PTR(float, dx), long n, int op) {
    BIND(const float, x); BIND(const float, dy); BIND(float, dx);
    GRID_STRIDE(i, n) {
        float v = x[i], g = dy[i], r;
        if (op == U_GELU) r = gelu_back_f(v, g);
        else if (op == U_RELU) r = v > 0.0f ? g : 0.0f;
        else { float s = sigmoid_f(v); r = g * s * (1.0f + v * (1.0f - s)); }
        dx[i] = r;
    }
}

/* ---- rotary position embedding (rope; backends/cpu.c's kernel is the reference) ---------------- */

/* Mirrors pgd_rope_freqs (backends/gpu_dispatch.h): pair i's inverse frequency, computed on the host as the CPU does */
#define ROPE_HALF_MAX 128
typedef struct { float inv[ROPE_HALF_MAX]; } pgd_rope_freqs;

/* x [rows = B T H, D] (half_d = D / 2) of dtype dt (0 f32, DT_BF16, DT_F16), an item per pair (i, i + half_d) of a row, the
 * row's position t = (row / H) % T: rotated by the angle t * inv[i] (sign -1: by minus it, the backward), in f32,
 * stored once as dt */
__kernel void k_rope(PTR(const void, x), PTR(void, y), long pairs, long T, long H, long half_d, pgd_rope_freqs f, float sign, int dt) {
    BIND(const void, x); BIND(void, y);
    GRID_STRIDE(p, pairs) {
        long row = p / half_d, i = p - row * half_d, e = row * 2 * half_d + i;
        float a = (float)((row / H) % T) * f.inv[i], c = cos(a), s = sign * sin(a);
        float x0 = load_in(x, e, dt), x1 = load_in(x, e + half_d, dt);
        store_out(y, e, x0 * c - x1 * s, dt);
        store_out(y, e + half_d, x1 * c + x0 * s, dt);
    }
}

__kernel void k_binary(PTR(const float, a), PTR(const float, b), PTR(float, y), long n, long nb, int op) {
    BIND(const float, a); BIND(const float, b); BIND(float, y);
    if (nb == n) { GRID_STRIDE(i, n) y[i] = binary_f(op, a[i], b[i]); }
    else { GRID_STRIDE(i, n) y[i] = binary_f(op, a[i], b[i % nb]); }
}

__kernel void k_binary_bcast(PTR(const float, a), PTR(const float, b), PTR(float, y), long n, pgd_shape s, int op) {
    BIND(const float, a); BIND(const float, b); BIND(float, y);
    GRID_STRIDE(i, n) {
        long r = i, ia = 0, ib = 0;
        for (int d = (int)s.ndim - 1; d >= 0; d--) {
            long c = r % s.shape[d];
            r /= s.shape[d];
            ia += c * s.sa[d];
            ib += c * s.sb[d];
        }
        y[i] = binary_f(op, a[ia], b[ib]);
    }
}

__kernel void k_gather(PTR(const float, x), PTR(float, y), long n, pgd_shape s, float scale) {
    BIND(const float, x); BIND(float, y);
    GRID_STRIDE(i, n) {
        long r = i, ix = 0;
        for (int d = (int)s.ndim - 1; d >= 0; d--) {
            long c = r % s.shape[d];
            r /= s.shape[d];
            ix += c * s.sa[d];
        }
        y[i] = scale * x[ix];
    }
}

__kernel void k_copy2d(PTR(const float, src), PTR(float, dst), long outer, long rowlen, long sp, long soff, long dp,
                       long doff) {
    BIND(const float, src); BIND(float, dst);
    long n = outer * rowlen;
    GRID_STRIDE(i, n) {
        long o = i / rowlen, j = i - o * rowlen;
        dst[o * dp + doff + j] = src[o * sp + soff + j];
    }
}

/* ---- reductions ------------------------------------------------------------------------------- */

/* The element offset of index i of a row-major shape [n dims] with the given strides: where output o
 * starts (the kept dims) and where reduced element r sits from there (the reduced dims). */
static long strided_offset(long i, long n, const long *shape, const long *stride) {
    long off = 0;
    for (int d = (int)n - 1; d >= 0; d--) {
        long c = i % shape[d];
        i /= shape[d];
        off += c * stride[d];
    }
    return off;
}

__kernel void k_reduce_thread(PTR(const float, x), PTR(float, y), long nout, long nred, pgd_reduce_desc s,
                              float scale) {
    BIND(const float, x); BIND(float, y);
    GRID_STRIDE(o, nout) {
        long base = strided_offset(o, s.nk, s.kshape, s.kstride);
        float acc = 0.0f;
        for (long r = 0; r < nred; r++) acc += x[base + strided_offset(r, s.nr, s.rshape, s.rstride)];
        y[o] = scale * acc;
    }
}

__kernel void k_reduce_block(PTR(const float, x), PTR(float, y), long nout, long nred, pgd_reduce_desc s, float scale) {
    BIND(const float, x); BIND(float, y);
    __local float sh[MAX_GROUP];
    for (long o = get_group_id(0); o < nout; o += get_num_groups(0)) {
        long base = strided_offset(o, s.nk, s.kshape, s.kstride);
        float acc = 0.0f;
        for (long r = get_local_id(0); r < nred; r += get_local_size(0)) acc += x[base + strided_offset(r, s.nr, s.rshape, s.rstride)];
        acc = group_sum(acc, sh);
        if (get_local_id(0) == 0) y[o] = scale * acc;
    }
}

/* x as [R, Cn]: y[c, j] = scale * sum of x[r, j] over the rows of chunk c = group id 1 (rpc rows a chunk).
 * Groups of 32 columns x 8 row lanes. x of dtype xdt (load_in; bf16 bias gradients: PDDE_BF16_GRADS). */
__kernel void k_colsum(PTR(const void, x), PTR(float, y), long R, long Cn, float scale, long rpc, int xdt) {
    BIND(const void, x); BIND(float, y);
    __local float sh[8][33];
    int tx = get_local_id(0), ty = get_local_id(1), ny = get_local_size(1);
    long j = (long)get_group_id(0) * 32 + tx;
    long r0 = (long)get_group_id(1) * rpc, r1 = r0 + rpc < R ? r0 + rpc : R;
    float acc = 0.0f;
    if (j < Cn)
        for (long r = r0 + ty; r < r1; r += ny) acc += load_in(x, r * Cn + j, xdt);
    sh[ty][tx] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (ty == 0 && j < Cn) {
        float s = 0.0f;
        for (int k = 0; k < ny; k++) s += sh[k][tx];
        y[get_group_id(1) * Cn + j] = scale * s;
    }
}

/* x as [R, Cn] (Cn a multiple of 4): y[c, j] = scale * the sum of x[r, j] over the rows of chunk c = group id 1 (rpc rows
 * a chunk); groups of 256 items: 32 lanes of 4 columns x 8 row lanes, 4 rows a step (cuda_mem.cuh's k_colsum2). */
#define CS2_COLS 128
__kernel void k_colsum2(PTR(const void, x), PTR(float, y), long R, long Cn, float scale, long rpc, int xdt) {
    BIND(const void, x); BIND(float, y);
    __local float sh[8][CS2_COLS + 4];
    int tx = get_local_id(0) & 31, ty = get_local_id(0) >> 5;
    long j = (long)get_group_id(0) * CS2_COLS + tx * 4;
    long r0 = (long)get_group_id(1) * rpc, r1 = r0 + rpc < R ? r0 + rpc : R;
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (j < Cn) {
        long r = r0 + ty;
        if (xdt == 0)
            for (; r + 24 < r1; r += 32)
                for (int k = 0; k < 4; k++) {
                    float q0 = load_in(x, r * Cn + j + k, 0), q1 = load_in(x, (r + 8) * Cn + j + k, 0);
                    float q2 = load_in(x, (r + 16) * Cn + j + k, 0), q3 = load_in(x, (r + 24) * Cn + j + k, 0);
                    a[k] += q0 + q1 + (q2 + q3);
                }
        for (; r < r1; r += 8)
            for (int k = 0; k < 4; k++) a[k] += load_in(x, r * Cn + j + k, xdt);
    }
    for (int k = 0; k < 4; k++) sh[ty][tx * 4 + k] = a[k];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (ty == 0 && j < Cn)
        for (int k = 0; k < 4; k++) {
            float s = 0.0f;
            for (int l = 0; l < 8; l++) s += sh[l][tx * 4 + k];
            y[get_group_id(1) * Cn + j + k] = scale * s;
        }
}

__kernel void k_sum_partial(PTR(const float, x), long n, int square, PTR(float, part)) {
    BIND(const float, x); BIND(float, part);
    __local float sh[MAX_GROUP];
    float acc = 0.0f;
    GRID_STRIDE(i, n) { float v = x[i]; acc += square ? v * v : v; }
    acc = group_sum(acc, sh);
    if (get_local_id(0) == 0) part[get_group_id(0)] = acc;
}

__kernel void k_sum_final(PTR(const float, part), long np, PTR(const float, prev), float scale, PTR(float, y)) {
    BIND(const float, part); BIND(const float, prev); BIND(float, y);
    __local float sh[MAX_GROUP];
    float acc = 0.0f;
    for (long i = get_local_id(0); i < np; i += get_local_size(0)) acc += part[i];
    acc = group_sum(acc, sh);
    if (get_local_id(0) == 0) y[0] = (prev ? prev[0] : 0.0f) + scale * acc;
}

/* ---- normalisation and softmax: one group per row of C ---------------------------------------- */

#define ROWS_LOOP(r, rows) for (long r = get_group_id(0); r < (rows); r += get_num_groups(0))
#define COLS_LOOP(j, C) for (long j = get_local_id(0); j < (C); j += get_local_size(0))

/* res (null: none): added to x first, the sum written to sum (planner/lower.c, PDDE_FUSE_ADD_LN); each item
 * reads back only the columns it wrote */
__kernel void k_layernorm(PTR(const float, x), PTR(const float, g), PTR(const float, b), PTR(void, y), long rows,
                          long C, float eps, int ydt, PTR(const float, res), PTR(float, sum)) {
    BIND(const float, x); BIND(const float, g); BIND(const float, b); BIND(void, y); BIND(const float, res); BIND(float, sum);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *xr = x + r * C;
        if (res) {
            COLS_LOOP(j, C) sum[r * C + j] = xr[j] + res[r * C + j];
            xr = sum + r * C;
        }
        float s = 0.0f;
        COLS_LOOP(j, C) s += xr[j];
        float mean = group_sum(s, sh) / (float)C;
        float v = 0.0f;
        COLS_LOOP(j, C) { float d = xr[j] - mean; v += d * d; }
        float rstd = rsqrt(group_sum(v, sh) / (float)C + eps);
        COLS_LOOP(j, C) store_out(y, r * C + j, (xr[j] - mean) * rstd * g[j] + (b ? b[j] : 0.0f), ydt);
    }
}

/* res (null: none): the other gradient of x, added to dx (planner/lower.c, PDDE_FUSE_ADD_LN); cp (null: none):
 * dx also stored as dtype cdt (a rounded copy: PDDE_BF16_GRADS) */
__kernel void k_layernorm_back(PTR(const float, x), PTR(const float, g), PTR(const float, dy), PTR(float, dx),
                               long rows, long C, float eps, PTR(const float, res), PTR(void, cp), int cdt) {
    BIND(const float, x); BIND(const float, g); BIND(const float, dy); BIND(float, dx); BIND(const float, res); BIND(void, cp);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *xr = x + r * C;
        __global const float *dr = dy + r * C;
        float s = 0.0f;
        COLS_LOOP(j, C) s += xr[j];
        float mean = group_sum(s, sh) / (float)C;
        float v = 0.0f;
        COLS_LOOP(j, C) { float d = xr[j] - mean; v += d * d; }
        float rstd = rsqrt(group_sum(v, sh) / (float)C + eps);
        /* dy*gamma rounded once (no contraction into an FMA), so that g - mean(g) is exactly 0 where it
         * should be (C = 1), as in the CPU reference */
        float s1 = 0.0f, s2 = 0.0f;
        COLS_LOOP(j, C) {
            float dg = dr[j] * g[j];
            s1 += dg;
            s2 += dg * ((xr[j] - mean) * rstd);
        }
        s1 = group_sum(s1, sh) / (float)C;
        s2 = group_sum(s2, sh) / (float)C;
        COLS_LOOP(j, C) {
            float xh = (xr[j] - mean) * rstd, v = rstd * (dr[j] * g[j] - s1 - xh * s2);
            float o = res ? res[r * C + j] + v : v;
            dx[r * C + j] = o;
            if (cp) store_out(cp, r * C + j, o, cdt);
        }
    }
}

__kernel void k_rmsnorm(PTR(const float, x), PTR(const float, g), PTR(float, y), long rows, long C, float eps) {
    BIND(const float, x); BIND(const float, g); BIND(float, y);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *xr = x + r * C;
        float s = 0.0f;
        COLS_LOOP(j, C) s += xr[j] * xr[j];
        float rr = rsqrt(group_sum(s, sh) / (float)C + eps);
        COLS_LOOP(j, C) y[r * C + j] = xr[j] * rr * g[j];
    }
}

__kernel void k_rmsnorm_back(PTR(const float, x), PTR(const float, g), PTR(const float, dy), PTR(float, dx), long rows,
                             long C, float eps) {
    BIND(const float, x); BIND(const float, g); BIND(const float, dy); BIND(float, dx);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *xr = x + r * C;
        __global const float *dr = dy + r * C;
        float s = 0.0f, t = 0.0f;
        COLS_LOOP(j, C) s += xr[j] * xr[j];
        float rr = rsqrt(group_sum(s, sh) / (float)C + eps);
        /* dx = rr * (dy*g - xhat * mean(dy*g * xhat)), the CPU reference's form: with C = 1 it is all
         * cancellation (xhat^2 ~ 1), which other arrangements round differently */
        COLS_LOOP(j, C) t += dr[j] * g[j] * (xr[j] * rr);
        t = group_sum(t, sh) / (float)C;
        COLS_LOOP(j, C) dx[r * C + j] = rr * (dr[j] * g[j] - xr[j] * rr * t);
    }
}

__kernel void k_row_stats(PTR(const float, x), PTR(float, st), long rows, long C, float eps, int rms) {
    BIND(const float, x); BIND(float, st);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *xr = x + r * C;
        float mean = 0.0f;
        if (!rms) {
            float s = 0.0f;
            COLS_LOOP(j, C) s += xr[j];
            mean = group_sum(s, sh) / (float)C;
        }
        float v = 0.0f;
        COLS_LOOP(j, C) { float d = xr[j] - mean; v += d * d; }
        float rstd = rsqrt(group_sum(v, sh) / (float)C + eps);
        if (get_local_id(0) == 0) { st[2 * r] = mean; st[2 * r + 1] = rstd; }
    }
}

/* dgamma over the rows of chunk = group id 1 (rpc rows a chunk), into dg[chunk * C + j] */
__kernel void k_gamma_back(PTR(const float, x), PTR(const float, dy), PTR(const float, st), PTR(float, dg), long rows,
                           long C, long rpc) {
    BIND(const float, x); BIND(const float, dy); BIND(const float, st); BIND(float, dg);
    __local float sh[8][33];
    int tx = get_local_id(0), ty = get_local_id(1), ny = get_local_size(1);
    long j = (long)get_group_id(0) * 32 + tx;
    long r0 = (long)get_group_id(1) * rpc, r1 = r0 + rpc < rows ? r0 + rpc : rows;
    float acc = 0.0f;
    if (j < C)
        for (long r = r0 + ty; r < r1; r += ny) acc += dy[r * C + j] * (x[r * C + j] - st[2 * r]) * st[2 * r + 1];
    sh[ty][tx] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (ty == 0 && j < C) {
        float s = 0.0f;
        for (int k = 0; k < ny; k++) s += sh[k][tx];
        dg[get_group_id(1) * C + j] = s;
    }
}

/* ---- layernorm with a 32-item slice of the group per row (cuda_norm.cuh's kernels: PGD_MEM_LN2) ------------- */

/* A row of C <= 32 * 4 * G columns in its slice's private registers: item l of the slice holds the 4-column groups
 * u * 32 + l (u < G), read once (element by element here: the CUDA kernels' 16-byte loads read the same
 * columns); a slice's sums go through group memory (a warp's shuffles in CUDA), so every item of the group takes
 * part in each and the row loops run alike for all slices (a slice past the last row computes on zeros). Built, as
 * cuda_norm.cuh's, for G = 6, 8, 13 and 16 (rows up to 768, 1024, 1664, 2048 columns: the names without and with
 * the suffixes _1024, _1664, _2048; PGD_LN2_WIDTHS in backends/gpu_dispatch.h): the bodies take G and the private
 * arrays from the kernels LN2_INSTANCE declares. */

/* the sum of v over the item's slice of 32, to each of them */
static float slice_sum(float v, __local float *sh) {
    int l = get_local_id(0), i = l & 31;
    barrier(CLK_LOCAL_MEM_FENCE);
    sh[l] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = 16; s > 0; s >>= 1) {
        if (i < s) sh[l] += sh[l + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    return sh[l - i];
}
/* columns j .. j + 3 of the row at p (0 past C or on a dead slice) */
static void ln2_load(__global const float *p, long j, long C, int live, float *v) {
    for (int k = 0; k < 4; k++) v[k] = live && j + k < C ? p[j + k] : 0.0f;
}
static long ln2_col(int u, int lane) { return (long)(u * 32 + lane) * 4; }
/* the row's mean and rstd (k_layernorm's two passes) */
static void ln2_stats(float (*v)[4], int G, long C, int lane, float eps, __local float *sh, float *mean, float *rstd) {
    float s = 0.0f, q = 0.0f;
    for (int u = 0; u < G; u++) s += (v[u][0] + v[u][1]) + (v[u][2] + v[u][3]);
    float m = slice_sum(s, sh) / (float)C;
    for (int u = 0; u < G; u++)
        for (int k = 0; k < 4; k++)
            if (ln2_col(u, lane) + k < C) {
                float d = v[u][k] - m;
                q += d * d;
            }
    *mean = m;
    *rstd = rsqrt(slice_sum(q, sh) / (float)C + eps);
}

static void layernorm2(__global const float *x, __global const float *g, __global const float *b, __global void *y, long rows, long C,
                       float eps, int ydt, __global const float *res, __global float *sum, int G, float (*v)[4], __local float *sh) {
    int lane = get_local_id(0) & 31;
    long wpb = get_local_size(0) / 32;
    for (long r0 = get_group_id(0) * wpb; r0 < rows; r0 += get_num_groups(0) * wpb) {
        long r = r0 + get_local_id(0) / 32;
        int live = r < rows;
        for (int u = 0; u < G; u++) {
            long j = ln2_col(u, lane);
            ln2_load(x + r * C, j, C, live, v[u]);
            if (res) {
                float q[4];
                ln2_load(res + r * C, j, C, live, q);
                for (int k = 0; k < 4; k++) {
                    v[u][k] += q[k];
                    if (live && j + k < C) sum[r * C + j + k] = v[u][k];
                }
            }
        }
        float mean, rstd;
        ln2_stats(v, G, C, lane, eps, sh, &mean, &rstd);
        for (int u = 0; u < G; u++)
            for (int k = 0; k < 4; k++) {
                long j = ln2_col(u, lane) + k;
                if (live && j < C) store_out(y, r * C + j, (v[u][k] - mean) * rstd * g[j] + (b ? b[j] : 0.0f), ydt);
            }
    }
}

static void layernorm_back2(__global const float *x, __global const float *g, __global const float *dy, __global float *dx, long rows,
                            long C, float eps, __global const float *res, __global void *cp, int cdt, int G, float (*v)[4], float (*d)[4],
                            __local float *sh) {
    int lane = get_local_id(0) & 31;
    long wpb = get_local_size(0) / 32;
    for (long r0 = get_group_id(0) * wpb; r0 < rows; r0 += get_num_groups(0) * wpb) {
        long r = r0 + get_local_id(0) / 32;
        int live = r < rows;
        for (int u = 0; u < G; u++) {
            long j = ln2_col(u, lane);
            float gg[4];
            ln2_load(x + r * C, j, C, live, v[u]);
            ln2_load(dy + r * C, j, C, live, d[u]);
            ln2_load(g, j, C, live, gg);
            for (int k = 0; k < 4; k++) d[u][k] *= gg[k]; /* (dy*g rounded once: no contraction in this file) */
        }
        float mean, rstd;
        ln2_stats(v, G, C, lane, eps, sh, &mean, &rstd);
        float s1 = 0.0f, s2 = 0.0f;
        for (int u = 0; u < G; u++)
            for (int k = 0; k < 4; k++) {
                s1 += d[u][k];
                s2 += d[u][k] * ((v[u][k] - mean) * rstd);
            }
        s1 = slice_sum(s1, sh) / (float)C;
        s2 = slice_sum(s2, sh) / (float)C;
        for (int u = 0; u < G; u++)
            for (int k = 0; k < 4; k++) {
                long j = ln2_col(u, lane) + k;
                if (!live || j >= C) continue;
                long i = r * C + j;
                float xh = (v[u][k] - mean) * rstd, w = rstd * (d[u][k] - s1 - xh * s2);
                float o = res ? res[i] + w : w;
                dx[i] = o;
                if (cp) store_out(cp, i, o, cdt);
            }
    }
}

/* part[group * C + j] = the sum of dy[r, j] * xhat[r, j] over the group's rows (rpb a group), the slices' sums added in
 * slice order */
static void layernorm_gamma2(__global const float *x, __global const float *dy, __global float *part, long rows, long C, float eps, long rpb,
                             int G, float (*v)[4], float (*d)[4], float (*acc)[4], __local float *sh, __local float *col) {
    int lane = get_local_id(0) & 31, w = get_local_id(0) / 32;
    long wpb = get_local_size(0) / 32, r0 = (long)get_group_id(0) * rpb, r1 = r0 + rpb < rows ? r0 + rpb : rows;
    for (int u = 0; u < G; u++)
        for (int k = 0; k < 4; k++) acc[u][k] = 0.0f;
    for (long rb = r0; rb < r1; rb += wpb) {
        long r = rb + w;
        int live = r < r1;
        for (int u = 0; u < G; u++) {
            ln2_load(x + r * C, ln2_col(u, lane), C, live, v[u]);
            ln2_load(dy + r * C, ln2_col(u, lane), C, live, d[u]);
        }
        float mean, rstd;
        ln2_stats(v, G, C, lane, eps, sh, &mean, &rstd);
        for (int u = 0; u < G; u++)
            for (int k = 0; k < 4; k++) acc[u][k] += d[u][k] * ((v[u][k] - mean) * rstd);
    }
    for (int s = 0; s < wpb; s++) {
        if (w == s)
            for (int u = 0; u < G; u++)
                for (int k = 0; k < 4; k++) {
                    long j = ln2_col(u, lane) + k;
                    if (j < C) col[j] = s ? col[j] + acc[u][k] : acc[u][k];
                }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (long j = get_local_id(0); j < C; j += get_local_size(0)) part[get_group_id(0) * C + j] = col[j];
}

/* the kernels of G groups a lane (suffix: their names' end) */
#define LN2_INSTANCE(suffix, G)                                                                                               \
    __kernel void k_layernorm2##suffix(PTR(const float, x), PTR(const float, g), PTR(const float, b), PTR(void, y), long rows,  \
                                       long C, float eps, int ydt, PTR(const float, res), PTR(float, sum)) {                    \
        BIND(const float, x); BIND(const float, g); BIND(const float, b); BIND(void, y); BIND(const float, res);               \
        BIND(float, sum);                                                                                                      \
        __local float sh[MAX_GROUP];                                                                                           \
        float v[G][4];                                                                                                         \
        layernorm2(x, g, b, y, rows, C, eps, ydt, res, sum, G, v, sh);                                                         \
    }                                                                                                                          \
    __kernel void k_layernorm_back2##suffix(PTR(const float, x), PTR(const float, g), PTR(const float, dy), PTR(float, dx),     \
                                            long rows, long C, float eps, PTR(const float, res), PTR(void, cp), int cdt) {     \
        BIND(const float, x); BIND(const float, g); BIND(const float, dy); BIND(float, dx); BIND(const float, res);            \
        BIND(void, cp);                                                                                                        \
        __local float sh[MAX_GROUP];                                                                                           \
        float v[G][4], d[G][4];                                                                                                \
        layernorm_back2(x, g, dy, dx, rows, C, eps, res, cp, cdt, G, v, d, sh);                                                \
    }                                                                                                                          \
    __kernel void k_layernorm_gamma2##suffix(PTR(const float, x), PTR(const float, dy), PTR(float, part), long rows, long C,    \
                                             float eps, long rpb) {                                                            \
        BIND(const float, x); BIND(const float, dy); BIND(float, part);                                                        \
        __local float sh[MAX_GROUP];                                                                                           \
        __local float col[32 * 4 * G];                                                                                         \
        float v[G][4], d[G][4], acc[G][4];                                                                                     \
        layernorm_gamma2(x, dy, part, rows, C, eps, rpb, G, v, d, acc, sh, col);                                               \
    }
LN2_INSTANCE(, 6)
LN2_INSTANCE(_1024, 8)
LN2_INSTANCE(_1664, 13)
LN2_INSTANCE(_2048, 16)

__kernel void k_softmax(PTR(const float, x), PTR(float, y), long rows, long C, long T, int causal) {
    BIND(const float, x); BIND(float, y);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *xr = x + r * C;
        long lim = causal ? (r % T) + 1 : C;
        if (lim > C) lim = C;
        float m = -INFINITY;
        COLS_LOOP(j, lim) m = fmax(m, xr[j]);
        m = group_max(m, sh);
        float s = 0.0f;
        COLS_LOOP(j, lim) s += exp(xr[j] - m);
        float inv = 1.0f / group_sum(s, sh);
        COLS_LOOP(j, C) y[r * C + j] = j < lim ? exp(xr[j] - m) * inv : 0.0f;
    }
}

__kernel void k_softmax_back(PTR(const float, y), PTR(const float, dy), PTR(float, dx), long rows, long C) {
    BIND(const float, y); BIND(const float, dy); BIND(float, dx);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *yr = y + r * C;
        __global const float *dr = dy + r * C;
        float s = 0.0f;
        COLS_LOOP(j, C) s += yr[j] * dr[j];
        s = group_sum(s, sh);
        COLS_LOOP(j, C) dx[r * C + j] = yr[j] * (dr[j] - s);
    }
}

/* A row's loss without a class: 0 for a negative target (ignored), NaN for one >= V, which makes the loss NaN
 * so that the session's check of the loss finds the target and names it. */
#define CE_IGNORED_LOSS(t) ((t) < 0 ? 0.0f : NAN)

__kernel void k_ce_rows(PTR(const void, logits), PTR(const int, tgt), PTR(float, part), long rows, long V, int ldt) {
    BIND(const void, logits); BIND(const int, tgt); BIND(float, part);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        long lr = r * V; /* (the row's first logit, of dtype ldt) */
        int t = tgt[r];
        float m = -INFINITY;
        COLS_LOOP(j, V) m = fmax(m, load_in(logits, lr + j, ldt));
        m = group_max(m, sh);
        float s = 0.0f;
        COLS_LOOP(j, V) s += exp(load_in(logits, lr + j, ldt) - m);
        s = group_sum(s, sh);
        if (get_local_id(0) == 0) {
            int ok = t >= 0 && t < V;
            part[r] = ok ? (log(s) + m - load_in(logits, lr + t, ldt)) : CE_IGNORED_LOSS(t);
            part[rows + r] = ok ? 1.0f : 0.0f;
        }
    }
}

__kernel void k_ce_final(PTR(const float, part), long rows, PTR(float, y)) {
    BIND(const float, part); BIND(float, y);
    __local float sh[MAX_GROUP];
    float s = 0.0f, c = 0.0f;
    COLS_LOOP(i, rows) { s += part[i]; c += part[rows + i]; }
    s = group_sum(s, sh);
    c = group_sum(c, sh);
    if (get_local_id(0) == 0) y[0] = c > 0.0f ? s / c : 0.0f;
}

__kernel void k_ce_count(PTR(const int, tgt), long rows, long V, PTR(float, cnt)) {
    BIND(const int, tgt); BIND(float, cnt);
    __local float sh[MAX_GROUP];
    float c = 0.0f;
    COLS_LOOP(i, rows) c += (tgt[i] >= 0 && tgt[i] < V) ? 1.0f : 0.0f;
    c = group_sum(c, sh);
    if (get_local_id(0) == 0) cnt[0] = c;
}

__kernel void k_ce_back(PTR(const void, logits), PTR(const int, tgt), PTR(const float, dloss), PTR(const float, cnt),
                        PTR(void, dx), long rows, long V, int ydt, int ldt) {
    BIND(const void, logits); BIND(const int, tgt); BIND(const float, dloss); BIND(const float, cnt); BIND(void, dx);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        long lr = r * V;
        int t = tgt[r];
        /* every work-item reaches every barrier: an ignored row computes too and writes zeros (an early
         * `continue` before the group reductions raced on PoCL) */
        float ok = (t >= 0 && t < V) ? 1.0f : 0.0f;
        float m = -INFINITY;
        COLS_LOOP(j, V) m = fmax(m, load_in(logits, lr + j, ldt));
        m = group_max(m, sh);
        float s = 0.0f;
        COLS_LOOP(j, V) s += exp(load_in(logits, lr + j, ldt) - m);
        float c = cnt[0] > 0.0f ? cnt[0] : 1.0f;
        float scale = ok * dloss[0] / c, inv = 1.0f / group_sum(s, sh);
        COLS_LOOP(j, V) store_out(dx, r * V + j, (exp(load_in(logits, lr + j, ldt) - m) * inv - (j == t ? 1.0f : 0.0f)) * scale, ydt);
    }
}

/* The loss and dlogits in one pass over each row (lowering's PDDE_FUSE_CE; cuda_mem.cuh's k_ce_fused): each item
 * keeps a running maximum and a sum of exponentials rescaled when the maximum grows, the group combines them;
 * the loss into part[r] (and 1/0 for a valid target into part[rows + r], for k_ce_final), then dlogits =
 * (exp(x - m) / s - onehot) * dloss / count, zero on an ignored row (every item reaches every barrier). */
__kernel void k_ce_fused(PTR(const void, logits), PTR(const int, tgt), PTR(const float, dloss), PTR(const float, cnt),
                         PTR(float, part), PTR(void, dx), long rows, long V, int ydt, int ldt) {
    BIND(const void, logits); BIND(const int, tgt); BIND(const float, dloss); BIND(const float, cnt); BIND(float, part); BIND(void, dx);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        long lr = r * V;
        int t = tgt[r];
        int ok = t >= 0 && t < V;
        float m = -INFINITY, s = 0.0f;
        COLS_LOOP(j, V) {
            float x = load_in(logits, lr + j, ldt);
            if (x > m) s = s * exp(m - x) + 1.0f, m = x;
            else s += exp(x - m);
        }
        float mb = group_max(m, sh);
        s = group_sum(m == -INFINITY ? 0.0f : s * exp(m - mb), sh);
        if (get_local_id(0) == 0) {
            part[r] = ok ? log(s) + mb - load_in(logits, lr + t, ldt) : CE_IGNORED_LOSS(t);
            part[rows + r] = ok ? 1.0f : 0.0f;
        }
        float c = cnt[0] > 0.0f ? cnt[0] : 1.0f;
        float scale = dloss[0] / c, inv = 1.0f / s;
        COLS_LOOP(j, V) store_out(dx, lr + j, ok ? (exp(load_in(logits, lr + j, ldt) - mb) * inv - (j == t ? 1.0f : 0.0f)) * scale : 0.0f, ydt);
    }
}

/* The loss and dlogits reading each row from device memory once (PGD_MEM_CE1; cuda_mem.cuh's k_ce_staged): the
 * group copies the row into row (local memory of V elements of the logits' dtype) as it takes the maximum, then the
 * sum of exp(x - m) and dlogits = (exp(x - m) / s - onehot) * dloss / count from there; each item reads back only the
 * elements it wrote. An ignored row computes too and writes zeros (every item reaches every barrier: k_ce_back). */
static float local_in(__local const void *x, long i, int xdt) {
    if (xdt == 2) return as_float((uint)((__local const ushort *)x)[i] << 16);
    if (xdt == 1) return f16_to_f32(((__local const ushort *)x)[i]);
    return ((__local const float *)x)[i];
}
__kernel void k_ce_staged(PTR(const void, logits), PTR(const int, tgt), PTR(const float, dloss), PTR(const float, cnt),
                          PTR(float, part), PTR(void, dx), long rows, long V, int ydt, int ldt, __local void *row) {
    BIND(const void, logits); BIND(const int, tgt); BIND(const float, dloss); BIND(const float, cnt); BIND(float, part); BIND(void, dx);
    __local float sh[MAX_GROUP];
    float c = cnt[0] > 0.0f ? cnt[0] : 1.0f, scale = dloss[0] / c;
    ROWS_LOOP(r, rows) {
        long lr = r * V;
        int t = tgt[r];
        int ok = t >= 0 && t < V;
        float m = -INFINITY;
        if (ldt == 0)
            COLS_LOOP(j, V) {
                float x = ((__global const float *)logits)[lr + j];
                ((__local float *)row)[j] = x;
                m = fmax(m, x);
            }
        else
            COLS_LOOP(j, V) {
                ((__local ushort *)row)[j] = ((__global const ushort *)logits)[lr + j];
                m = fmax(m, local_in(row, j, ldt));
            }
        m = group_max(m, sh);
        float s = 0.0f;
        COLS_LOOP(j, V) s += exp(local_in(row, j, ldt) - m);
        s = group_sum(s, sh);
        if (get_local_id(0) == 0) {
            part[r] = ok ? log(s) + m - load_in(logits, lr + t, ldt) : CE_IGNORED_LOSS(t);
            part[rows + r] = ok ? 1.0f : 0.0f;
        }
        float inv = 1.0f / s;
        COLS_LOOP(j, V) store_out(dx, lr + j, ok ? (exp(local_in(row, j, ldt) - m) * inv - (j == t ? 1.0f : 0.0f)) * scale : 0.0f, ydt);
    }
}

/* ---- embedding -------------------------------------------------------------------------------- */

__kernel void k_embedding(PTR(const float, table), PTR(const int, ids), PTR(float, y), long n_ids, long C, long V) {
    BIND(const float, table); BIND(const int, ids); BIND(float, y);
    long n = n_ids * C;
    GRID_STRIDE(i, n) {
        long r = i / C, j = i - r * C;
        int id = ids[r];
        y[i] = (id >= 0 && id < V) ? table[(long)id * C + j] : NAN; /* (NaN: the step's loss check names the id) */
    }
}

/* Float atomic add through compare-and-swap (OpenCL 2.0 core has no float atomics). */
static void atomic_add_f(__global float *p, float v) {
    __global volatile uint *u = (__global volatile uint *)p;
    uint old = *u, assumed;
    do {
        assumed = old;
        old = atomic_cmpxchg(u, assumed, as_uint(as_float(assumed) + v));
    } while (old != assumed);
}

__kernel void k_embedding_back(PTR(const float, dy), PTR(const int, ids), PTR(float, out), long n_ids, long C, long V) {
    BIND(const float, dy); BIND(const int, ids); BIND(float, out);
    long n = n_ids * C;
    GRID_STRIDE(i, n) {
        long r = i / C, j = i - r * C;
        int id = ids[r];
        if (id >= 0 && id < V) atomic_add_f(&out[(long)id * C + j], dy[i]);
    }
}

/* The reproducible backward (gpu_dispatch.h's PGD_EMB_SORTED): one group sorts the keys id << 32 | position
 * (bitonic, in place in global memory; n_pow2 >= n_ids a power of 2, the tail padded with ~0), so each
 * table row's positions come together, in the order of the ids; ids outside [0, V) get id 0xffffffff and
 * sort last. Then k_embedding_back_rows adds each row's dy rows in that order: the CPU backend's order. */
__kernel void k_embedding_sort(PTR(const int, ids), PTR(ulong, keys), long n_ids, long n_pow2, long V) {
    BIND(const int, ids); BIND(ulong, keys);
    long l = get_local_id(0), L = get_local_size(0);
    for (long i = l; i < n_pow2; i += L) {
        int id = i < n_ids ? ids[i] : -1;
        uint row = id >= 0 && id < V ? (uint)id : 0xffffffffu;
        keys[i] = i < n_ids ? (ulong)row << 32 | (ulong)i : ~(ulong)0;
    }
    for (long k = 2; k <= n_pow2; k <<= 1)
        for (long j = k >> 1; j > 0; j >>= 1) {
            barrier(CLK_GLOBAL_MEM_FENCE);
            for (long i = l; i < n_pow2 / 2; i += L) { /* pair i: a (bit j clear) and a + j */
                long a = ((i & ~(j - 1)) << 1) | (i & (j - 1));
                ulong x = keys[a], y = keys[a + j];
                if ((x > y) == ((a & k) == 0)) keys[a] = y, keys[a + j] = x;
            }
        }
}

/* The same keys by one item, a counting sort (a CPU device, where a group runs as a loop: its n_ids + V
 * steps beat the network's n log^2 n); cnt: V + 1 counters, the last for the ids outside [0, V). */
__kernel void k_embedding_count_sort(PTR(const int, ids), PTR(ulong, keys), PTR(int, cnt), long n_ids, long V) {
    BIND(const int, ids); BIND(ulong, keys); BIND(int, cnt);
    if (get_global_id(0) != 0) return;
    for (long v = 0; v <= V; v++) cnt[v] = 0;
    for (long i = 0; i < n_ids; i++) cnt[ids[i] >= 0 && ids[i] < V ? ids[i] : V]++;
    for (long v = 0, at = 0; v <= V; v++) {
        int c = cnt[v];
        cnt[v] = (int)at, at += c;
    }
    for (long i = 0; i < n_ids; i++) {
        long row = ids[i] >= 0 && ids[i] < V ? ids[i] : V;
        keys[cnt[row]++] = (row < V ? (ulong)row : 0xffffffffUL) << 32 | (ulong)i;
    }
}

/* The same keys sorted by many groups (large n, where one group's network is slow): an LSD radix sort over
 * the row's bits, RADIX_BITS a pass. The keys start in position order and every pass is stable, so
 * positions stay ascending within a row without sorting their bits. An item owns a chunk of `chunk`
 * consecutive keys; cnt holds RADIX_DIGITS counters per item, digit-major (cnt[d * items + t]), so one
 * exclusive scan of cnt gives every item's first slot for each digit in the order digit, item, position.
 * Rows outside [0, V) (key row 0xffffffff) count as row V, above every table row. */
#define RADIX_BITS 4
#define RADIX_DIGITS 16
#define RADIX_GROUP 256 /* the largest group of the count and scatter kernels (their counters in group memory) */
static uint radix_digit(ulong key, long V, int shift) {
    ulong row = key >> 32;
    return (uint)((row < (ulong)V ? row : (ulong)V) >> shift) & (RADIX_DIGITS - 1);
}
__kernel void k_embedding_keys(PTR(const int, ids), PTR(ulong, keys), long n_ids, long V) {
    BIND(const int, ids); BIND(ulong, keys);
    GRID_STRIDE(i, n_ids) {
        int id = ids[i];
        uint row = id >= 0 && id < V ? (uint)id : 0xffffffffu;
        keys[i] = (ulong)row << 32 | (ulong)i;
    }
}
/* cnt[d * items + t]: how many of item t's keys have digit d */
__kernel void k_embedding_radix_count(PTR(const ulong, keys), PTR(int, cnt), long n_ids, long chunk, long V, int shift) {
    BIND(const ulong, keys); BIND(int, cnt);
    __local int c[RADIX_DIGITS * RADIX_GROUP];
    long l = get_local_id(0), L = get_local_size(0), t = get_global_id(0), T = get_global_size(0);
    for (int d = 0; d < RADIX_DIGITS; d++) c[d * L + l] = 0;
    long end = (t + 1) * chunk < n_ids ? (t + 1) * chunk : n_ids;
    for (long i = t * chunk; i < end; i++) c[radix_digit(keys[i], V, shift) * L + l]++;
    for (int d = 0; d < RADIX_DIGITS; d++) cnt[d * T + t] = c[d * L + l];
}
/* cnt[0, m) replaced by its exclusive prefix sums, by one group (an item a segment, then the segments'
 * totals scanned in group memory) */
__kernel void k_embedding_radix_scan(PTR(int, cnt), long m) {
    BIND(int, cnt);
    __local int part[RADIX_GROUP];
    long l = get_local_id(0), L = get_local_size(0), seg = (m + L - 1) / L;
    long lo = l * seg < m ? l * seg : m, hi = lo + seg < m ? lo + seg : m;
    int sum = 0;
    for (long i = lo; i < hi; i++) sum += cnt[i];
    part[l] = sum;
    for (long off = 1; off < L; off <<= 1) { /* inclusive scan of the totals */
        barrier(CLK_LOCAL_MEM_FENCE);
        int v = l >= off ? part[l - off] : 0;
        barrier(CLK_LOCAL_MEM_FENCE);
        part[l] += v;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    int at = l > 0 ? part[l - 1] : 0;
    for (long i = lo; i < hi; i++) {
        int c = cnt[i];
        cnt[i] = at, at += c;
    }
}
/* each item's keys, in order, to their slots: out[cnt[d * items + t]++] */
__kernel void k_embedding_radix_scatter(PTR(const ulong, keys), PTR(ulong, out), PTR(const int, cnt), long n_ids, long chunk, long V,
                                        int shift) {
    BIND(const ulong, keys); BIND(ulong, out); BIND(const int, cnt);
    __local int c[RADIX_DIGITS * RADIX_GROUP];
    long l = get_local_id(0), L = get_local_size(0), t = get_global_id(0), T = get_global_size(0);
    for (int d = 0; d < RADIX_DIGITS; d++) c[d * L + l] = cnt[d * T + t];
    long end = (t + 1) * chunk < n_ids ? (t + 1) * chunk : n_ids;
    for (long i = t * chunk; i < end; i++) {
        ulong key = keys[i];
        out[c[radix_digit(key, V, shift) * L + l]++] = key;
    }
}

/* A group per run of equal ids in the sorted keys (groups stride over the positions; a run's first
 * position does the run): out[id] += dy[r] for the run's positions r in order, an item a column. */
__kernel void k_embedding_back_rows(PTR(const float, dy), PTR(const ulong, keys), PTR(float, out), long n_ids, long C, long V) {
    BIND(const float, dy); BIND(const ulong, keys); BIND(float, out);
    for (long k = get_group_id(0); k < n_ids; k += get_num_groups(0)) {
        ulong id = keys[k] >> 32;
        if (id >= (ulong)V || (k > 0 && keys[k - 1] >> 32 == id)) continue;
        for (long j = get_local_id(0); j < C; j += get_local_size(0)) {
            float acc = out[(long)id * C + j];
            for (long m = k; m < n_ids && keys[m] >> 32 == id; m++) acc += dy[(long)(uint)keys[m] * C + j];
            out[(long)id * C + j] = acc;
        }
    }
}

/* ---- dropout: the CPU backend's dropout_hash, bit for bit --------------------------------------- */

static uint dropout_hash(uint lo, uint hi, uint counter, ulong i) {
    ulong z = (((ulong)hi << 32) | lo) ^ (0x9E3779B97F4A7C15UL * (ulong)(counter + 1u)) ^ (i * 0xD1B54A32D192ED03UL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9UL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBUL;
    return (uint)((z ^ (z >> 31)) >> 32);
}
__kernel void k_dropout(PTR(const float, x), PTR(float, y), long n, uint threshold, float scale, uint seed_lo,
                        uint seed_hi, uint counter) {
    BIND(const float, x); BIND(float, y);
    GRID_STRIDE(i, n) y[i] = dropout_hash(seed_lo, seed_hi, counter, (ulong)i) >= threshold ? x[i] * scale : 0.0f;
}

/* ---- casts ------------------------------------------------------------------------------------ */

enum { DT_F32 = 0, DT_F16, DT_BF16, DT_I32, DT_I64 };

static ushort f32_to_f16(float f) {
    uint u = as_uint(f);
    uint sign = (u >> 16) & 0x8000u, absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (ushort)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (ushort)(sign | 0x7c00u);
    if (absu < 0x38800000u) {
        if (absu < 0x33000000u) return (ushort)sign;
        uint mant = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23); /* value = mant * 2^(e-150), f16 unit = 2^-24 */
        uint hv = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (hv & 1))) hv++;
        return (ushort)(sign | hv);
    }
    uint h = ((absu >> 13) - (112u << 10)), rem = absu & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
    return (ushort)(sign | h);
}
static float f16_to_f32(ushort h) {
    uint sign = (uint)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
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
static ushort f32_to_bf16(float f) {
    uint u = as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}

static void cast_one(__global const void *src, __global void *dst, long i, int sdt, int ddt) {
    if ((sdt == DT_I32 || sdt == DT_I64) && (ddt == DT_I32 || ddt == DT_I64)) {
        long v = sdt == DT_I32 ? (long)((__global const int *)src)[i] : ((__global const long *)src)[i];
        if (ddt == DT_I32) ((__global int *)dst)[i] = (int)v;
        else ((__global long *)dst)[i] = v;
        return;
    }
    float v;
    switch (sdt) {
    case DT_F32: v = ((__global const float *)src)[i]; break;
    case DT_F16: v = f16_to_f32(((__global const ushort *)src)[i]); break;
    case DT_BF16: v = as_float((uint)((__global const ushort *)src)[i] << 16); break;
    case DT_I32: v = (float)((__global const int *)src)[i]; break;
    default: v = (float)((__global const long *)src)[i]; break;
    }
    switch (ddt) {
    case DT_F32: ((__global float *)dst)[i] = v; break;
    case DT_F16: ((__global ushort *)dst)[i] = f32_to_f16(v); break;
    case DT_BF16: ((__global ushort *)dst)[i] = f32_to_bf16(v); break;
    case DT_I32: ((__global int *)dst)[i] = (int)v; break;
    default: ((__global long *)dst)[i] = (long)v; break;
    }
}

__kernel void k_cast(PTR(const void, src), PTR(void, dst), long n, int sdt, int ddt) {
    BIND(const void, src); BIND(void, dst);
    GRID_STRIDE(i, n) cast_one(src, dst, i, sdt, ddt);
}

/* ---- optimizers ------------------------------------------------------------------------------- */

/* A squared norm that is not finite (a NaN or an overflow in some gradient) makes an update a no-op:
 * parameter, state and gradient stay as they are, and the host, reading the norm once after the
 * step's work, reports it (or, under loss scaling, skips the step) without a wait before the update. */
static bool update_skipped(__global const float *gnorm_sq) { return gnorm_sq && !isfinite(gnorm_sq[0]); }

static float clip_factor(__global const float *gnorm_sq, float clip) {
    if (!gnorm_sq || clip <= 0.0f) return 1.0f;
    float nrm = sqrt(gnorm_sq[0]);
    return nrm > clip ? clip / (nrm + 1e-6f) : 1.0f;
}

/* The parameter's bf16/f16 copy (sdt; 0: none) of its new value: the rounding its cast would make. */
static void store_shadow(__global void *sh, long i, float v, int sdt) {
    if (sdt == DT_BF16) ((__global ushort *)sh)[i] = f32_to_bf16(v);
    else if (sdt == DT_F16) ((__global ushort *)sh)[i] = f32_to_f16(v);
}

__kernel void k_sgd(PTR(float, p), PTR(float, g), PTR(float, mom), PTR(const float, gnorm_sq), long n, float lr,
                    float momentum, float wd, float clip, float gscale, PTR(void, sh), int sdt) {
    BIND(float, p); BIND(float, g); BIND(float, mom); BIND(const float, gnorm_sq); BIND(void, sh);
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
static void adamw_element(__global float *p, __global float *g, __global float *m, __global float *v, float f, float lr,
                          float b1, float b2, float eps, float wd, float bc1, float bc2) {
    float gi = *g * f;
    float mi = b1 * *m + (1.0f - b1) * gi;
    float vi = b2 * *v + (1.0f - b2) * gi * gi;
    *m = mi;
    *v = vi;
    float mh = mi / bc1, vh = vi / bc2;
    *p -= lr * (mh / (sqrt(vh) + eps) + wd * *p);
    *g = 0.0f;
}

__kernel void k_adamw(PTR(float, p), PTR(float, g), PTR(float, m), PTR(float, v), PTR(const float, gnorm_sq), long n,
                      float lr, float b1, float b2, float eps, float wd, float clip, float gscale, float bc1,
                      float bc2, PTR(void, sh), int sdt) {
    BIND(float, p); BIND(float, g); BIND(float, m); BIND(float, v); BIND(const float, gnorm_sq); BIND(void, sh);
    if (update_skipped(gnorm_sq)) return;
    float f = gscale * clip_factor(gnorm_sq, clip);
    GRID_STRIDE(i, n) {
        adamw_element(p + i, g + i, m + i, v + i, f, lr, b1, b2, eps, wd, bc1, bc2);
        if (sdt) store_shadow(sh, i, p[i], sdt);
    }
}

/* ---- GEMM: 64x64 tiles, 256 items each computing 4x4 outputs (see cuda_kernels.cu's k_gemm) ---- */

#define GT 64
#define GK 16
/* One 64x64 tile of C = op(A) op(B), its corner at (m0, n0): op(A)(m,k) = ta ? A[k*M+m] : A[m*K+k], op(B)(k,n)
 * = tb ? B[n*K+k] : B[k*N+n]; As and Bs the group's local tiles. k_gemm's and the grouped GEMM's block. */
static void gemm_tile(__global const float *Ab, __global const float *Bb, __global float *Cb, int M, int N, int K, int ta, int tb,
                      int m0, int n0, __local float (*As)[GT + 4], __local float (*Bs)[GT + 4]) {
    int lid = get_local_id(0), tx = lid & 15, ty = lid >> 4;
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += GK) {
        for (int l = 0; l < 4; l++) {
            int e = lid + l * 256, kk, mm, nn;
            if (ta) { mm = e & 63; kk = e >> 6; }
            else { kk = e & 15; mm = e >> 4; }
            int gm = m0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? (ta ? Ab[(long)gk * M + gm] : Ab[(long)gm * K + gk]) : 0.0f;
            if (tb) { kk = e & 15; nn = e >> 4; }
            else { nn = e & 63; kk = e >> 6; }
            int gn = n0 + nn;
            gk = k0 + kk;
            Bs[kk][nn] = (gn < N && gk < K) ? (tb ? Bb[(long)gn * K + gk] : Bb[(long)gk * N + gn]) : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < GK; kk++) {
            float a[4], b[4];
            for (int i = 0; i < 4; i++) a[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < 4; i++) {
        int gm = m0 + ty + 16 * i;
        if (gm >= M) continue;
        for (int j = 0; j < 4; j++) {
            int gn = n0 + tx + 16 * j;
            if (gn < N) Cb[(long)gm * N + gn] = acc[i][j];
        }
    }
}

__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void
k_gemm(PTR(const float, A), PTR(const float, B), PTR(float, Cm), int M, int N, int K, int ta, int tb, long sA, long sB,
       long sC) {
    BIND(const float, A); BIND(const float, B); BIND(float, Cm);
    __local float As[GK][GT + 4];
    __local float Bs[GK][GT + 4];
    gemm_tile(A + (long)get_group_id(2) * sA, B + (long)get_group_id(2) * sB, Cm + (long)get_group_id(2) * sC, M, N, K, ta, tb,
              get_group_id(1) * GT, get_group_id(0) * GT, As, Bs);
}

/* ---- fused causal attention ------------------------------------------------------------------- */

/* q, k, v [BH, T, D] (D <= PGD_ATT_DMAX, which backends/gpu_dispatch.h checks); an item per row.
 * Layouts (H, the last argument of every attention kernel): H = 0: q, k, v [BH, T, D] apart, y [BH, T,
 * D + 1] (the logsumexp in column D), the backward's out [3, BH, T, D]; H > 0, packed (pdde_attention_qkv):
 * q, k, v rows of qkv [B, T, H*3*D] (k, v passed D, 2D past q), y [B, T, H*D] followed by the logsumexp
 * [BH, T], out in qkv's layout. Row r = bh * T + t; these give each row's element offset. */
#define PGD_ATT_DMAX 128
static long att_in(long r, long T, long D, long H) {
    if (!H) return r * D;
    long t = r % T, bh = r / T;
    return ((bh / H) * T + t) * 3 * H * D + (bh % H) * 3 * D;
}
static long att_y(long r, long T, long D, long H) {
    if (!H) return r * (D + 1);
    long t = r % T, bh = r / T;
    return ((bh / H) * T + t) * H * D + (bh % H) * D;
}
static long att_lse(long r, long rows, long T, long D, long H) { return H ? rows * D + r : r * (D + 1) + D; }
static long att_out(long r, int which, long rows, long T, long D, long H) {
    return H ? att_in(r, T, D, H) + which * D : which * rows * D + r * D;
}
/* The first key row r sees (pdde_attention_docs): starts [B, T] at its batch row b = bh / heads (heads: the node's
 * heads in either layout) and query t, clamped to [0, t]; 0 without starts (NULL: plain causal attention) */
static long att_lo(__global const int *starts, long r, long T, long heads) {
    if (!starts) return 0;
    long t = r % T, s = starts[(r / T / heads) * T + t];
    return s < 0 ? 0 : s > t ? t : s;
}

/* Forward: row r's output and logsumexp into y [BH, T, D + 1], one key at a time with an online
 * softmax (the running sum and output are rescaled when the running max grows). */
__kernel void k_attention(PTR(const float, q), PTR(const float, k), PTR(const float, v), PTR(float, y), long BH, long T,
                          long D, float scale, long H, PTR(const int, starts), long heads) {
    BIND(const float, q); BIND(const float, k); BIND(const float, v); BIND(float, y); BIND(const int, starts);
    GRID_STRIDE(r, BH * T) {
        long i = r % T;
        float qr[PGD_ATT_DMAX], acc[PGD_ATT_DMAX];
        for (long d = 0; d < D; d++) qr[d] = q[att_in(r, T, D, H) + d], acc[d] = 0.0f;
        float m = -INFINITY, l = 0.0f;
        for (long j = att_lo(starts, r, T, heads); j <= i; j++) {
            __global const float *kj = k + att_in(r - i + j, T, D, H), *vj = v + att_in(r - i + j, T, D, H);
            float s = 0.0f;
            for (long d = 0; d < D; d++) s += qr[d] * kj[d];
            s *= scale;
            if (s > m) {
                float a = exp(m - s);
                l *= a;
                for (long d = 0; d < D; d++) acc[d] *= a;
                m = s;
            }
            float p = exp(s - m);
            l += p;
            for (long d = 0; d < D; d++) acc[d] += p * vj[d];
        }
        __global float *yr = y + att_y(r, T, D, H);
        for (long d = 0; d < D; d++) yr[d] = acc[d] / l;
        y[att_lse(r, BH * T, T, D, H)] = m + log(l);
    }
}

/* Backward, dq of query row r (out[0 .. BH*T*D)): dq = scale * sum_j p_ij (dp_ij - rowdot_i) k_j with
 * p recomputed from the saved logsumexp; rowdot_i = dO_i . O_i is left in rowdot for the dk, dv kernel. */
__kernel void k_attention_back_q(PTR(const float, q), PTR(const float, k), PTR(const float, v), PTR(const float, y),
                                 PTR(const float, dy), PTR(float, rowdot), PTR(float, out), long BH, long T, long D,
                                 float scale, long H, PTR(const int, starts), long heads) {
    BIND(const float, q); BIND(const float, k); BIND(const float, v); BIND(const float, y); BIND(const float, dy);
    BIND(float, rowdot); BIND(float, out); BIND(const int, starts);
    GRID_STRIDE(r, BH * T) {
        long i = r % T, yo = att_y(r, T, D, H);
        float qr[PGD_ATT_DMAX], dor[PGD_ATT_DMAX], dq[PGD_ATT_DMAX];
        float dot = 0.0f;
        for (long d = 0; d < D; d++) {
            qr[d] = q[att_in(r, T, D, H) + d], dor[d] = dy[yo + d], dq[d] = 0.0f;
            dot += dor[d] * y[yo + d];
        }
        rowdot[r] = dot;
        float lse = y[att_lse(r, BH * T, T, D, H)];
        for (long j = att_lo(starts, r, T, heads); j <= i; j++) {
            __global const float *kj = k + att_in(r - i + j, T, D, H), *vj = v + att_in(r - i + j, T, D, H);
            float s = 0.0f, dp = 0.0f;
            for (long d = 0; d < D; d++) s += qr[d] * kj[d], dp += dor[d] * vj[d];
            float ds = exp(s * scale - lse) * (dp - dot);
            for (long d = 0; d < D; d++) dq[d] += ds * kj[d];
        }
        for (long d = 0; d < D; d++) out[att_out(r, 0, BH * T, T, D, H) + d] = scale * dq[d];
    }
}

/* Backward, dk and dv of key row r (out[BH*T*D ..), out[2*BH*T*D ..)): sums over the queries i >= j
 * that see it (and whose first key is at most j); needs k_attention_back_q's rowdot. */
__kernel void k_attention_back_kv(PTR(const float, q), PTR(const float, k), PTR(const float, v), PTR(const float, y),
                                  PTR(const float, dy), PTR(float, rowdot), PTR(float, out), long BH, long T, long D,
                                  float scale, long H, PTR(const int, starts), long heads) {
    BIND(const float, q); BIND(const float, k); BIND(const float, v); BIND(const float, y); BIND(const float, dy);
    BIND(float, rowdot); BIND(float, out); BIND(const int, starts);
    GRID_STRIDE(r, BH * T) {
        long j = r % T, rows = BH * T, ko = att_in(r, T, D, H);
        float kr[PGD_ATT_DMAX], vr[PGD_ATT_DMAX], dk[PGD_ATT_DMAX], dv[PGD_ATT_DMAX];
        for (long d = 0; d < D; d++) kr[d] = k[ko + d], vr[d] = v[ko + d], dk[d] = 0.0f, dv[d] = 0.0f;
        for (long ri = r; ri < r - j + T; ri++) {
            if (att_lo(starts, ri, T, heads) > j) continue;
            __global const float *qi = q + att_in(ri, T, D, H), *doi = dy + att_y(ri, T, D, H);
            float s = 0.0f, dp = 0.0f;
            for (long d = 0; d < D; d++) s += qi[d] * kr[d], dp += doi[d] * vr[d];
            float p = exp(s * scale - y[att_lse(ri, rows, T, D, H)]), ds = p * (dp - rowdot[ri]);
            for (long d = 0; d < D; d++) dv[d] += p * doi[d], dk[d] += ds * qi[d];
        }
        for (long d = 0; d < D; d++) out[att_out(r, 1, rows, T, D, H) + d] = scale * dk[d], out[att_out(r, 2, rows, T, D, H) + d] = dv[d];
    }
}

/* ---- multi-tensor AdamW: up to MULTI_MAX tensors in one launch ------------------------------------ */

/* Mirrors pgd_multi (backends/gpu_dispatch.h): tensor k's element count, and the element offsets of
 * its parameter, gradient and moments from their buffer's start (and of its bf16/f16 copy, in 2-byte
 * elements; -1: none), with its weight decay. */
#define MULTI_MAX 16
typedef struct {
    long n[MULTI_MAX], p[MULTI_MAX], g[MULTI_MAX], m[MULTI_MAX], v[MULTI_MAX], s[MULTI_MAX];
    float wd[MULTI_MAX];
} pgd_multi;

/* Tensor k = group row k (get_group_id(1)); gradients in gbase, the rest in base. */
__kernel void k_adamw_multi(PTR(float, base), PTR(float, gbase), PTR(const float, gnorm_sq), pgd_multi t, float lr,
                            float b1, float b2, float eps, float clip, float gscale, float bc1, float bc2, int sdt) {
    BIND(float, base); BIND(float, gbase); BIND(const float, gnorm_sq);
    if (update_skipped(gnorm_sq)) return;
    int k = get_group_id(1);
    float f = gscale * clip_factor(gnorm_sq, clip);
    __global float *p = base + t.p[k], *g = gbase + t.g[k], *m = base + t.m[k], *v = base + t.v[k];
    __global ushort *sh = (__global ushort *)base + (t.s[k] >= 0 ? t.s[k] : 0);
    int sk = t.s[k] >= 0 ? sdt : 0; /* (-1: no copy) */
    GRID_STRIDE(i, t.n[k]) {
        adamw_element(p + i, g + i, m + i, v + i, f, lr, b1, b2, eps, t.wd[k], bc1, bc2);
        if (sk) store_shadow(sh, i, p[i], sk);
    }
}

/* Multi-tensor AdamW in chunks (cuda_mem.cuh's k_adamw_chunks): group b takes chunk b - (the chunks of the tensors
 * before k) of tensor k, ADAMW_CHUNK elements; the arithmetic is adamw_element's. */
#define ADAMW_CHUNK 4096
__kernel void k_adamw_chunks(PTR(float, base), PTR(float, gbase), PTR(const float, gnorm_sq), pgd_multi t, int count, float lr,
                             float b1, float b2, float eps, float clip, float gscale, float bc1, float bc2, int sdt) {
    BIND(float, base); BIND(float, gbase); BIND(const float, gnorm_sq);
    if (update_skipped(gnorm_sq)) return;
    long c = get_group_id(0), first = 0;
    int k = 0;
    for (; k < count; k++) {
        long nc = (t.n[k] + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
        if (c < first + nc) break;
        first += nc;
    }
    if (k == count) return;
    float f = gscale * clip_factor(gnorm_sq, clip);
    __global float *p = base + t.p[k], *g = gbase + t.g[k], *m = base + t.m[k], *v = base + t.v[k];
    __global ushort *sh = (__global ushort *)base + (t.s[k] >= 0 ? t.s[k] : 0);
    int sk = t.s[k] >= 0 ? sdt : 0; /* (-1: no copy) */
    long i0 = (c - first) * ADAMW_CHUNK, i1 = i0 + ADAMW_CHUNK < t.n[k] ? i0 + ADAMW_CHUNK : t.n[k];
    for (long i = i0 + get_local_id(0); i < i1; i += get_local_size(0)) {
        adamw_element(p + i, g + i, m + i, v + i, f, lr, b1, b2, eps, t.wd[k], bc1, bc2);
        if (sk) store_shadow(sh, i, p[i], sk);
    }
}

/* ---- fused kernels ---------------------------------------------------------------------------- */

/* bias_gelu (back = 0): y = gelu(x + bias[i % nb]); its backward (back = 1): y = dy * gelu'(x + bias) */
__kernel void k_bias_gelu(PTR(const float, x), PTR(const float, bias), PTR(const float, dy), PTR(void, y), long n,
                          long nb, int back, int ydt) {
    BIND(const float, x); BIND(const float, bias); BIND(const float, dy); BIND(void, y);
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
__kernel void k_att_softmax(PTR(const float, s), PTR(void, p), PTR(float, lse), long rows, long T, float scale, long ls,
                            int from_lse, int pdt, PTR(const int, starts), long r0, long heads) {
    BIND(const float, s); BIND(void, p); BIND(float, lse); BIND(const int, starts);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *sr = s + r * T;
        long lim = r % T + 1, lo = att_lo(starts, r0 + r, T, heads);
        float m, inv = 1.0f;
        if (from_lse) {
            m = lse[r * ls];
        } else {
            m = -INFINITY;
            COLS_LOOP(j, lim) if (j >= lo) m = fmax(m, scale * sr[j]);
            m = group_max(m, sh);
            float z = 0.0f;
            COLS_LOOP(j, lim) if (j >= lo) z += exp(scale * sr[j] - m);
            z = group_sum(z, sh);
            inv = 1.0f / z;
            if (get_local_id(0) == 0) lse[r * ls] = m + log(z);
        }
        COLS_LOOP(j, T) {
            float v = j < lim && j >= lo ? exp(scale * sr[j] - m) * inv : 0.0f;
            if (pdt == DT_BF16) ((__global ushort *)p)[r * T + j] = f32_to_bf16(v);
            else ((__global float *)p)[r * T + j] = v;
        }
    }
}

/* dS = scale * P (dP - rowsum(P dP)) with P = exp(scale * S - lse) recomputed, over the keys each row sees
 * (k_att_softmax's; 0 elsewhere), as f32 or bf16 (dsdt). The row sum is taken over the same dP (rather than dO . O),
 * so that it cancels exactly where it should (one key: dS = 0) whatever the GEMMs rounded. */
__kernel void k_att_dsoftmax(PTR(const float, s), PTR(const float, dp), PTR(const float, lse), PTR(void, ds), long rows,
                             long T, float scale, long ls, int dsdt, PTR(const int, starts), long r0, long heads) {
    BIND(const float, s); BIND(const float, dp); BIND(const float, lse); BIND(void, ds); BIND(const int, starts);
    __local float sh[MAX_GROUP];
    ROWS_LOOP(r, rows) {
        __global const float *sr = s + r * T, *dr = dp + r * T;
        long lim = r % T + 1, lo = att_lo(starts, r0 + r, T, heads);
        float m = lse[r * ls], t = 0.0f;
        COLS_LOOP(j, lim) if (j >= lo) t += exp(scale * sr[j] - m) * dr[j];
        t = group_sum(t, sh);
        COLS_LOOP(j, T) {
            float v = j < lim && j >= lo ? scale * (exp(scale * sr[j] - m) * (dr[j] - t)) : 0.0f;
            if (dsdt == DT_BF16) ((__global ushort *)ds)[r * T + j] = f32_to_bf16(v);
            else ((__global float *)ds)[r * T + j] = v;
        }
    }
}

/* Rows [r0, r0 + n) of a packed attention's tensor (which 0, 1, 2: q, k, v of qkv or dq, dk, dv of its
 * gradient; -1: y or dy) to a [n, D] block (to_flat) or back; elements of esz bytes (2 or 4). */
__kernel void k_att_repack(PTR(void, packed), PTR(void, flat), long r0, long n, long T, long D, long H, int which, int esz,
                           int to_flat) {
    BIND(void, packed); BIND(void, flat);
    GRID_STRIDE(e, n * D) {
        long r = r0 + e / D, d = e % D, po = (which < 0 ? att_y(r, T, D, H) : att_in(r, T, D, H) + which * D) + d;
        if (esz == 2 && to_flat) ((__global ushort *)flat)[e] = ((__global const ushort *)packed)[po];
        else if (esz == 2) ((__global ushort *)packed)[po] = ((__global const ushort *)flat)[e];
        else if (to_flat) ((__global float *)flat)[e] = ((__global const float *)packed)[po];
        else ((__global float *)packed)[po] = ((__global const float *)flat)[e];
    }
}

/* ---- tiled causal attention (FlashAttention-2's schedule; backends/gpu_dispatch.h, pgd_attention_flash) --
 * A group of FR items takes FR query rows (forward, dq) or key rows (dk, dv) of one head, an item a row;
 * the other side's rows come through group memory FK at a time. q, k, v are bf16 (bf16 = 1) or f32,
 * read as they are; everything else is f32. Group g takes head g / tiles and, from the last, tile
 * tiles - 1 - g % tiles (the heavy causal tiles first). With starts (att_lo) each pair is masked, and the tiles
 * no row of the group sees are skipped: key tiles before the group's least first key (forward, dq), query tiles
 * whose first keys all lie past the group's keys (dk, dv). */
#define FR 64 /* rows a group: pgd_ctx.flash_rows and flash_threads of the OpenCL backend */
#define FK 16 /* rows a tile in group memory */

static float ld_qkv(__global const void *p, long i, int bf16) {
    return bf16 ? as_float((uint)((__global const ushort *)p)[i] << 16) : ((__global const float *)p)[i];
}

/* Keys and values j0 .. j0 + FK - 1 of the head whose rows start at base (zeros past T) into group
 * memory, the group's items sharing the loads; between barriers: every item is done with the tile before. */
static void flash_load_kv(__global const void *k, __global const void *v, long base, long j0, long T, long D, long H, int bf16,
                          __local float (*ks)[PGD_ATT_DMAX], __local float (*vs)[PGD_ATT_DMAX]) {
    barrier(CLK_LOCAL_MEM_FENCE);
    for (long e = get_local_id(0); e < FK * D; e += FR) {
        long jj = e / D, d = e % D, j = j0 + jj;
        ks[jj][d] = j < T ? ld_qkv(k, att_in(base + j, T, D, H) + d, bf16) : 0.0f;
        vs[jj][d] = j < T ? ld_qkv(v, att_in(base + j, T, D, H) + d, bf16) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
}

/* This item's query row i's first key (att_lo; 0 past T), and the first key tile (a multiple of FK) any row of the
 * group [i - l, i - l + FR) sees, through group memory los[FR] */
static long flash_first_tile(__global const int *starts, long base, long i, long T, long heads, __local long *los, long *lo) {
    *lo = i < T ? att_lo(starts, base + i, T, heads) : 0;
    if (!starts) return 0;
    barrier(CLK_LOCAL_MEM_FENCE);
    los[get_local_id(0)] = i < T ? *lo : T;
    barrier(CLK_LOCAL_MEM_FENCE);
    long least = T;
    for (int r = 0; r < FR; r++) least = min(least, los[r]);
    return least / FK * FK;
}

static void flash_fwd(__global const void *q, __global const void *k, __global const void *v, __global float *y, long BH,
                      long T, long D, float scale, int bf16, long H, __global const int *starts, long heads,
                      __local float (*ks)[PGD_ATT_DMAX], __local float (*vs)[PGD_ATT_DMAX], __local long *los) {
    long tiles = (T + FR - 1) / FR, grp = get_group_id(0), bh = grp / tiles, tile = tiles - 1 - grp % tiles, base = bh * T;
    int l = get_local_id(0);
    long i = tile * FR + l, kend = min(T, tile * FR + FR), lo;
    int live = i < T;
    float qr[PGD_ATT_DMAX], acc[PGD_ATT_DMAX];
    for (long d = 0; d < D; d++) qr[d] = live ? ld_qkv(q, att_in(base + i, T, D, H) + d, bf16) : 0.0f, acc[d] = 0.0f;
    float m = -INFINITY, lsum = 0.0f;
    for (long j0 = flash_first_tile(starts, base, i, T, heads, los, &lo); j0 < kend; j0 += FK) {
        flash_load_kv(k, v, base, j0, T, D, H, bf16, ks, vs);
        for (long jj = j0 < lo ? lo - j0 : 0; live && jj < FK && j0 + jj <= i; jj++) {
            float s = 0.0f;
            for (long d = 0; d < D; d++) s += qr[d] * ks[jj][d];
            s *= scale;
            if (s > m) { /* online softmax: rescale what was summed under the smaller maximum */
                float a = exp(m - s);
                lsum *= a;
                for (long d = 0; d < D; d++) acc[d] *= a;
                m = s;
            }
            float p = exp(s - m);
            lsum += p;
            for (long d = 0; d < D; d++) acc[d] += p * vs[jj][d];
        }
    }
    if (!live) return;
    __global float *yr = y + att_y(base + i, T, D, H);
    for (long d = 0; d < D; d++) yr[d] = acc[d] / lsum;
    y[att_lse(base + i, BH * T, T, D, H)] = m + log(lsum);
}

/* rowdot[r] = dO_r . O_r (y and dy: the output columns of row r) */
__kernel void k_flash_rowdot(PTR(const float, y), PTR(const float, dy), PTR(float, rowdot), long rows, long D, long T, long H) {
    BIND(const float, y); BIND(const float, dy); BIND(float, rowdot);
    GRID_STRIDE(r, rows) {
        float dot = 0.0f;
        long o = att_y(r, T, D, H);
        for (long d = 0; d < D; d++) dot += dy[o + d] * y[o + d];
        rowdot[r] = dot;
    }
}

/* dq of the group's query rows (out[0 .. BH*T*D)): scale * sum over keys lo <= j <= i of p (dp - rowdot) k_j,
 * p recomputed from the saved logsumexp, the keys' k and v rows through group memory. */
static void flash_dq(__global const void *q, __global const void *k, __global const void *v, __global const float *y,
                     __global const float *dy, __global const float *rowdot, __global float *out, long BH, long T, long D,
                     float scale, int bf16, long H, __global const int *starts, long heads, __local float (*ks)[PGD_ATT_DMAX],
                     __local float (*vs)[PGD_ATT_DMAX], __local long *los) {
    long tiles = (T + FR - 1) / FR, grp = get_group_id(0), bh = grp / tiles, tile = tiles - 1 - grp % tiles, base = bh * T;
    int l = get_local_id(0);
    long i = tile * FR + l, kend = min(T, tile * FR + FR), yo = att_y(base + i, T, D, H), lo;
    int live = i < T;
    float qr[PGD_ATT_DMAX], dor[PGD_ATT_DMAX], dq[PGD_ATT_DMAX];
    for (long d = 0; d < D; d++) {
        qr[d] = live ? ld_qkv(q, att_in(base + i, T, D, H) + d, bf16) : 0.0f;
        dor[d] = live ? dy[yo + d] : 0.0f;
        dq[d] = 0.0f;
    }
    float lse = live ? y[att_lse(base + i, BH * T, T, D, H)] : 0.0f, dot = live ? rowdot[base + i] : 0.0f;
    for (long j0 = flash_first_tile(starts, base, i, T, heads, los, &lo); j0 < kend; j0 += FK) {
        flash_load_kv(k, v, base, j0, T, D, H, bf16, ks, vs);
        for (long jj = j0 < lo ? lo - j0 : 0; live && jj < FK && j0 + jj <= i; jj++) {
            float s = 0.0f, dp = 0.0f;
            for (long d = 0; d < D; d++) s += qr[d] * ks[jj][d], dp += dor[d] * vs[jj][d];
            float ds = exp(s * scale - lse) * (dp - dot);
            for (long d = 0; d < D; d++) dq[d] += ds * ks[jj][d];
        }
    }
    if (!live) return;
    for (long d = 0; d < D; d++) out[att_out(base + i, 0, BH * T, T, D, H) + d] = scale * dq[d];
}

/* dk, dv of the group's key rows (out[BH*T*D ..), out[2*BH*T*D ..)): sums over the queries i >= j whose first
 * key is at most j, their q and dO rows, logsumexp, rowdot and first key through group memory. */
static void flash_dkv(__global const void *q, __global const void *k, __global const void *v, __global const float *y,
                      __global const float *dy, __global const float *rowdot, __global float *out, long BH, long T, long D,
                      float scale, int bf16, long H, __global const int *starts, long heads, __local float (*qs)[PGD_ATT_DMAX],
                      __local float (*dos)[PGD_ATT_DMAX], __local float *lses, __local float *dots, __local long *los) {
    long tiles = (T + FR - 1) / FR, grp = get_group_id(0), bh = grp / tiles, tile = tiles - 1 - grp % tiles, base = bh * T;
    int l = get_local_id(0);
    long j = tile * FR + l, rows = BH * T, jlast = min(T, tile * FR + FR) - 1;
    int live = j < T;
    float kr[PGD_ATT_DMAX], vr[PGD_ATT_DMAX], dk[PGD_ATT_DMAX], dv[PGD_ATT_DMAX];
    for (long d = 0; d < D; d++) {
        kr[d] = live ? ld_qkv(k, att_in(base + j, T, D, H) + d, bf16) : 0.0f;
        vr[d] = live ? ld_qkv(v, att_in(base + j, T, D, H) + d, bf16) : 0.0f;
        dk[d] = 0.0f, dv[d] = 0.0f;
    }
    for (long i0 = tile * FR; i0 < T; i0 += FK) {
        barrier(CLK_LOCAL_MEM_FENCE);
        if (starts) { /* (the tile's first keys before its rows: a tile none of whose queries sees the group's keys is skipped) */
            if (l < FK) los[l] = i0 + l < T ? att_lo(starts, base + i0 + l, T, heads) : T;
            barrier(CLK_LOCAL_MEM_FENCE);
            long least = T;
            for (int ii = 0; ii < FK; ii++) least = min(least, los[ii]);
            if (least > jlast) continue; /* (the same in every item) */
        }
        for (long e = l; e < FK * D; e += FR) {
            long ii = e / D, d = e % D, i = i0 + ii;
            qs[ii][d] = i < T ? ld_qkv(q, att_in(base + i, T, D, H) + d, bf16) : 0.0f;
            dos[ii][d] = i < T ? dy[att_y(base + i, T, D, H) + d] : 0.0f;
        }
        if (l < FK) {
            long i = i0 + l;
            lses[l] = i < T ? y[att_lse(base + i, rows, T, D, H)] : 0.0f;
            dots[l] = i < T ? rowdot[base + i] : 0.0f;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (long ii = 0; live && ii < FK && i0 + ii < T; ii++) {
            if (i0 + ii < j || (starts && los[ii] > j)) continue; /* query i sees keys lo <= j <= i only */
            float s = 0.0f, dp = 0.0f;
            for (long d = 0; d < D; d++) s += qs[ii][d] * kr[d], dp += dos[ii][d] * vr[d];
            float p = exp(s * scale - lses[ii]), ds = p * (dp - dots[ii]);
            for (long d = 0; d < D; d++) dv[d] += p * dos[ii][d], dk[d] += ds * qs[ii][d];
        }
    }
    if (!live) return;
    for (long d = 0; d < D; d++)
        out[att_out(base + j, 1, rows, T, D, H) + d] = scale * dk[d], out[att_out(base + j, 2, rows, T, D, H) + d] = dv[d];
}

/* The kernels, one name per head size (64: k_flash_*, 128: k_flash_*_d128), as the CUDA backend has them;
 * here both take D as it comes: each kernel below is made under both names. */
#define FLASH_FWD_KERNEL(name)                                                                                             \
    __kernel __attribute__((reqd_work_group_size(FR, 1, 1))) void                                                          \
    name(PTR(const void, q), PTR(const void, k), PTR(const void, v), PTR(float, y), long BH, long T, long D, float scale,  \
         int bf16, long H, PTR(const int, starts), long heads) {                                                            \
        BIND(const void, q); BIND(const void, k); BIND(const void, v); BIND(float, y); BIND(const int, starts);              \
        __local float ks[FK][PGD_ATT_DMAX], vs[FK][PGD_ATT_DMAX];                                                           \
        __local long los[FR];                                                                                               \
        flash_fwd(q, k, v, y, BH, T, D, scale, bf16, H, starts, heads, ks, vs, los);                                        \
    }
FLASH_FWD_KERNEL(k_flash_fwd)
FLASH_FWD_KERNEL(k_flash_fwd_d128)

/* (the two backward kernels' arguments) */
#define FLASH_BACK_PARAMS                                                                                                  \
    PTR(const void, q), PTR(const void, k), PTR(const void, v), PTR(const float, y), PTR(const float, dy),                 \
        PTR(const float, rowdot), PTR(float, out), long BH, long T, long D, float scale, int bf16, long H,                 \
        PTR(const int, starts), long heads
#define FLASH_BACK_BIND                                                                                                    \
    BIND(const void, q); BIND(const void, k); BIND(const void, v); BIND(const float, y); BIND(const float, dy);            \
    BIND(const float, rowdot); BIND(float, out); BIND(const int, starts)

#define FLASH_BACK_DQ_KERNEL(name)                                                                                         \
    __kernel __attribute__((reqd_work_group_size(FR, 1, 1))) void name(FLASH_BACK_PARAMS) {                                \
        FLASH_BACK_BIND;                                                                                                   \
        __local float ks[FK][PGD_ATT_DMAX], vs[FK][PGD_ATT_DMAX];                                                          \
        __local long los[FR];                                                                                              \
        flash_dq(q, k, v, y, dy, rowdot, out, BH, T, D, scale, bf16, H, starts, heads, ks, vs, los);                       \
    }
FLASH_BACK_DQ_KERNEL(k_flash_back_dq)
FLASH_BACK_DQ_KERNEL(k_flash_back_dq_d128)

#define FLASH_BACK_DKV_KERNEL(name)                                                                                        \
    __kernel __attribute__((reqd_work_group_size(FR, 1, 1))) void name(FLASH_BACK_PARAMS) {                                \
        FLASH_BACK_BIND;                                                                                                   \
        __local float qs[FK][PGD_ATT_DMAX], dos[FK][PGD_ATT_DMAX], lses[FK], dots[FK];                                     \
        __local long los[FK];                                                                                              \
        flash_dkv(q, k, v, y, dy, rowdot, out, BH, T, D, scale, bf16, H, starts, heads, qs, dos, lses, dots, los);         \
    }
FLASH_BACK_DKV_KERNEL(k_flash_back_dkv)
FLASH_BACK_DKV_KERNEL(k_flash_back_dkv_d128)

/* ---- Mixture-of-Experts (backends/gpu_moe.h; mirrored in cuda_kernels.cu) ----------------------------
 * The expert-ordered buffer as backends/cpu_moe.c lays it out: choice (n, j) of token n, expert
 * e = idx[n, j], lands on row off[e] + its rank among e's choices in (n, j) order; off[e] is the sum of
 * the counts before e (cap 0: dropless) or e * cap, and a choice ranked past cap is dropped (row -1).
 * Expert ids outside [0, E) are routed nowhere (row -1). */

/* One group: counts[E] (optional) = tokens per expert; rows[E] = those kept (at most cap); off[E]; and,
 * when row is not null, row[nk]. Each item owns experts lid, lid + L, ... and scans the ids in order,
 * which keeps each expert's rows in token order without sorting. */
__kernel void k_moe_layout(PTR(const int, idx), PTR(int, counts), PTR(int, off), PTR(int, rows), PTR(int, row), long nk,
                           int E, int cap, long R) {
    BIND(const int, idx); BIND(int, counts); BIND(int, off); BIND(int, rows); BIND(int, row);
    int lid = get_local_id(0), L = get_local_size(0);
    for (int e = lid; e < E; e += L) {
        int c = 0;
        for (long i = 0; i < nk; i++) c += idx[i] == e;
        if (counts) counts[e] = c;
        rows[e] = cap > 0 && c > cap ? cap : c;
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    if (lid == 0) {
        long total = 0;
        for (int e = 0; e < E; e++) {
            off[e] = cap > 0 ? e * cap : (int)total;
            total += rows[e];
        }
    }
    barrier(CLK_GLOBAL_MEM_FENCE);
    if (!row) return;
    for (long i = lid; i < nk; i += L)
        if (idx[i] < 0 || idx[i] >= E) row[i] = -1;
    for (int e = lid; e < E; e += L) {
        int r = 0, o = off[e], n = rows[e];
        for (long i = 0; i < nk; i++)
            if (idx[i] == e) {
                row[i] = r < n && o + r < R ? o + r : -1;
                r++;
            }
    }
}

/* The softmax of a row's logits as its max m and sum z (cpu_moe.c's moe_scores) */
static void moe_softmax_mz(__global const float *l, int E, float *m, float *z) {
    float mm = -INFINITY, zz = 0.0f;
    for (int e = 0; e < E; e++) mm = l[e] > mm ? l[e] : mm;
    for (int e = 0; e < E; e++) zz += exp(l[e] - mm);
    *m = mm, *z = zz;
}
static float moe_score(float l, float m, float z, int sig) { return sig ? 1.0f / (1.0f + exp(-l)) : exp(l - m) / z; }

/* An item per row: the k highest scores (+ bias), lower id first on ties, a number before a NaN. */
__kernel void k_moe_topk(PTR(const float, lg), PTR(const float, bias), PTR(int, out), long N, int E, int k, int flags) {
    BIND(const float, lg); BIND(const float, bias); BIND(int, out);
    int sig = flags & 1;
    GRID_STRIDE(n, N) {
        __global const float *l = lg + n * E;
        __global int *o = out + n * k;
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

/* The gate weights of row n (flags: 1 sigmoid, 2 not normalised): w_c = sc(c) / den, where *m, *den
 * describe the row (the softmax over all experts, over the chosen, or the sum of the chosen sigmoids). */
static void moe_gate_norm(__global const float *l, __global const int *id, int E, int k, int flags, float *m, float *den) {
    int sig = flags & 1, norm = !(flags & 2);
    if (!sig && !norm) { moe_softmax_mz(l, E, m, den); return; }
    float mm = -INFINITY, z = 0.0f;
    if (!sig) {
        for (int c = 0; c < k; c++) mm = l[id[c]] > mm ? l[id[c]] : mm;
        for (int c = 0; c < k; c++) z += exp(l[id[c]] - mm);
    } else {
        for (int c = 0; c < k; c++) z += 1.0f / (1.0f + exp(-l[id[c]]));
    }
    *m = mm, *den = sig && !norm ? 1.0f : z;
}
/* the chosen score s_c (softmax numerator or sigmoid) */
static float moe_gate_s(float l, float m, int sig) { return sig ? 1.0f / (1.0f + exp(-l)) : exp(l - m); }

/* An item per row. back 0: out[n, k] = the weights; back 1: out[n, E] = dlogits from dw [N, k]. */
__kernel void k_moe_gate(PTR(const float, lg), PTR(const int, idx), PTR(const float, dw), PTR(float, out), long N, int E, int k,
                         int flags, int back) {
    BIND(const float, lg); BIND(const int, idx); BIND(const float, dw); BIND(float, out);
    int sig = flags & 1, norm = !(flags & 2);
    GRID_STRIDE(n, N) {
        __global const float *l = lg + n * E;
        __global const int *id = idx + n * k;
        int ok = 1;
        for (int c = 0; c < k; c++) ok &= id[c] >= 0 && id[c] < E;
        float m = 0.0f, den = 1.0f;
        if (ok) moe_gate_norm(l, id, E, k, flags, &m, &den);
        if (!back) {
            for (int c = 0; c < k; c++) out[n * k + c] = ok ? moe_gate_s(l[id[c]], m, sig) / den : 0.0f;
        } else {
            __global const float *d = dw + n * k;
            __global float *dl = out + n * E;
            float wdw = 0.0f;
            for (int c = 0; c < k && ok; c++) wdw += moe_gate_s(l[id[c]], m, sig) / den * d[c];
            for (int e = 0; e < E; e++) dl[e] = ok && !sig && !norm ? -(exp(l[e] - m) / den) * wdw : 0.0f;
            for (int c = 0; c < k && ok; c++) {
                float s = moe_gate_s(l[id[c]], m, sig), w = s / den;
                if (!sig && norm) dl[id[c]] += w * (d[c] - wdw);
                else if (!sig) dl[id[c]] += d[c] * w;
                else dl[id[c]] += (norm ? (d[c] - wdw) / den : d[c]) * s * (1.0f - s);
            }
        }
    }
}

/* y[row(n, j)] = x[n] (* w[n, j]): an item per element of a choice's row. x and y f32 or bf16 (xdt, ydt:
 * the dtype enum): a bf16 row moved as it is, else computed in f32 and stored as a cast rounds. */
__kernel void k_moe_dispatch(PTR(const void, x), PTR(const float, w), PTR(const int, row), PTR(void, y), long nk, int k, long C,
                             int xdt, int ydt) {
    BIND(const void, x); BIND(const float, w); BIND(const int, row); BIND(void, y);
    GRID_STRIDE(i, nk * C) {
        long ch = i / C, col = i - ch * C, src = (ch / k) * C + col;
        int r = row[ch];
        if (r >= 0 && !w && xdt == DT_BF16 && ydt == DT_BF16) ((__global ushort *)y)[(long)r * C + col] = ((__global const ushort *)x)[src];
        else if (r >= 0) store_out(y, (long)r * C + col, (w ? w[ch] : 1.0f) * load_in(x, src, xdt), ydt);
    }
}

/* y[n] = sum_j (w[n, j] *) ye[row(n, j)]: an item per element of a token's row (ye f32 or bf16: edt) */
__kernel void k_moe_combine(PTR(const void, ye), PTR(const int, row), PTR(const float, w), PTR(float, y), long N, int k, long C, int edt) {
    BIND(const void, ye); BIND(const int, row); BIND(const float, w); BIND(float, y);
    GRID_STRIDE(i, N * C) {
        long n = i / C, col = i - n * C;
        float acc = 0.0f;
        for (int c = 0; c < k; c++) {
            int r = row[n * k + c];
            if (r >= 0) acc += (w ? w[n * k + c] : 1.0f) * load_in(ye, (long)r * C + col, edt);
        }
        y[i] = acc;
    }
}

/* dw[n, j] = <dy[n], ye[row(n, j)]> (0 for a dropped choice): an item per choice (ye, dy f32 or bf16) */
__kernel void k_moe_combine_back_w(PTR(const void, ye), PTR(const int, row), PTR(const void, dy), PTR(float, dw), long nk, int k,
                                   long C, int edt, int ddt) {
    BIND(const void, ye); BIND(const int, row); BIND(const void, dy); BIND(float, dw);
    GRID_STRIDE(ch, nk) {
        int r = row[ch];
        float d = 0.0f;
        if (r >= 0)
            for (long i = 0; i < C; i++) d += load_in(dy, (ch / k) * C + i, ddt) * load_in(ye, (long)r * C + i, edt);
        dw[ch] = d;
    }
}

/* The grouped GEMM, one launch over all experts: y[rows of e] = x[rows of e] W_e (W_e [K, M], or
 * [M, K] with tb). Expert e's rows start at off[e] and number rows[e] (off null: e * S and S, the
 * by-expert buffer [E, S, K]). Groups (y) are 64-row tiles of the experts in turn (the grid has
 * ceil(R / 64) + E of them, enough for any counts; the spare ones return), 64 columns each (x); the
 * tile as k_gemm's. Rows no expert uses are left as they are (the caller zeroes them). */
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void
k_moe_gemm(PTR(const float, A), PTR(const float, W), PTR(float, Y), PTR(const int, off), PTR(const int, rows), int E, int S, int K,
           int N, int tb) {
    BIND(const float, A); BIND(const float, W); BIND(float, Y); BIND(const int, off); BIND(const int, rows);
    __local float As[GK][GT + 4];
    __local float Bs[GK][GT + 4];
    int t = get_group_id(1), e = 0, M = 0;
    for (; e < E; e++) { /* the expert of this row tile (the same for every item: the return below is uniform) */
        M = off ? rows[e] : S;
        int tiles = (M + GT - 1) / GT;
        if (t < tiles) break;
        t -= tiles;
    }
    if (e >= E) return;
    long o = off ? off[e] : (long)e * S;
    __global const float *Ab = A + o * K;
    __global const float *Bb = W + (long)e * K * N;
    __global float *Cb = Y + o * N;
    gemm_tile(Ab, Bb, Cb, M, N, K, 0, tb, t * GT, get_group_id(0) * GT, As, Bs);
}

/* The grouped weight gradient: dW_e [K, N] = A_e^T B_e over expert e's rows (A [R, K], B [R, N]; zero for
 * an expert without rows). Groups: 64 x 64 tiles of dW_e (x: columns, y: rows), z: the expert. */
__kernel __attribute__((reqd_work_group_size(256, 1, 1))) void
k_moe_gemm_back_w(PTR(const float, A), PTR(const float, B), PTR(float, dW), PTR(const int, off), PTR(const int, rows), int S, int K,
                  int N) {
    BIND(const float, A); BIND(const float, B); BIND(float, dW); BIND(const int, off); BIND(const int, rows);
    __local float As[GK][GT + 4];
    __local float Bs[GK][GT + 4];
    int e = get_group_id(2), R = off ? rows[e] : S;
    long o = off ? off[e] : (long)e * S;
    __global const float *Ab = A + o * K;
    __global const float *Bb = B + o * N;
    __global float *Cb = dW + (long)e * K * N;
    gemm_tile(Ab, Bb, Cb, K, N, R, 1, 0, get_group_id(1) * GT, get_group_id(0) * GT, As, Bs); /* (op(A) = A_e^T: ta) */
}

/* The balance loss E / N sum_n sum_e p[n, e] f_e, f = counts / their sum: one group. */
__kernel void k_moe_aux_loss(PTR(const float, lg), PTR(const int, cnt), PTR(float, y), long N, int E) {
    BIND(const float, lg); BIND(const int, cnt); BIND(float, y);
    __local float sh[MAX_GROUP];
    float total = 0.0f, acc = 0.0f;
    for (int e = 0; e < E; e++) total += (float)cnt[e];
    COLS_LOOP(n, N) {
        __global const float *l = lg + n * E;
        float m, z, pf = 0.0f;
        moe_softmax_mz(l, E, &m, &z);
        for (int e = 0; e < E; e++) pf += exp(l[e] - m) / z * (total > 0.0f ? (float)cnt[e] / total : 0.0f);
        acc += pf;
    }
    acc = group_sum(acc, sh);
    if (get_local_id(0) == 0) y[0] = N ? (float)E * acc / (float)N : 0.0f;
}

/* its gradient: d[n, e] = dloss E / N p[n, e] (f_e - <p[n], f>): an item per row */
__kernel void k_moe_aux_loss_back(PTR(const float, lg), PTR(const int, cnt), PTR(const float, dloss), PTR(float, d), long N, int E) {
    BIND(const float, lg); BIND(const int, cnt); BIND(const float, dloss); BIND(float, d);
    float total = 0.0f, dl = dloss[0] * (float)E / (float)(N ? N : 1);
    for (int e = 0; e < E; e++) total += (float)cnt[e];
    GRID_STRIDE(n, N) {
        __global const float *l = lg + n * E;
        float m, z, pf = 0.0f;
        moe_softmax_mz(l, E, &m, &z);
        for (int e = 0; e < E; e++) pf += exp(l[e] - m) / z * (total > 0.0f ? (float)cnt[e] / total : 0.0f);
        for (int e = 0; e < E; e++) d[n * E + e] = dl * (exp(l[e] - m) / z) * ((total > 0.0f ? (float)cnt[e] / total : 0.0f) - pf);
    }
}
