/* backends/backend_impl.h — what the backends layer shares with the layers above it, beyond the
 * public vtable in pdde.h: the context struct, the registry of backend families and devices
 * (registry.c), the optional vtable slot test, the bottom helpers of base.c, the environment readers of
 * env_values.c, and math helpers both the
 * CPU kernels and the executor's host-side ops use. The named op parameters are op_params.h's.
 * Nothing here knows graphs, sessions or distribution. */
#ifndef PDDE_BACKEND_IMPL_H
#define PDDE_BACKEND_IMPL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../pdde_extension.h"

/* A function shared between parts: static in the amalgamation, external when a part is checked alone. */
#ifndef PDDE_PRIVATE
#define PDDE_PRIVATE static __attribute__((unused))
#endif

/* The built-in backends (one file each; registry.c lists them). */
extern const pdde_backend_iface pdde_backend_cpu, pdde_backend_opencl, pdde_backend_cuda, pdde_backend_level_zero;

/* Whether backend b fills an optional slot (slots past its struct_size count as NULL). */
#define IFACE_HAS(b, slot) ((b)->struct_size >= offsetof(pdde_backend_iface, slot) + sizeof((b)->slot) && (b)->slot)

/* The library's context: made by pdde_context_init (core/context.c), read by every layer (its last error,
 * threads, seed, and the registry of its devices). */
struct pdde_context {
    int n_threads;
    uint64_t seed;
    int log_level;
    char last_error[1024];          /* the last error of any thread (under error_lock; see base.c "Errors") */
    struct pdde_registry *registry; /* backends and their devices (registry.c) */
    pthread_mutex_t error_lock;     /* threads that share the context may fail at the same time */
    uint64_t id;                    /* unique in the process: which context a thread's own last error is of */
    unsigned long graphs_and_freed; /* 2 x its live graphs, + 1 once pdde_context_free was called (atomic) */
};

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
/* A graph of ctx made (+1) or freed (-1); frees ctx when pdde_context_free has been called and no graph is left. */
PDDE_PRIVATE void context_graph_count(pdde_context *ctx, int change);
/* pdde_context_free: now, or when its last graph is freed (their sessions use its devices and errors). */
PDDE_PRIVATE void context_release(pdde_context *ctx);
/* The backend and opened device handle of a global device index. */
PDDE_PRIVATE pdde_status registry_device_get(pdde_context *ctx, pdde_registry *r, int device, const pdde_backend_iface **iface, void **dev);
PDDE_PRIVATE pdde_status registry_device_props(const pdde_registry *r, int device, pdde_device_props *out);
/* Whether a device's data handles are host pointers (the CPU's), from the registry alone. */
PDDE_PRIVATE bool registry_device_is_host(const pdde_registry *r, int device);
/* The name of the backend a device belongs to ("cpu", "cuda", ...; NULL: no such device). */
PDDE_PRIVATE const char *registry_device_backend(const pdde_registry *r, int device);
PDDE_PRIVATE int registry_device_find(const pdde_registry *r, const char *backend, int index);
/* Whether a device runs node (its backend's supports_op; the CPU runs everything). A device that
 * cannot be opened says yes: opening it later reports why. */
PDDE_PRIVATE bool registry_device_supports(pdde_context *ctx, pdde_registry *r, int device, const pdde_tensor *node);
/* A family's name: its backend's, or a refused plugin's file name. */
PDDE_PRIVATE const char *registry_family_name(const registry_family *f);

/* base.c, errors: error_init/error_fini make and end a context's error state; error_vset records a
 * message (pdde_error's body, for callers with a va_list); error_clear forgets the calling thread's
 * and the context's message; error_count is how many errors this thread has raised so far and
 * error_here the message of its last one, on any context: so a caller can tell whether a call it
 * made raised a message, and read it whatever context the call raised it on. */
PDDE_PRIVATE void error_init(pdde_context *ctx);
PDDE_PRIVATE void error_fini(pdde_context *ctx);
PDDE_PRIVATE void error_vset(pdde_context *ctx, const char *fmt, va_list ap);
PDDE_PRIVATE void error_clear(pdde_context *ctx);
PDDE_PRIVATE uint64_t error_count(void);
PDDE_PRIVATE const char *error_here(void);
/* base.c: a line of the library's log (pdde_log_set), formatted (a trailing newline dropped) */
#define PDDE_HAS_LOG 1
PDDE_PRIVATE void pdde_log(pdde_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* ... and each line of text (a report written to a memory stream) */
PDDE_PRIVATE void pdde_log_lines(pdde_log_level level, const char *text);

/* env_values.c: the library's tuning variables, one policy for every layer. Unset or empty: the default
 * (*out = dflt, false). A value that parses whole within [lo, hi]: it (true). Anything else: the default,
 * and a warning on stderr naming the variable, the value, what is expected and the default (once per process
 * for each variable and value). pdde_env_bool takes 1/0, on/off, true/false, yes/no (any case) and gives
 * 1, 0 or dflt (-1: automatic); pdde_env_choice gives the index of the value in words[n], or dflt. */
PDDE_PRIVATE bool pdde_env_int(const char *name, long dflt, long lo, long hi, long *out);
PDDE_PRIVATE bool pdde_env_double(const char *name, double dflt, double lo, double hi, double *out);
PDDE_PRIVATE int pdde_env_bool(const char *name, int dflt);
PDDE_PRIVATE int pdde_env_choice(const char *name, const char *const *words, int n, int dflt);
/* The warning itself, for a reader of a value of another form (expected and used: words) */
PDDE_PRIVATE void pdde_env_warn(const char *name, const char *value, const char *expected, const char *used);

/* base.c: t's shape as [a,b,c]; the CRC-32 (zlib's) of n bytes continuing crc (0 to start). */
PDDE_PRIVATE void shape_str(const pdde_tensor *t, char *buf, size_t n);
PDDE_PRIVATE void dims_str(int ndim, const int64_t *shape, char *buf, size_t n); /* "[2,3]" */
PDDE_PRIVATE uint32_t crc32_update(uint32_t crc, const void *data, size_t n);

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
