/* backends/base.c — what every layer may call: status strings and errors (each thread's last, and the
 * context's), dtype sizes, names and conversions (f16, bf16), a tensor's element and byte counts, op
 * names and shapes as text, the CRC-32 that checkpoint and parameter-server files carry, and whether two ids are one. It is no
 * backend: it lives in backends/ because that is the lowest layer, the one every other may call, and
 * it knows no graph, session, communicator or device. */
#include "backend_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------------
 * Errors */

const char *pdde_status_str(int status) {
    switch (status) {
    case PDDE_OK: return "ok";
    case PDDE_ERR_INVALID_ARG: return "invalid argument";
    case PDDE_ERR_SHAPE: return "shape mismatch";
    case PDDE_ERR_DTYPE: return "unsupported dtype";
    case PDDE_ERR_UNKNOWN_OP: return "unknown op";
    case PDDE_ERR_STATE: return "call out of order";
    case PDDE_ERR_OOM: return "out of host memory";
    case PDDE_ERR_DEVICE_OOM: return "out of device memory";
    case PDDE_ERR_IO: return "i/o error";
    case PDDE_ERR_CORRUPT: return "corrupt file";
    case PDDE_ERR_VERSION: return "unsupported format version";
    case PDDE_ERR_MISMATCH: return "does not match the model or the other ranks";
    case PDDE_ERR_NOT_FOUND: return "not found";
    case PDDE_ERR_UNAVAILABLE: return "backend unavailable";
    case PDDE_ERR_UNSUPPORTED: return "unsupported by the device";
    case PDDE_ERR_BUILD: return "kernel build failed";
    case PDDE_ERR_BACKEND: return "backend error";
    case PDDE_ERR_TIMEOUT: return "timed out";
    case PDDE_ERR_PEER_LOST: return "peer lost";
    case PDDE_ERR_COMM: return "communication error";
    case PDDE_ERR_ABORTED: return "aborted";
    case PDDE_ERR_ENV: return "bad launcher environment";
    case PDDE_ERR_AUTH: return "authentication failed";
    case PDDE_ERR_NO_PLAN: return "no plan fits";
    case PDDE_ERR_DIST_ATTR: return "bad distributed attribute";
    case PDDE_ERR_NONFINITE: return "non-finite value";
    default: return "unknown status";
    }
}

/* Errors are per thread, as errno is: each thread keeps the text of its own last error and the
 * context it was raised on, so threads that share a context (pipeline stages, data loaders) never
 * overwrite or tear each other's message. The context keeps the last error of any thread too, under
 * its lock, for a thread that has raised none on it. The library raises an error on the thread whose
 * call returns it (comm/ hands a peer's failure to the caller, the pipeline a stage's to its run). */
static _Thread_local uint64_t thread_error_ctx;                             /* 0: none */
static _Thread_local char thread_error[sizeof ((pdde_context *)0)->last_error];
static _Thread_local char thread_error_copy[sizeof ((pdde_context *)0)->last_error]; /* of the context's */
static _Thread_local uint64_t thread_errors;

PDDE_PRIVATE void error_init(pdde_context *ctx) {
    static _Atomic uint64_t contexts;
    ctx->id = ++contexts;
    pthread_mutex_init(&ctx->error_lock, NULL);
}

PDDE_PRIVATE void error_fini(pdde_context *ctx) {
    if (thread_error_ctx == ctx->id) thread_error_ctx = 0;
    pthread_mutex_destroy(&ctx->error_lock);
}

PDDE_PRIVATE void error_vset(pdde_context *ctx, const char *fmt, va_list ap) {
    char text[sizeof ctx->last_error];
    vsnprintf(text, sizeof text, fmt, ap); /* first: an argument may be this thread's last message */
    memcpy(thread_error, text, sizeof text);
    thread_error_ctx = ctx->id;
    thread_errors++;
    pthread_mutex_lock(&ctx->error_lock);
    memcpy(ctx->last_error, text, sizeof text);
    pthread_mutex_unlock(&ctx->error_lock);
    if (ctx->log_level >= 2) pdde_log(PDDE_LOG_DEBUG, "pdde: %s", text);
}

