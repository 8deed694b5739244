/* toy_backend.c — Demonstrates how to write a backend plugin: the smallest device pdde can load at run
 * time, in one file, as a template for bringing up an accelerator (backends/README.md is the contract
 * it follows).
 *
 * Its "device" is host memory and runs a handful of ops (add, sub, mul of equal shapes, scale, relu
 * and its backward, f32 matmul of a 2-D right side, and the two every backend needs: reshape and the gradient
 * accumulation); every other op falls back to the CPU with copies around it.
 *
 *   cc -std=c11 -O2 -fPIC -shared -I. examples/toy_backend.c -o libpdde_toy.so   (make builds it)
 *   PDDE_BACKEND_PLUGINS=$PWD/libpdde_toy.so build/pdde-info
 *   build/test_backend_ops --plugin $PWD/libpdde_toy.so                 (the conformance suite)
 *
 * It includes pdde_extension.h (the backend vtable, and the op parameters by name); everything it calls in pdde comes through the host table
 * its entry point receives, so the same .so loads into programs linking pdde statically or shared.
 * TOY_API_VERSION (default PDDE_BACKEND_API_VERSION) builds a plugin of another version, which pdde
 * must refuse (the tests do). */
#include "pdde_extension.h"

#include <stdlib.h>
#include <string.h>

#ifndef TOY_API_VERSION
#define TOY_API_VERSION PDDE_BACKEND_API_VERSION
#endif

typedef struct {
    pdde_context *ctx;              /* errors are reported on it */
    const pdde_backend_host *host;  /* pdde's functions */
} toy_family;

static pdde_status toy_init(pdde_context *ctx, void **family, int *n_devices);
static void toy_free(void *family) { free(family); }

static pdde_status toy_device_props(void *family, int index, pdde_device_props *out) {
    (void)family, (void)index;
    memset(out, 0, sizeof *out);
    out->kind = PDDE_DEVICE_ACCEL;
    strcpy(out->name, "toy accelerator (host memory)");
    strcpy(out->backend, "toy");
    out->memory_total = (uint64_t)1 << 30;
    out->compute_units = 1;
    return PDDE_OK;
}

/* One device: the handle is the family (nothing to open). */
static pdde_status toy_device_open(void *family, int index, void **dev) {
    (void)index;
    *dev = family;
    return PDDE_OK;
}

static void toy_device_close(void *dev) { (void)dev; }

