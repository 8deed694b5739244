/* pdde.c — the core of pdde, and the single compilation unit of the library: it includes the enabled
 * backends, comm and planner parts, so `cc -c pdde.c` builds everything (PDDE_NO_<X> leaves X out).
 *
 * Sections: context and errors · dtypes · graph building · autodiff · optimizers · executor (memory
 * plan, schedule, thread pool) · checkpoints · data. */
#define _GNU_SOURCE
#include "pdde.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ================================================================================================
 * Context and errors */

struct pdde_context {
    int n_threads;
    uint64_t seed;
    int log_level;
    char last_error[1024];
    struct pdde_threadpool *pool;
    struct pdde_registry *registry; /* backends and their devices (backends/registry.c) */
};

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
    case PDDE_ERR_MISMATCH: return "does not match the model";
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
    case PDDE_ERR_NO_PLAN: return "no plan fits";
    case PDDE_ERR_DIST_ATTR: return "bad distributed attribute";
    default: return "unknown status";
    }
}

int pdde_error(pdde_context *ctx, int status, const char *fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, ap);
        va_end(ap);
        if (ctx->log_level >= 2) fprintf(stderr, "pdde: %s\n", ctx->last_error);
    }
    return status;
}

const char *pdde_last_error(const pdde_context *ctx) { return ctx ? ctx->last_error : "no context"; }
int pdde_context_n_threads(const pdde_context *ctx) { return ctx->n_threads; }

/* ================================================================================================
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
        int shift = 126 - (int)(absu >> 23) + 13 + 1;
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

/* ================================================================================================
 * Context lifetime */

pdde_status pdde_context_init(const pdde_context_params *params, pdde_context **out) {
    if (!out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    pdde_context_params p = PDDE_CONTEXT_PARAMS_INIT;
    if (params) p = *params;
    pdde_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return PDDE_ERR_OOM;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    ctx->n_threads = p.n_threads > 0 ? p.n_threads : (cores > 0 ? (int)cores : 1);
    ctx->seed = p.seed ? p.seed : 1234;
    ctx->log_level = p.log_level;
    *out = ctx;
    return PDDE_OK;
}

void pdde_context_free(pdde_context *ctx) {
    if (!ctx) return;
    free(ctx);
}

/* ================================================================================================
 * Parts compiled into this unit */

#if defined(PDDE_HAVE_UCX) && !defined(PDDE_NO_COMM)
#include "comm/comm.c"
#endif