/* The log's sink, under a lock that each line holds while it is written: lines of several threads never
 * interleave, and a sink set anew is never called with the old one's argument */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static pdde_log_fn log_fn;
static void *log_user;

void pdde_log_set(pdde_log_fn fn, void *user) {
    pthread_mutex_lock(&log_lock);
    log_fn = fn, log_user = user;
    pthread_mutex_unlock(&log_lock);
}

PDDE_PRIVATE void pdde_log(pdde_log_level level, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    size_t n = strlen(line);
    if (n && line[n - 1] == '\n') line[n - 1] = 0;
    pthread_mutex_lock(&log_lock);
    if (log_fn) log_fn(level, line, log_user);
    else fprintf(stderr, "%s\n", line);
    pthread_mutex_unlock(&log_lock);
}

PDDE_PRIVATE void pdde_log_lines(pdde_log_level level, const char *text) {
    for (const char *p = text; p && *p;) {
        size_t n = strcspn(p, "\n");
        pdde_log(level, "%.*s", (int)n, p);
        p += n + (p[n] == '\n');
    }
}

PDDE_PRIVATE void error_clear(pdde_context *ctx) {
    if (thread_error_ctx == ctx->id) thread_error_ctx = 0;
    pthread_mutex_lock(&ctx->error_lock);
    ctx->last_error[0] = 0;
    pthread_mutex_unlock(&ctx->error_lock);
}

PDDE_PRIVATE uint64_t error_count(void) { return thread_errors; }
PDDE_PRIVATE const char *error_here(void) { return thread_error; }

pdde_status pdde_error(pdde_context *ctx, pdde_status status, const char *fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        error_vset(ctx, fmt, ap);
        va_end(ap);
    }
    return status;
}

const char *pdde_last_error(const pdde_context *ctx) {
    if (!ctx) return "no context";
    if (thread_error_ctx == ctx->id) return thread_error;
    pthread_mutex_t *lock = (pthread_mutex_t *)&ctx->error_lock; /* (the lock is not the context's state) */
    pthread_mutex_lock(lock);
    memcpy(thread_error_copy, ctx->last_error, sizeof thread_error_copy);
    pthread_mutex_unlock(lock);
    return thread_error_copy;
}

int pdde_context_thread_count(const pdde_context *ctx) { return ctx ? ctx->n_threads : 0; }

/* ------------------------------------------------------------------------------------------------
 * Dtypes */

size_t pdde_dtype_size(pdde_dtype t) {
    switch (t) {
    case PDDE_F32: case PDDE_I32: return 4;
    case PDDE_F16: case PDDE_BF16: return 2;
    case PDDE_I64: return 8;
    default: return 0;
    }
}

const char *pdde_dtype_name(pdde_dtype t) {
    static const char *names[] = {"f32", "f16", "bf16", "i32", "i64"};
    return (unsigned)t < PDDE_DTYPE_COUNT ? names[t] : "?";
}

uint16_t pdde_f32_to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

float pdde_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}

uint16_t pdde_f32_to_f16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, absu = u & 0x7fffffff;
    if (absu > 0x7f800000) return (uint16_t)(sign | 0x7e00);          /* NaN */
    if (absu >= 0x477ff000) return (uint16_t)(sign | 0x7c00);         /* overflow -> inf */
    if (absu < 0x38800000) {                                          /* subnormal or zero */
        if (absu < 0x33000000) return (uint16_t)sign;
        uint32_t mant = (absu & 0x7fffff) | 0x800000;
        int shift = 126 - (int)(absu >> 23); /* value = mant * 2^(e-150), f16 unit = 2^-24 */
        uint32_t half = mant >> shift, rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t h = ((absu >> 13) - (112u << 10)), rem = absu & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float pdde_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) u = sign;
        else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400)) { m <<= 1; e--; }
            u = sign | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) u = sign | 0x7f800000 | (m << 13);
    else u = sign | ((e + 112) << 23) | (m << 13);
    float f; memcpy(&f, &u, 4); return f;
}