static int same_shape(const pdde_tensor *a, const pdde_tensor *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

/* What this device runs: f32 only, no broadcasting, matmuls of a 2-D right side. Everything else goes
 * to the CPU. */
static int toy_supports_op(void *dev, const pdde_tensor *t) {
    (void)dev;
    if (t->dtype != PDDE_F32) return 0;
    for (int i = 0; i < t->nsrc; i++)
        if (t->src[i]->dtype != PDDE_F32) return 0;
    switch (t->op) {
    case PDDE_OP_ADD: case PDDE_OP_SUB: case PDDE_OP_MUL: case PDDE_OP_RELU_BACK:
        return same_shape(t, t->src[0]) && same_shape(t, t->src[1]);
    case PDDE_OP_SCALE: case PDDE_OP_RELU:
        return same_shape(t, t->src[0]);
    /* required of every backend: a view (its data is its source's, so there is nothing to do unless
     * the core gave it memory of its own) and the gradient accumulation, which writes its
     * accumulator in place and so cannot move to the CPU */
    case PDDE_OP_RESHAPE:
        return 1;
    case PDDE_OP_GRAD_ACCUM: /* (3 sources: a fused form that computes its contribution; not this device's) */
        return t->nsrc == 2 && same_shape(t->src[0], t->src[1]);
    case PDDE_OP_MATMUL: /* 2-D, or a model's linear layer: [..., M, K] x [K, N], its rows one [prod, K] matrix
                          * (3 sources: with a fused bias; a batched or transposed left side: not this device's) */
        return t->nsrc == 2 && t->src[1]->ndim == 2 && (t->src[0]->ndim == 2 || !pdde_op_i32(t, PDDE_P_MATMUL_TRANS_A));
    default:
        return 0;
    }
}

static pdde_status toy_buffer_alloc(void *dev, size_t nbytes, void **handle) {
    toy_family *f = dev;
    *handle = calloc(1, nbytes ? nbytes : 1);
    if (!*handle) return f->host->error(f->ctx, PDDE_ERR_DEVICE_OOM, "toy: cannot allocate %zu bytes", nbytes);
    return PDDE_OK;
}

static void toy_buffer_free(void *dev, void *handle) { (void)dev, free(handle); }

static pdde_status toy_write(void *dev, void *stream, void *handle, size_t offset, const void *src, size_t n) {
    (void)dev, (void)stream;
    memcpy((char *)handle + offset, src, n);
    return PDDE_OK;
}

static pdde_status toy_read(void *dev, void *stream, void *handle, size_t offset, void *dst, size_t n) {
    (void)dev, (void)stream;
    memcpy(dst, (const char *)handle + offset, n);
    return PDDE_OK;
}

/* Work runs at once (synchronously), so a stream is only a token and synchronizing does nothing. */
static pdde_status toy_stream_create(void *dev, void **stream) {
    *stream = dev;
    return PDDE_OK;
}
static void toy_stream_free(void *dev, void *stream) { (void)dev, (void)stream; }
static pdde_status toy_stream_sync(void *dev, void *stream) { (void)dev, (void)stream; return PDDE_OK; }

#define DATA(t) ((float *)((char *)(t)->data + (t)->offset))

static pdde_status toy_compute(void *dev, void *stream, pdde_tensor *t) {
    toy_family *f = dev;
    (void)stream;
    float *y = DATA(t);
    const float *a = DATA(t->src[0]), *b = t->nsrc > 1 ? DATA(t->src[1]) : NULL;
    int64_t n = f->host->numel(t);
    switch (t->op) {
    case PDDE_OP_ADD: for (int64_t i = 0; i < n; i++) y[i] = a[i] + b[i]; break;
    case PDDE_OP_SUB: for (int64_t i = 0; i < n; i++) y[i] = a[i] - b[i]; break;
    case PDDE_OP_MUL: for (int64_t i = 0; i < n; i++) y[i] = a[i] * b[i]; break;
    case PDDE_OP_SCALE: for (int64_t i = 0; i < n; i++) y[i] = pdde_op_f32(t, PDDE_P_SCALE) * a[i]; break;
    case PDDE_OP_RELU: for (int64_t i = 0; i < n; i++) y[i] = a[i] > 0 ? a[i] : 0.0f; break;
    case PDDE_OP_RELU_BACK: for (int64_t i = 0; i < n; i++) y[i] = a[i] > 0 ? b[i] : 0.0f; break; /* src: x, dy */
    case PDDE_OP_RESHAPE: if (y != a) memmove(y, a, (size_t)n * sizeof *y); break;
    case PDDE_OP_GRAD_ACCUM: for (int64_t i = 0; i < n; i++) y[i] += b[i]; break; /* y is src0's memory */
    case PDDE_OP_MATMUL: { /* [M,K] x [K,N] (M all of a's rows), either operand stored transposed */
        int ta = pdde_op_i32(t, PDDE_P_MATMUL_TRANS_A), tb = pdde_op_i32(t, PDDE_P_MATMUL_TRANS_B);
        int64_t N = t->shape[t->ndim - 1], M = N ? n / N : 0, K = t->src[0]->shape[ta ? 0 : t->src[0]->ndim - 1];
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) acc += (double)a[ta ? k * M + i : i * K + k] * b[tb ? j * K + k : k * N + j];
                y[i * N + j] = (float)acc;
            }
        break;
    }
    default:
        return f->host->error(f->ctx, PDDE_ERR_UNSUPPORTED, "toy: op %s is not supported", f->host->op_name(t->op));
    }
    return PDDE_OK;
}

static const pdde_backend_iface toy_iface = {
    .api_version = TOY_API_VERSION,
    .struct_size = sizeof(pdde_backend_iface),
    .name = "toy",
    .init = toy_init,
    .free = toy_free,
    .device_props = toy_device_props,
    .device_open = toy_device_open,
    .device_close = toy_device_close,
    .supports_op = toy_supports_op,
    .buffer_alloc = toy_buffer_alloc,
    .buffer_free = toy_buffer_free,
    .write = toy_write,
    .read = toy_read,
    .stream_create = toy_stream_create,
    .stream_free = toy_stream_free,
    .stream_sync = toy_stream_sync,
    .compute = toy_compute,
    /* events and pinned host memory are optional: left NULL, the core synchronizes streams and uses malloc */
};

/* The host table lives as long as the library that loaded this plugin; init copies the pointer. */
static const pdde_backend_host *toy_host;

static pdde_status toy_init(pdde_context *ctx, void **family, int *n_devices) {
    toy_family *f = calloc(1, sizeof *f);
    if (!f) return toy_host->error(ctx, PDDE_ERR_OOM, "toy: out of memory");
    f->ctx = ctx, f->host = toy_host;
    *family = f;
    *n_devices = 1;
    return PDDE_OK;
}

/* The entry point pdde looks up (PDDE_BACKEND_PLUGIN_ENTRY). */
const pdde_backend_iface *pdde_backend_plugin(const pdde_backend_host *host);
const pdde_backend_iface *pdde_backend_plugin(const pdde_backend_host *host) {
    if (!host) return NULL;
    /* declining: the reason goes to host->error with no context (there is none yet); pdde-info shows it */
    if (host->struct_size < sizeof(pdde_backend_host))
        return host->error(NULL, PDDE_ERR_VERSION, "toy: this pdde's host table is older than the toy's (struct_size %u)", host->struct_size), NULL;
    toy_host = host;
    return &toy_iface;
}
