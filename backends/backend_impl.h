/* backends/backend_impl.h — what the backends layer shares with the layers above it, beyond the
 * public vtable in pdde.h: the registry of backend families and devices (registry.c), the optional
 * vtable slot test, and math helpers both the CPU kernels and the executor's host-side ops use.
 * Nothing here knows graphs, sessions or distribution. */
#ifndef PDDE_BACKEND_IMPL_H
#define PDDE_BACKEND_IMPL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../pdde.h"

#ifndef PDDE_PRIVATE
#define PDDE_PRIVATE static __attribute__((unused))
#endif

/* The built-in backends (one file each; registry.c lists them). */
extern const pdde_backend_iface pdde_backend_cpu, pdde_backend_opencl, pdde_backend_cuda, pdde_backend_level_zero;

/* Whether backend b fills an optional slot (slots past its struct_size count as NULL). */
#define IFACE_HAS(b, slot) ((b)->struct_size >= offsetof(pdde_backend_iface, slot) + sizeof((b)->slot) && (b)->slot)

/* The backend families of a context and their devices; built once, then fixed. */
typedef struct {
    const pdde_backend_iface *iface; /* NULL: a plugin that was refused */
    void *family;       /* NULL when unavailable */
    int status;         /* PDDE_OK or why not */
    char why[1024];
    char label[64];     /* a refused plugin's name (its file) */
    void *dl;           /* a plugin's library handle (dlclose'd when the registry is freed) */
    int first_device;   /* global index of its device 0 */
    int n_devices;
} registry_family;

typedef struct {
    int family;         /* index into families */
    int index;          /* index within its family */
    void *dev;          /* opened lazily */
} registry_device;

typedef struct pdde_registry {
    registry_family *families;
    int n_families;
    registry_device *devices;
    int n_devices;
} pdde_registry;

/* Builds the registry: ctx is only handed to each backend's init (for its error messages). */
PDDE_PRIVATE pdde_status registry_init(pdde_context *ctx, const pdde_context_params *p, pdde_registry **out);
PDDE_PRIVATE void registry_free(pdde_registry *r);
/* The backend and opened device handle of a global device index. */
PDDE_PRIVATE pdde_status registry_device_get(pdde_context *ctx, pdde_registry *r, int device, const pdde_backend_iface **iface, void **dev);
PDDE_PRIVATE pdde_status registry_device_props(const pdde_registry *r, int device, pdde_device_props *out);
/* Whether a device's data handles are host pointers (the CPU's), from the registry alone. */
PDDE_PRIVATE bool registry_device_is_host(const pdde_registry *r, int device);
PDDE_PRIVATE int registry_device_find(const pdde_registry *r, const char *backend, int index);
/* Whether a device runs node (its backend's supports_op; the CPU runs everything). A device that
 * cannot be opened says yes: opening it later reports why. */
PDDE_PRIVATE bool registry_device_supports(pdde_context *ctx, pdde_registry *r, int device, const pdde_tensor *node);
/* A family's name: its backend's, or a refused plugin's file name. */
PDDE_PRIVATE const char *registry_family_name(const registry_family *f);

/* Named op parameters: each slot of an op's iparams/fparams has one meaning, named here, and is read
 * and written through pdde_op_i32/pdde_op_f32 (ggml's op params). What the executor alone needs of a
 * node (its collective's mesh axis, a peer, an early start) is not an op parameter: it lives in the
 * local program (planner/pdde_impl.h). */
typedef enum {
    PDDE_P_MATMUL_TRANS_A = 0, PDDE_P_MATMUL_TRANS_B = 1,
    PDDE_P_SOFTMAX_CAUSAL = 0,
    PDDE_P_PERMUTE_DIM0 = 0,            /* output dim i takes input dim [PDDE_P_PERMUTE_DIM0 + i] */
    PDDE_P_CONCAT_AXIS = 0,
    PDDE_P_SLICE_AXIS = 0, PDDE_P_SLICE_START = 1,
    PDDE_P_REDUCE_AXIS = 0, PDDE_P_REDUCE_KEEPDIM = 1,          /* sum, mean */
    PDDE_P_DROPOUT_SEED_LO = 0, PDDE_P_DROPOUT_SEED_HI = 1, PDDE_P_DROPOUT_COUNTER = 2,
    /* embedding, its backward, cross-entropy, its backward: the vocab rows/columns this rank holds
     * (0, 0 = all of it) */
    PDDE_P_VOCAB_FIRST = 0, PDDE_P_VOCAB_SIZE = 1,
    PDDE_P_UPDATE_STEP = 0,             /* sgd/adamw: step t, 1-based (set by the executor) */
} pdde_iparam;

typedef enum {
    PDDE_P_LEAF_INIT = 0,               /* parameter: normal std (< 0: ones); constant: fill value */
    PDDE_P_SCALE = 0,                   /* scale, expand */
    PDDE_P_NORM_EPS = 0,                /* layernorm, rmsnorm */
    PDDE_P_DROPOUT_P = 0,
    PDDE_P_UPDATE_LR = 0, PDDE_P_UPDATE_BETA1 = 1, PDDE_P_UPDATE_BETA2 = 2, PDDE_P_UPDATE_EPS = 3,
    PDDE_P_UPDATE_WEIGHT_DECAY = 4, PDDE_P_UPDATE_CLIP = 5, PDDE_P_UPDATE_GRAD_SCALE = 6,
} pdde_fparam;

static inline int32_t pdde_op_i32(const pdde_tensor *t, pdde_iparam p) { return t->iparams[p]; }
static inline void pdde_op_set_i32(pdde_tensor *t, pdde_iparam p, int32_t v) { t->iparams[p] = v; }
static inline float pdde_op_f32(const pdde_tensor *t, pdde_fparam p) { return t->fparams[p]; }
static inline void pdde_op_set_f32(pdde_tensor *t, pdde_fparam p, float v) { t->fparams[p] = v; }

/* exp(x) for float, written so that loops over it vectorise (glibc's expf/tanhf calls do not):
 * exp(x) = 2^n * e^g with n = rint(x / ln2) and |g| <= ln2/2, e^g by its degree-7 Taylor polynomial
 * (truncation error < 1e-8 relative, below float rounding). */
static inline float exp_fast(float x_in) {
    /* (NaN fails both comparisons and becomes -87: converting a NaN to int is undefined; it is
     * given back as the result instead) */
    float x = x_in > -87.0f ? x_in : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    /* round to nearest by adding and removing 1.5 * 2^23 (|x / ln2| < 2^22 here): rintf needs SSE4.1's
     * roundps to vectorise, which a portable x86-64 build does not have (it called libm per element) */
    float n = (x * 1.4426950408889634f + 12582912.0f) - 12582912.0f;
    float g = x - n * 0.693145751953125f - n * 1.428606765330187e-06f; /* ln2 split for accuracy */
    float p = 1.0f + g * (1.0f + g * (0.5f + g * (1.0f / 6 + g * (1.0f / 24 + g * (1.0f / 120 + g * (1.0f / 720 + g * (1.0f / 5040)))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x_in != x_in ? x_in : p * scale;
}

#endif