/* ------------------------------------------------------------------------------------------------
 * Tensors and ops as numbers and text */

int64_t pdde_tensor_numel(const pdde_tensor *t) {
    if (!t) return 0;
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

size_t pdde_tensor_nbytes(const pdde_tensor *t) {
    if (!t) return 0;
    size_t n = (size_t)pdde_tensor_numel(t) * pdde_dtype_size(t->dtype);
    /* a packed attention's output [B, T, H*D] f32 is followed by its rows' logsumexp [B*H, T] */
    if (t->op == PDDE_OP_ATTENTION && pdde_op_i32(t, PDDE_P_ATTENTION_QKV_D) > 0)
        n += (size_t)pdde_tensor_numel(t) / (size_t)pdde_op_i32(t, PDDE_P_ATTENTION_QKV_D) * sizeof(float);
    return n;
}

size_t pdde_lowp_copy_offset(const pdde_tensor *t) { return (pdde_tensor_nbytes(t) + 255) & ~(size_t)255; }

const char *pdde_op_name(pdde_op op) {
    static const char *names[PDDE_OP_COUNT] = {
        [PDDE_OP_NONE] = "leaf", [PDDE_OP_MATMUL] = "matmul", [PDDE_OP_ADD] = "add", [PDDE_OP_SUB] = "sub",
        [PDDE_OP_MUL] = "mul", [PDDE_OP_SCALE] = "scale", [PDDE_OP_GELU] = "gelu", [PDDE_OP_RELU] = "relu",
        [PDDE_OP_SILU] = "silu", [PDDE_OP_LAYERNORM] = "layernorm", [PDDE_OP_RMSNORM] = "rmsnorm",
        [PDDE_OP_SOFTMAX] = "softmax", [PDDE_OP_CROSS_ENTROPY] = "cross_entropy", [PDDE_OP_EMBEDDING] = "embedding",
        [PDDE_OP_RESHAPE] = "reshape", [PDDE_OP_PERMUTE] = "permute", [PDDE_OP_CONCAT] = "concat",
        [PDDE_OP_SLICE] = "slice", [PDDE_OP_SUM] = "sum", [PDDE_OP_MEAN] = "mean", [PDDE_OP_DROPOUT] = "dropout",
        [PDDE_OP_CAST] = "cast", [PDDE_OP_ATTENTION] = "attention", [PDDE_OP_ATTENTION_BACK] = "attention_back",
        [PDDE_OP_SUM_TO] = "sum_to", [PDDE_OP_EXPAND] = "expand",
        [PDDE_OP_GELU_BACK] = "gelu_back", [PDDE_OP_RELU_BACK] = "relu_back", [PDDE_OP_SILU_BACK] = "silu_back",
        [PDDE_OP_LAYERNORM_BACK] = "layernorm_back", [PDDE_OP_LAYERNORM_BACK_GAMMA] = "layernorm_back_gamma",
        [PDDE_OP_RMSNORM_BACK] = "rmsnorm_back", [PDDE_OP_RMSNORM_BACK_GAMMA] = "rmsnorm_back_gamma",
        [PDDE_OP_SOFTMAX_BACK] = "softmax_back", [PDDE_OP_CROSS_ENTROPY_BACK] = "cross_entropy_back",
        [PDDE_OP_EMBEDDING_BACK] = "embedding_back", [PDDE_OP_SLICE_BACK] = "slice_back",
        [PDDE_OP_DROPOUT_BACK] = "dropout_back", [PDDE_OP_GRAD_ACCUM] = "grad_accum",
        [PDDE_OP_GRAD_NORM_SQ] = "grad_norm_sq", [PDDE_OP_SGD_UPDATE] = "sgd_update",
        [PDDE_OP_ADAMW_UPDATE] = "adamw_update", [PDDE_OP_COPY] = "copy",
        [PDDE_OP_ALLREDUCE] = "allreduce", [PDDE_OP_REDUCE_SCATTER] = "reduce_scatter", [PDDE_OP_ALLGATHER] = "allgather",
        [PDDE_OP_ALLTOALL] = "alltoall",
        [PDDE_OP_COMM_WAIT] = "comm_wait", [PDDE_OP_SEND] = "send", [PDDE_OP_RECV] = "recv",
        [PDDE_OP_BIAS_GELU] = "bias_gelu", [PDDE_OP_BIAS_GELU_BACK] = "bias_gelu_back",
        [PDDE_OP_MOE_TOPK] = "moe_topk", [PDDE_OP_MOE_GATE] = "moe_gate", [PDDE_OP_MOE_GATE_BACK] = "moe_gate_back",
        [PDDE_OP_MOE_COUNTS] = "moe_counts", [PDDE_OP_MOE_DISPATCH] = "moe_dispatch", [PDDE_OP_MOE_COMBINE] = "moe_combine",
        [PDDE_OP_MOE_COMBINE_BACK_W] = "moe_combine_back_w", [PDDE_OP_MOE_GROUPED_MATMUL] = "moe_grouped_matmul",
        [PDDE_OP_MOE_GROUPED_MATMUL_BACK_W] = "moe_grouped_matmul_back_w",
        [PDDE_OP_MOE_AUX_LOSS] = "moe_aux_loss", [PDDE_OP_MOE_AUX_LOSS_BACK] = "moe_aux_loss_back",
        [PDDE_OP_ROPE] = "rope",
    };
    return (unsigned)op < PDDE_OP_COUNT && names[op] ? names[op] : "unknown";
}

PDDE_PRIVATE void dims_str(int ndim, const int64_t *shape, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

PDDE_PRIVATE void shape_str(const pdde_tensor *t, char *buf, size_t n) { dims_str(t->ndim, t->shape, buf, n); }

/* ------------------------------------------------------------------------------------------------
 * Checksums (CRC-32, the zlib polynomial) */

/* Slicing by 8: table k advances a byte k places further, so 8 input bytes take 8 lookups together
 * (about 8x a byte at a time: snapshots checksum the whole state) */
static uint32_t crc32_tables[8][256];
static pthread_once_t crc32_once = PTHREAD_ONCE_INIT;

static void crc32_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc32_tables[0][i] = c;
    }
    for (int k = 1; k < 8; k++)
        for (int i = 0; i < 256; i++) crc32_tables[k][i] = (crc32_tables[k - 1][i] >> 8) ^ crc32_tables[0][crc32_tables[k - 1][i] & 0xff];
}

PDDE_PRIVATE uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc32_once, crc32_init);
    const uint32_t(*t)[256] = (const uint32_t(*)[256])crc32_tables;
    const uint8_t *p = data;
    crc = ~crc;
    for (; n >= 8; p += 8, n -= 8) { /* (bytes in little-endian order, as x86-64 and arm64 load them) */
        uint32_t lo = ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24) ^ crc;
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 24;
        crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][hi & 0xff] ^
              t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    }
    while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* ------------------------------------------------------------------------------------------------
 * Ids */

/* Whether two of n ids (id_size bytes each; all zeros: unknown) are equal: two ranks' device UUIDs naming
 * one device (NCCL's check, which comm/ makes and a copy without comm/ still declares). */
int pdde_device_ids_shared(const void *ids, int n, size_t id_size, int *first, int *second) {
    const unsigned char *b = ids;
    for (int i = 0; b && id_size && i < n; i++) {
        int known = 0;
        for (size_t k = 0; k < id_size; k++) known |= b[(size_t)i * id_size + k];
        for (int j = i + 1; known && j < n; j++)
            if (!memcmp(b + (size_t)i * id_size, b + (size_t)j * id_size, id_size)) {
                if (first) *first = i;
                if (second) *second = j;
                return 1;
            }
    }
    return 0;
}
