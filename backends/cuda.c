/* backends/cuda.c — the CUDA backend: NVIDIA GPUs through the CUDA driver API, opened at run time.
 *
 * libcuda.so.1 is dlopen'ed and every cu* entry point resolved into a table in the family, so pdde
 * builds without the CUDA toolkit and runs where no driver is installed (the family then reports
 * PDDE_ERR_UNAVAILABLE). Kernels are CUDA C (backends/cuda_kernels.cu) compiled to PTX at build time
 * and embedded (backends/cuda_kernels_ptx.h, committed); the driver JITs them for the device when it
 * is opened. GEMM goes to cuBLAS (dlopen'ed too) and falls back to the tiled kernel k_gemm.
 *
 * Each device uses its primary context (the one the CUDA runtime and cuBLAS use), made current on the
 * calling thread at every entry point. Buffer handles are device pointers (CUdeviceptr) cast to void *.
 * Streams carry a small scratch buffer for multi-pass reductions, so concurrent streams never share it.
 *
 * Environment: PDDE_CUDA_NO_CUBLAS=1 uses the built-in GEMM; PDDE_CUDA_TF32=1 lets cuBLAS use TF32. */
#ifndef PDDE_NO_CUDA

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda_kernels_ptx.h"

/* The few driver API types and constants used (cuda.h is not needed to build). */
typedef int pcu_result;
typedef int pcu_device_t;
typedef unsigned long long pcu_ptr;
typedef struct pcu_ctx_st *pcu_ctx;
typedef struct pcu_mod_st *pcu_mod;
typedef struct pcu_fn_st *pcu_fn;
typedef struct pcu_stream_st *pcu_cstream;
typedef struct pcu_event_st *pcu_cevent;

enum {
    PCU_SUCCESS = 0,
    PCU_ERROR_OUT_OF_MEMORY = 2,
    PCU_ERROR_NO_DEVICE = 100,
    PCU_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    PCU_ATTR_CLOCK_RATE = 13,
    PCU_ATTR_MULTIPROCESSOR_COUNT = 16,
    PCU_ATTR_MEMORY_CLOCK_RATE = 36,
    PCU_ATTR_GLOBAL_MEMORY_BUS_WIDTH = 37,
    PCU_ATTR_CC_MAJOR = 75,
    PCU_ATTR_CC_MINOR = 76,
    PCU_JIT_INFO_LOG_BUFFER = 3,
    PCU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
    PCU_JIT_ERROR_LOG_BUFFER = 5,
    PCU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
    PCU_STREAM_NON_BLOCKING = 1,
    PCU_EVENT_DISABLE_TIMING = 2,
};

/* The driver entry points, resolved with dlsym (the _v2 names are what cuda.h maps the calls to). */
typedef struct {
    pcu_result (*Init)(unsigned);
    pcu_result (*DriverGetVersion)(int *);
    pcu_result (*DeviceGetCount)(int *);
    pcu_result (*DeviceGet)(pcu_device_t *, int);
    pcu_result (*DeviceGetName)(char *, int, pcu_device_t);
    pcu_result (*DeviceGetAttribute)(int *, int, pcu_device_t);
    pcu_result (*DeviceTotalMem)(size_t *, pcu_device_t);
    pcu_result (*DevicePrimaryCtxRetain)(pcu_ctx *, pcu_device_t);
    pcu_result (*DevicePrimaryCtxRelease)(pcu_device_t);
    pcu_result (*CtxSetCurrent)(pcu_ctx);
    pcu_result (*MemGetInfo)(size_t *, size_t *);
    pcu_result (*MemAlloc)(pcu_ptr *, size_t);
    pcu_result (*MemFree)(pcu_ptr);
    pcu_result (*MemcpyHtoDAsync)(pcu_ptr, const void *, size_t, pcu_cstream);
    pcu_result (*MemcpyDtoHAsync)(void *, pcu_ptr, size_t, pcu_cstream);
    pcu_result (*MemcpyDtoDAsync)(pcu_ptr, pcu_ptr, size_t, pcu_cstream);
    pcu_result (*MemsetD32Async)(pcu_ptr, unsigned, size_t, pcu_cstream);
    pcu_result (*ModuleLoadDataEx)(pcu_mod *, const void *, unsigned, int *, void **);
    pcu_result (*ModuleUnload)(pcu_mod);
    pcu_result (*ModuleGetFunction)(pcu_fn *, pcu_mod, const char *);
    pcu_result (*LaunchKernel)(pcu_fn, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                               pcu_cstream, void **, void **);
    pcu_result (*StreamCreate)(pcu_cstream *, unsigned);
    pcu_result (*StreamDestroy)(pcu_cstream);
    pcu_result (*StreamSynchronize)(pcu_cstream);
    pcu_result (*StreamWaitEvent)(pcu_cstream, pcu_cevent, unsigned);
    pcu_result (*EventCreate)(pcu_cevent *, unsigned);
    pcu_result (*EventDestroy)(pcu_cevent);
    pcu_result (*EventRecord)(pcu_cevent, pcu_cstream);
    pcu_result (*EventSynchronize)(pcu_cevent);
    pcu_result (*GetErrorName)(pcu_result, const char **);
} pcu_api;

static const struct { const char *name; size_t off; } pcu_syms[] = {
#define PCU_SYM(field, sym) {sym, offsetof(pcu_api, field)}
    PCU_SYM(Init, "cuInit"),
    PCU_SYM(DriverGetVersion, "cuDriverGetVersion"),
    PCU_SYM(DeviceGetCount, "cuDeviceGetCount"),
    PCU_SYM(DeviceGet, "cuDeviceGet"),
    PCU_SYM(DeviceGetName, "cuDeviceGetName"),
    PCU_SYM(DeviceGetAttribute, "cuDeviceGetAttribute"),
    PCU_SYM(DeviceTotalMem, "cuDeviceTotalMem_v2"),
    PCU_SYM(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    PCU_SYM(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    PCU_SYM(CtxSetCurrent, "cuCtxSetCurrent"),
    PCU_SYM(MemGetInfo, "cuMemGetInfo_v2"),
    PCU_SYM(MemAlloc, "cuMemAlloc_v2"),
    PCU_SYM(MemFree, "cuMemFree_v2"),
    PCU_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    PCU_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    PCU_SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    PCU_SYM(MemsetD32Async, "cuMemsetD32Async"),
    PCU_SYM(ModuleLoadDataEx, "cuModuleLoadDataEx"),
    PCU_SYM(ModuleUnload, "cuModuleUnload"),
    PCU_SYM(ModuleGetFunction, "cuModuleGetFunction"),
    PCU_SYM(LaunchKernel, "cuLaunchKernel"),
    PCU_SYM(StreamCreate, "cuStreamCreate"),
    PCU_SYM(StreamDestroy, "cuStreamDestroy_v2"),
    PCU_SYM(StreamSynchronize, "cuStreamSynchronize"),
    PCU_SYM(StreamWaitEvent, "cuStreamWaitEvent"),
    PCU_SYM(EventCreate, "cuEventCreate"),
    PCU_SYM(EventDestroy, "cuEventDestroy_v2"),
    PCU_SYM(EventRecord, "cuEventRecord"),
    PCU_SYM(EventSynchronize, "cuEventSynchronize"),
    PCU_SYM(GetErrorName, "cuGetErrorName"),
#undef PCU_SYM
};

/* cuBLAS (optional): the handful of entry points used for GEMM. */
typedef struct pcublas_ctx *pcublas_handle;
typedef struct {
    void *lib;
    int (*Create)(pcublas_handle *);
    int (*Destroy)(pcublas_handle);
    int (*SetStream)(pcublas_handle, pcu_cstream);
    int (*SetMathMode)(pcublas_handle, int);
    int (*SgemmStridedBatched)(pcublas_handle, int, int, int, int, int, const float *, const float *, int,
                               long long, const float *, int, long long, const float *, float *, int, long long,
                               int);
} pcublas_api;

/* Kernels of cuda_kernels.cu, looked up by name at device_open. */
enum {
    PCU_K_UNARY, PCU_K_UNARY_BACK, PCU_K_BINARY, PCU_K_BINARY_BCAST, PCU_K_GATHER, PCU_K_COPY2D,
    PCU_K_REDUCE_THREAD, PCU_K_REDUCE_BLOCK, PCU_K_COLSUM, PCU_K_SUM_PARTIAL, PCU_K_SUM_FINAL,
    PCU_K_LAYERNORM, PCU_K_LAYERNORM_BACK, PCU_K_RMSNORM, PCU_K_RMSNORM_BACK, PCU_K_ROW_STATS,
    PCU_K_GAMMA_BACK, PCU_K_SOFTMAX, PCU_K_SOFTMAX_BACK, PCU_K_CE_ROWS, PCU_K_CE_FINAL, PCU_K_CE_COUNT,
    PCU_K_CE_BACK, PCU_K_EMBEDDING, PCU_K_EMBEDDING_BACK, PCU_K_DROPOUT, PCU_K_CAST, PCU_K_SGD,
    PCU_K_ADAMW, PCU_K_GEMM, PCU_K_COUNT
};
static const char *const pcu_kernel_names[PCU_K_COUNT] = {
    "k_unary", "k_unary_back", "k_binary", "k_binary_bcast", "k_gather", "k_copy2d",
    "k_reduce_thread", "k_reduce_block", "k_colsum", "k_sum_partial", "k_sum_final",
    "k_layernorm", "k_layernorm_back", "k_rmsnorm", "k_rmsnorm_back", "k_row_stats",
    "k_gamma_back", "k_softmax", "k_softmax_back", "k_ce_rows", "k_ce_final", "k_ce_count",
    "k_ce_back", "k_embedding", "k_embedding_back", "k_dropout", "k_cast", "k_sgd",
    "k_adamw", "k_gemm",
};

/* Mirrors of the kernel structs (same field order and types as in cuda_kernels.cu). */
#define PCU_MAX_DIMS 6
typedef struct {
    long long ndim;
    long long shape[PCU_MAX_DIMS];
    long long sa[PCU_MAX_DIMS];
    long long sb[PCU_MAX_DIMS];
} pcu_shape;
typedef struct {
    long long nk, nr;
    long long kshape[PCU_MAX_DIMS], kstride[PCU_MAX_DIMS];
    long long rshape[PCU_MAX_DIMS], rstride[PCU_MAX_DIMS];
} pcu_reduce_desc;

enum { PCU_U_SCALE = 0, PCU_U_GELU, PCU_U_RELU, PCU_U_SILU };
enum { PCU_B_ADD = 0, PCU_B_SUB, PCU_B_MUL };

typedef struct {
    char name[128];
    uint64_t memory;
    int sm_count, cc_major, cc_minor, clock_khz, mem_clock_khz, bus_bits;
} pcu_dev_info;

typedef struct {
    pdde_context *ctx;
    void *lib;
    pcu_api cu;
    pcublas_api blas; /* blas.lib NULL: no cuBLAS */
    int driver_version;
    int n_devices;
    pcu_dev_info *info;
} pcu_family;

typedef struct {
    pcu_cstream s;
    pcu_ptr scratch;
    size_t scratch_bytes;
} pcu_stream;

typedef struct {
    pcu_family *fam;
    int index;
    pcu_device_t cu_dev;
    pcu_ctx cu_ctx;
    pcu_mod mod;
    pcu_fn fn[PCU_K_COUNT];
    pcublas_handle blas;
    pcu_stream *default_stream;
    int sm_count;
} pcu_dev;

/* --------------------------------------------------------------------------------------------------
 * Errors */

static int pcu_fail(pcu_family *f, pcu_result r, const char *what, size_t nbytes) {
    const char *name = NULL;
    if (f->cu.GetErrorName) f->cu.GetErrorName(r, &name);
    if (r == PCU_ERROR_OUT_OF_MEMORY)
        return pdde_error(f->ctx, PDDE_ERR_DEVICE_OOM, "cuda: %s: out of device memory (%zu bytes requested)", what,
                          nbytes);
    return pdde_error(f->ctx, PDDE_ERR_BACKEND, "cuda: %s failed: %s (%d)", what, name ? name : "unknown error", r);
}

#define PCU_CHECK(dev, call, what)                                              \
    do {                                                                        \
        pcu_result r_ = (call);                                                 \
        if (r_ != PCU_SUCCESS) return pcu_fail((dev)->fam, r_, (what), 0);      \
    } while (0)

static int pcu_bind(pcu_dev *d) {
    pcu_result r = d->fam->cu.CtxSetCurrent(d->cu_ctx);
    return r == PCU_SUCCESS ? PDDE_OK : pcu_fail(d->fam, r, "cuCtxSetCurrent", 0);
}

/* --------------------------------------------------------------------------------------------------
 * Family */

static void pcu_load_cublas(pcu_family *f) {
    static const char *const names[] = {
        "libcublas.so.13", "libcublas.so.12", "libcublas.so",
        "/usr/local/cuda/lib64/libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.12",
        "/usr/local/cuda/lib64/libcublas.so",
    };
    const char *env = getenv("PDDE_CUDA_NO_CUBLAS");
    if (env && env[0] && strcmp(env, "0") != 0) return;
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    pcublas_api b = {0};
    b.lib = lib;
    *(void **)&b.Create = dlsym(lib, "cublasCreate_v2");
    *(void **)&b.Destroy = dlsym(lib, "cublasDestroy_v2");
    *(void **)&b.SetStream = dlsym(lib, "cublasSetStream_v2");
    *(void **)&b.SetMathMode = dlsym(lib, "cublasSetMathMode");
    *(void **)&b.SgemmStridedBatched = dlsym(lib, "cublasSgemmStridedBatched");
    if (!b.Create || !b.Destroy || !b.SetStream || !b.SgemmStridedBatched) {
        dlclose(lib);
        return;
    }
    f->blas = b;
}

static pdde_status pcu_init(pdde_context *ctx, void **family, int *n_devices) {
    *family = NULL;
    *n_devices = 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no CUDA driver (libcuda.so.1 not found)");
    pcu_family *f = calloc(1, sizeof *f);
    if (!f) {
        dlclose(lib);
        return pdde_error(ctx, PDDE_ERR_OOM, "cuda: out of host memory");
    }
    f->ctx = ctx;
    f->lib = lib;
    for (size_t i = 0; i < sizeof pcu_syms / sizeof pcu_syms[0]; i++) {
        void *p = dlsym(lib, pcu_syms[i].name);
        if (!p) {
            pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "CUDA driver too old: libcuda.so.1 lacks %s", pcu_syms[i].name);
            dlclose(lib);
            free(f);
            return PDDE_ERR_UNAVAILABLE;
        }
        memcpy((char *)&f->cu + pcu_syms[i].off, &p, sizeof p);
    }
    pcu_result r = f->cu.Init(0);
    int count = 0;
    if (r == PCU_SUCCESS) r = f->cu.DeviceGetCount(&count);
    if (r != PCU_SUCCESS || count <= 0) {
        const char *name = NULL;
        f->cu.GetErrorName(r, &name);
        if (r == PCU_ERROR_NO_DEVICE || (r == PCU_SUCCESS && count <= 0))
            pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no CUDA device (the driver found none)");
        else
            pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "CUDA driver failed to initialise: %s (%d)", name ? name : "?", r);
        /* libcuda stays loaded: unloading a driver library after cuInit is not safe. */
        free(f);
        return PDDE_ERR_UNAVAILABLE;
    }
    f->cu.DriverGetVersion(&f->driver_version);
    f->info = calloc((size_t)count, sizeof *f->info);
    if (!f->info) {
        free(f);
        return pdde_error(ctx, PDDE_ERR_OOM, "cuda: out of host memory");
    }
    for (int i = 0; i < count; i++) {
        pcu_dev_info *in = &f->info[i];
        pcu_device_t dv;
        if (f->cu.DeviceGet(&dv, i) != PCU_SUCCESS) continue;
        if (f->cu.DeviceGetName(in->name, sizeof in->name, dv) != PCU_SUCCESS) snprintf(in->name, sizeof in->name, "CUDA device %d", i);
        size_t mem = 0;
        if (f->cu.DeviceTotalMem(&mem, dv) == PCU_SUCCESS) in->memory = mem;
        f->cu.DeviceGetAttribute(&in->sm_count, PCU_ATTR_MULTIPROCESSOR_COUNT, dv);
        f->cu.DeviceGetAttribute(&in->cc_major, PCU_ATTR_CC_MAJOR, dv);
        f->cu.DeviceGetAttribute(&in->cc_minor, PCU_ATTR_CC_MINOR, dv);
        f->cu.DeviceGetAttribute(&in->clock_khz, PCU_ATTR_CLOCK_RATE, dv);
        f->cu.DeviceGetAttribute(&in->mem_clock_khz, PCU_ATTR_MEMORY_CLOCK_RATE, dv);
        f->cu.DeviceGetAttribute(&in->bus_bits, PCU_ATTR_GLOBAL_MEMORY_BUS_WIDTH, dv);
    }
    f->n_devices = count;
    pcu_load_cublas(f);
    *family = f;
    *n_devices = count;
    return PDDE_OK;
}

static void pcu_free(void *family) {
    pcu_family *f = family;
    if (!f) return;
    /* cuBLAS and libcuda stay loaded (their teardown at exit must find them mapped). */
    free(f->info);
    free(f);
}

static pdde_status pcu_device_props(void *family, int index, pdde_device_props *out) {
    pcu_family *f = family;
    if (index < 0 || index >= f->n_devices) return pdde_error(f->ctx, PDDE_ERR_INVALID_ARG, "cuda: no device %d", index);
    const pcu_dev_info *in = &f->info[index];
    memset(out, 0, sizeof *out);
    out->kind = PDDE_DEVICE_GPU;
    snprintf(out->name, sizeof out->name, "%s", in->name);
    snprintf(out->backend, sizeof out->backend, "cuda");
    out->memory_total = in->memory;
    out->compute_units = in->sm_count;
    /* FP32 lanes per SM: 64 on Volta, Turing and A100; 128 on GA10x, Ada, Hopper and later. */
    int lanes = (in->cc_major >= 9 || (in->cc_major == 8 && in->cc_minor > 0)) ? 128 : 64;
    out->peak_flops_f32 = 2.0 * lanes * (double)in->sm_count * (double)in->clock_khz * 1e3;
    out->mem_bandwidth = 2.0 * (double)in->mem_clock_khz * 1e3 * (double)in->bus_bits / 8.0;
    return PDDE_OK;
}

/* --------------------------------------------------------------------------------------------------
 * Devices, streams, buffers, events */

static pdde_status pcu_stream_new(pcu_dev *d, pcu_stream **out) {
    pcu_stream *s = calloc(1, sizeof *s);
    if (!s) return pdde_error(d->fam->ctx, PDDE_ERR_OOM, "cuda: out of host memory");
    pcu_result r = d->fam->cu.StreamCreate(&s->s, PCU_STREAM_NON_BLOCKING);
    if (r != PCU_SUCCESS) {
        free(s);
        return pcu_fail(d->fam, r, "cuStreamCreate", 0);
    }
    *out = s;
    return PDDE_OK;
}

static void pcu_stream_delete(pcu_dev *d, pcu_stream *s) {
    if (!s) return;
    d->fam->cu.StreamSynchronize(s->s);
    if (s->scratch) d->fam->cu.MemFree(s->scratch);
    d->fam->cu.StreamDestroy(s->s);
    free(s);
}

static void pcu_device_close(void *dev);

static pdde_status pcu_load_module(pcu_dev *d) {
    pcu_family *f = d->fam;
    char elog[4096] = "";
    int opts[2] = {PCU_JIT_ERROR_LOG_BUFFER, PCU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {elog, (void *)(uintptr_t)sizeof elog};
    pcu_result r = f->cu.ModuleLoadDataEx(&d->mod, pdde_cuda_ptx, 2, opts, vals);
    if (r == PCU_ERROR_UNSUPPORTED_PTX_VERSION) {
        /* A driver older than the nvcc that wrote the PTX: the kernels use no recent PTX feature, so
         * declaring an older ISA version lets such drivers JIT them. */
        size_t n = strlen(pdde_cuda_ptx);
        char *ptx = malloc(n + 1);
        if (!ptx) return pdde_error(f->ctx, PDDE_ERR_OOM, "cuda: out of host memory");
        memcpy(ptx, pdde_cuda_ptx, n + 1);
        char *v = strstr(ptx, ".version ");
        if (v) memcpy(v, ".version 7.0", 12);
        elog[0] = 0;
        r = f->cu.ModuleLoadDataEx(&d->mod, ptx, 2, opts, vals);
        free(ptx);
    }
    if (r != PCU_SUCCESS) {
        const char *name = NULL;
        f->cu.GetErrorName(r, &name);
        return pdde_error(f->ctx, PDDE_ERR_BUILD, "cuda: loading the kernels failed: %s (%d) (driver %d): %s",
                          name ? name : "?", r, f->driver_version, elog);
    }
    for (int k = 0; k < PCU_K_COUNT; k++) {
        r = f->cu.ModuleGetFunction(&d->fn[k], d->mod, pcu_kernel_names[k]);
        if (r != PCU_SUCCESS)
            return pdde_error(f->ctx, PDDE_ERR_BUILD, "cuda: kernel %s missing from the module", pcu_kernel_names[k]);
    }
    return PDDE_OK;
}

static pdde_status pcu_device_open(void *family, int index, void **out) {
    pcu_family *f = family;
    *out = NULL;
    if (index < 0 || index >= f->n_devices) return pdde_error(f->ctx, PDDE_ERR_INVALID_ARG, "cuda: no device %d", index);
    pcu_dev *d = calloc(1, sizeof *d);
    if (!d) return pdde_error(f->ctx, PDDE_ERR_OOM, "cuda: out of host memory");
    d->fam = f;
    d->index = index;
    d->sm_count = f->info[index].sm_count > 0 ? f->info[index].sm_count : 1;
    pcu_result r = f->cu.DeviceGet(&d->cu_dev, index);
    if (r != PCU_SUCCESS) {
        free(d);
        return pcu_fail(f, r, "cuDeviceGet", 0);
    }
    r = f->cu.DevicePrimaryCtxRetain(&d->cu_ctx, d->cu_dev);
    if (r != PCU_SUCCESS) {
        free(d);
        return pcu_fail(f, r, "cuDevicePrimaryCtxRetain", 0);
    }
    int st = pcu_bind(d);
    if (st == PDDE_OK) st = pcu_load_module(d);
    if (st == PDDE_OK) st = pcu_stream_new(d, &d->default_stream);
    if (st != PDDE_OK) {
        pcu_device_close(d);
        return st;
    }
    if (f->blas.lib) {
        if (f->blas.Create(&d->blas) != 0) d->blas = NULL; /* falls back to k_gemm */
        else {
            const char *tf = getenv("PDDE_CUDA_TF32");
            if (f->blas.SetMathMode && tf && tf[0] == '1') f->blas.SetMathMode(d->blas, 3 /* TF32 tensor op */);
        }
    }
    *out = d;
    return PDDE_OK;
}

static void pcu_device_close(void *dev) {
    pcu_dev *d = dev;
    if (!d) return;
    pcu_family *f = d->fam;
    if (d->cu_ctx) {
        f->cu.CtxSetCurrent(d->cu_ctx);
        if (d->blas) f->blas.Destroy(d->blas);
        pcu_stream_delete(d, d->default_stream);
        if (d->mod) f->cu.ModuleUnload(d->mod);
        f->cu.DevicePrimaryCtxRelease(d->cu_dev);
    }
    free(d);
}

static pdde_status pcu_buffer_alloc(void *dev, size_t nbytes, void **handle) {
    pcu_dev *d = dev;
    *handle = NULL;
    int st = pcu_bind(d);
    if (st) return st;
    pcu_ptr p = 0;
    pcu_result r = d->fam->cu.MemAlloc(&p, nbytes ? nbytes : 4);
    if (r != PCU_SUCCESS) return pcu_fail(d->fam, r, "cuMemAlloc", nbytes);
    *handle = (void *)(uintptr_t)p;
    return PDDE_OK;
}

static void pcu_buffer_free(void *dev, void *handle) {
    pcu_dev *d = dev;
    if (!handle) return;
    if (pcu_bind(d)) return;
    d->fam->cu.MemFree((pcu_ptr)(uintptr_t)handle);
}

static pcu_stream *pcu_st(pcu_dev *d, void *stream) { return stream ? (pcu_stream *)stream : d->default_stream; }

static pdde_status pcu_write(void *dev, void *stream, void *handle, size_t offset, const void *src, size_t n) {
    pcu_dev *d = dev;
    if (!n) return PDDE_OK;
    int st = pcu_bind(d);
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.MemcpyHtoDAsync((pcu_ptr)(uintptr_t)handle + offset, src, n, pcu_st(d, stream)->s),
              "cuMemcpyHtoDAsync");
    return PDDE_OK;
}

static pdde_status pcu_read(void *dev, void *stream, void *handle, size_t offset, void *dst, size_t n) {
    pcu_dev *d = dev;
    if (!n) return PDDE_OK;
    int st = pcu_bind(d);
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.MemcpyDtoHAsync(dst, (pcu_ptr)(uintptr_t)handle + offset, n, pcu_st(d, stream)->s),
              "cuMemcpyDtoHAsync");
    return PDDE_OK;
}

static pdde_status pcu_stream_create(void *dev, void **stream) {
    pcu_dev *d = dev;
    *stream = NULL;
    int st = pcu_bind(d);
    if (st) return st;
    pcu_stream *s;
    st = pcu_stream_new(d, &s);
    if (st) return st;
    *stream = s;
    return PDDE_OK;
}

static void pcu_stream_free(void *dev, void *stream) {
    pcu_dev *d = dev;
    if (!stream || pcu_bind(d)) return;
    pcu_stream_delete(d, stream);
}

static pdde_status pcu_stream_sync(void *dev, void *stream) {
    pcu_dev *d = dev;
    int st = pcu_bind(d);
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.StreamSynchronize(pcu_st(d, stream)->s), "cuStreamSynchronize");
    return PDDE_OK;
}

static pdde_status pcu_event_create(void *dev, void **event) {
    pcu_dev *d = dev;
    *event = NULL;
    int st = pcu_bind(d);
    if (st) return st;
    pcu_cevent e;
    PCU_CHECK(d, d->fam->cu.EventCreate(&e, PCU_EVENT_DISABLE_TIMING), "cuEventCreate");
    *event = e;
    return PDDE_OK;
}

static void pcu_event_free(void *dev, void *event) {
    pcu_dev *d = dev;
    if (!event || pcu_bind(d)) return;
    d->fam->cu.EventDestroy(event);
}

static pdde_status pcu_event_record(void *dev, void *event, void *stream) {
    pcu_dev *d = dev;
    int st = pcu_bind(d);
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.EventRecord(event, pcu_st(d, stream)->s), "cuEventRecord");
    return PDDE_OK;
}

static pdde_status pcu_event_sync(void *dev, void *event) {
    pcu_dev *d = dev;
    int st = pcu_bind(d);
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.EventSynchronize(event), "cuEventSynchronize");
    return PDDE_OK;
}

static pdde_status pcu_stream_wait_event(void *dev, void *stream, void *event) {
    pcu_dev *d = dev;
    int st = pcu_bind(d);
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.StreamWaitEvent(pcu_st(d, stream)->s, event, 0), "cuStreamWaitEvent");
    return PDDE_OK;
}

/* --------------------------------------------------------------------------------------------------
 * Ops */

static int pcu_is_float_op_input(const pdde_tensor *t) { return t && t->dtype == PDDE_F32; }

static int pcu_supports_op(void *dev, const pdde_tensor *node) {
    (void)dev;
    if (!node) return 0;
    switch (node->op) {
    case PDDE_OP_NONE:
    case PDDE_OP_COPY:
    case PDDE_OP_COUNT:
        return 0;
    case PDDE_OP_CAST:
        return node->nsrc == 1 && (unsigned)node->src[0]->dtype < PDDE_DTYPE_COUNT && (unsigned)node->dtype < PDDE_DTYPE_COUNT;
    case PDDE_OP_RESHAPE:
        return node->nsrc == 1 && node->dtype == node->src[0]->dtype;
    default: break;
    }
    if ((unsigned)node->op >= PDDE_OP_COUNT || node->dtype != PDDE_F32) return 0;
    if (node->ndim > PCU_MAX_DIMS) return 0;
    for (int i = 0; i < node->nsrc; i++) {
        const pdde_tensor *s = node->src[i];
        if (!s) return 0;
        int want_i32 = ((node->op == PDDE_OP_EMBEDDING || node->op == PDDE_OP_CROSS_ENTROPY ||
                         node->op == PDDE_OP_CROSS_ENTROPY_BACK) && i == 1) ||
                       (node->op == PDDE_OP_EMBEDDING_BACK && i == 1);
        if (want_i32 ? s->dtype != PDDE_I32 : !pcu_is_float_op_input(s)) return 0;
        if (s->ndim > PCU_MAX_DIMS) return 0;
    }
    return 1;
}

static inline pcu_ptr pcu_ptr_of(const pdde_tensor *t) { return (pcu_ptr)(uintptr_t)t->data + t->offset; }

static int64_t pcu_numel(const pdde_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static unsigned pcu_grid(pcu_dev *d, int64_t n, unsigned block) {
    int64_t g = (n + block - 1) / block, cap = (int64_t)d->sm_count * 32;
    if (g > cap) g = cap;
    return g < 1 ? 1u : (unsigned)g;
}

/* Threads for one block per row of C: enough for ~4 elements each, a multiple of 32, at most 1024. */
static unsigned pcu_row_block(int64_t C) {
    unsigned t = 32;
    while (t < 1024 && (int64_t)t * 4 < C) t *= 2;
    return t;
}

static unsigned pcu_rows_grid(int64_t rows) { return rows < 1 ? 1u : rows > (1 << 20) ? (1u << 20) : (unsigned)rows; }

static int pcu_launch(pcu_dev *d, pcu_stream *s, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                      unsigned by, void **args) {
    pcu_result r = d->fam->cu.LaunchKernel(d->fn[k], gx, gy, gz, bx, by, 1, 0, s->s, args, NULL);
    if (r != PCU_SUCCESS) {
        const char *name = NULL;
        d->fam->cu.GetErrorName(r, &name);
        return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: launching %s failed: %s (%d)", pcu_kernel_names[k],
                          name ? name : "?", r);
    }
    return PDDE_OK;
}

/* Per-stream scratch of at least nbytes (grown by reallocation after the stream drains). */
static int pcu_scratch(pcu_dev *d, pcu_stream *s, size_t nbytes, pcu_ptr *out) {
    if (s->scratch_bytes < nbytes) {
        size_t want = nbytes < 65536 ? 65536 : nbytes;
        if (s->scratch) {
            PCU_CHECK(d, d->fam->cu.StreamSynchronize(s->s), "cuStreamSynchronize");
            d->fam->cu.MemFree(s->scratch);
            s->scratch = 0;
            s->scratch_bytes = 0;
        }
        pcu_result r = d->fam->cu.MemAlloc(&s->scratch, want);
        if (r != PCU_SUCCESS) return pcu_fail(d->fam, r, "cuMemAlloc (scratch)", want);
        s->scratch_bytes = want;
    }
    *out = s->scratch;
    return PDDE_OK;
}

/* The shape of t right-aligned to nd dims (leading 1s), with contiguous strides (0 where broadcast
 * onto out_shape). */
static void pcu_bcast_strides(const pdde_tensor *t, int nd, const int64_t *out_shape, long long *strides) {
    int64_t sh[PCU_MAX_DIMS];
    int off = nd - t->ndim;
    for (int i = 0; i < nd; i++) sh[i] = i < off ? 1 : t->shape[i - off];
    long long st = 1;
    for (int i = nd - 1; i >= 0; i--) {
        strides[i] = (sh[i] == 1 && out_shape[i] != 1) ? 0 : st;
        st *= sh[i];
    }
}

/* b is a suffix of out's shape (after dropping b's leading 1s): a bias repeated over leading dims. */
static int pcu_is_suffix(const pdde_tensor *b, const pdde_tensor *out) {
    int bi = 0;
    while (bi < b->ndim && b->shape[bi] == 1) bi++;
    int nb = b->ndim - bi;
    if (nb > out->ndim) return 0;
    for (int i = 0; i < nb; i++)
        if (b->shape[bi + i] != out->shape[out->ndim - nb + i]) return 0;
    return 1;
}

static int pcu_binary(pcu_dev *d, pcu_stream *s, pdde_tensor *node, int op) {
    pdde_tensor *a = node->src[0], *b = node->src[1];
    long long n = pcu_numel(node);
    if (!n) return PDDE_OK;
    pcu_ptr pa = pcu_ptr_of(a), pb = pcu_ptr_of(b), py = pcu_ptr_of(node);
    int opi = op;
    /* a not broadcast (equal counts of broadcast-compatible shapes) and b a trailing block */
    if (pcu_numel(a) == n && pcu_is_suffix(b, node)) {
        long long nb = pcu_numel(b);
        void *args[] = {&pa, &pb, &py, &n, &nb, &opi};
        return pcu_launch(d, s, PCU_K_BINARY, pcu_grid(d, n, 256), 1, 1, 256, 1, args);
    }
    pcu_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.ndim = node->ndim;
    for (int i = 0; i < node->ndim; i++) sh.shape[i] = node->shape[i];
    pcu_bcast_strides(a, node->ndim, node->shape, sh.sa);
    pcu_bcast_strides(b, node->ndim, node->shape, sh.sb);
    void *args[] = {&pa, &pb, &py, &n, &sh, &opi};
    return pcu_launch(d, s, PCU_K_BINARY_BCAST, pcu_grid(d, n, 256), 1, 1, 256, 1, args);
}

static int pcu_unary(pcu_dev *d, pcu_stream *s, pdde_tensor *node, int op, float a) {
    long long n = pcu_numel(node);
    if (!n) return PDDE_OK;
    pcu_ptr px = pcu_ptr_of(node->src[0]), py = pcu_ptr_of(node);
    int opi = op;
    void *args[] = {&px, &py, &n, &opi, &a};
    return pcu_launch(d, s, PCU_K_UNARY, pcu_grid(d, (n + 3) / 4, 256), 1, 1, 256, 1, args);
}

static int pcu_unary_back(pcu_dev *d, pcu_stream *s, pdde_tensor *node, int op) {
    long long n = pcu_numel(node);
    if (!n) return PDDE_OK;
    pcu_ptr px = pcu_ptr_of(node->src[0]), pdy = pcu_ptr_of(node->src[1]), pdx = pcu_ptr_of(node);
    int opi = op;
    void *args[] = {&px, &pdy, &pdx, &n, &opi};
    return pcu_launch(d, s, PCU_K_UNARY_BACK, pcu_grid(d, n, 256), 1, 1, 256, 1, args);
}

/* y = scale * sum of x over the dims marked in red[] (x's dims; y holds the kept ones in order). */
static int pcu_reduce(pcu_dev *d, pcu_stream *s, pcu_ptr px, const int64_t *xshape, int nd, const int *red,
                      pcu_ptr py, float scale) {
    pcu_reduce_desc r;
    memset(&r, 0, sizeof r);
    long long stride[PCU_MAX_DIMS], st = 1, nout = 1, nred = 1;
    for (int i = nd - 1; i >= 0; i--) {
        stride[i] = st;
        st *= xshape[i];
    }
    long long n = st;
    if (!n) return PDDE_OK;
    int max_red = -1, min_kept = nd, max_kept = -1;
    for (int i = 0; i < nd; i++) {
        if (xshape[i] == 1) continue; /* size-1 dims neither add work nor move data */
        if (red[i]) {
            r.rshape[r.nr] = xshape[i];
            r.rstride[r.nr++] = stride[i];
            nred *= xshape[i];
            max_red = i;
        } else {
            r.kshape[r.nk] = xshape[i];
            r.kstride[r.nk++] = stride[i];
            nout *= xshape[i];
            if (i < min_kept) min_kept = i;
            max_kept = i;
        }
    }
    if (nout == 1) { /* everything reduced: two passes over the contiguous data */
        unsigned blocks = pcu_grid(d, n, 256);
        if (blocks > 1024) blocks = 1024;
        pcu_ptr part;
        int e = pcu_scratch(d, s, (size_t)blocks * sizeof(float), &part);
        if (e) return e;
        int square = 0;
        void *a1[] = {&px, &n, &square, &part};
        e = pcu_launch(d, s, PCU_K_SUM_PARTIAL, blocks, 1, 1, 256, 1, a1);
        if (e) return e;
        long long np = blocks;
        pcu_ptr prev = 0;
        void *a2[] = {&part, &np, &prev, &scale, &py};
        return pcu_launch(d, s, PCU_K_SUM_FINAL, 1, 1, 1, 256, 1, a2);
    }
    if (nred == 1) { /* nothing to sum: a scaled copy */
        int op = PCU_U_SCALE;
        void *args[] = {&px, &py, &n, &op, &scale};
        return pcu_launch(d, s, PCU_K_UNARY, pcu_grid(d, (n + 3) / 4, 256), 1, 1, 256, 1, args);
    }
    if (max_red < min_kept) { /* reduced dims lead, kept dims trail: column sums of [nred, nout] */
        void *args[] = {&px, &py, &nred, &nout, &scale};
        return pcu_launch(d, s, PCU_K_COLSUM, (unsigned)((nout + 31) / 32), 1, 1, 32, 32, args);
    }
    if (max_red > max_kept) { /* the innermost data is reduced: a block per output */
        void *args[] = {&px, &py, &nout, &nred, &r, &scale};
        return pcu_launch(d, s, PCU_K_REDUCE_BLOCK, pcu_rows_grid(nout), 1, 1, pcu_row_block(nred), 1, args);
    }
    void *args[] = {&px, &py, &nout, &nred, &r, &scale};
    return pcu_launch(d, s, PCU_K_REDUCE_THREAD, pcu_grid(d, nout, 256), 1, 1, 256, 1, args);
}

static int pcu_matmul(pcu_dev *d, pcu_stream *s, pdde_tensor *node) {
    pdde_tensor *a = node->src[0], *b = node->src[1];
    int ta = node->iparams[0] != 0, tb = node->iparams[1] != 0;
    int64_t M = node->shape[node->ndim - 2], N = node->shape[node->ndim - 1];
    int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    int64_t batch = M && N ? pcu_numel(node) / (M * N) : 0;
    if (!batch || !M || !N) return PDDE_OK;
    long long sA = pcu_numel(a) == batch * M * K ? (long long)(M * K) : 0;
    long long sB = pcu_numel(b) == batch * K * N ? (long long)(K * N) : 0;
    long long sC = (long long)(M * N);
    pcu_ptr pa = pcu_ptr_of(a), pb = pcu_ptr_of(b), pc = pcu_ptr_of(node);
    if (K == 0) {
        PCU_CHECK(d, d->fam->cu.MemsetD32Async(pc, 0, (size_t)(batch * M * N), s->s), "cuMemsetD32Async");
        return PDDE_OK;
    }
    if (d->blas && M < INT32_MAX && N < INT32_MAX && K < INT32_MAX && batch < INT32_MAX) {
        const pcublas_api *bl = &d->fam->blas;
        if (bl->SetStream(d->blas, s->s) == 0) {
            float one = 1.0f, zero = 0.0f;
            /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
            int opB = tb ? 1 : 0, opA = ta ? 1 : 0;
            int ldb = (int)(tb ? K : N), lda = (int)(ta ? M : K);
            int st = bl->SgemmStridedBatched(d->blas, opB, opA, (int)N, (int)M, (int)K, &one,
                                             (const float *)(uintptr_t)pb, ldb, sB, (const float *)(uintptr_t)pa, lda,
                                             sA, &zero, (float *)(uintptr_t)pc, (int)N, sC, (int)batch);
            if (st == 0) return PDDE_OK;
            return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: cublasSgemmStridedBatched failed: status %d", st);
        }
    }
    int Mi = (int)M, Ni = (int)N, Ki = (int)K;
    for (int64_t b0 = 0; b0 < batch; b0 += 65535) {
        int64_t nb = batch - b0 < 65535 ? batch - b0 : 65535;
        pcu_ptr qa = pa + (pcu_ptr)(b0 * sA * 4), qb = pb + (pcu_ptr)(b0 * sB * 4), qc = pc + (pcu_ptr)(b0 * sC * 4);
        void *args[] = {&qa, &qb, &qc, &Mi, &Ni, &Ki, &ta, &tb, &sA, &sB, &sC};
        int e = pcu_launch(d, s, PCU_K_GEMM, (unsigned)((N + 63) / 64), (unsigned)((M + 63) / 64), (unsigned)nb, 256, 1,
                           args);
        if (e) return e;
    }
    return PDDE_OK;
}

static int pcu_copy2d(pcu_dev *d, pcu_stream *s, pcu_ptr src, pcu_ptr dst, long long outer, long long rowlen,
                      long long sp, long long soff, long long dp, long long doff) {
    long long n = outer * rowlen;
    if (!n) return PDDE_OK;
    void *args[] = {&src, &dst, &outer, &rowlen, &sp, &soff, &dp, &doff};
    return pcu_launch(d, s, PCU_K_COPY2D, pcu_grid(d, n, 256), 1, 1, 256, 1, args);
}

static void pcu_axis_split(const pdde_tensor *t, int axis, long long *outer, long long *inner) {
    long long o = 1, in = 1;
    for (int i = 0; i < axis; i++) o *= t->shape[i];
    for (int i = axis + 1; i < t->ndim; i++) in *= t->shape[i];
    *outer = o;
    *inner = in;
}

static int pcu_norm_rows(const pdde_tensor *x, long long *rows, long long *C) {
    *C = x->ndim ? x->shape[x->ndim - 1] : 1;
    *rows = *C ? pcu_numel(x) / *C : 0;
    return *rows > 0 && *C > 0;
}

static int pcu_row_op(pcu_dev *d, pcu_stream *s, int k, long long rows, long long C, void **args) {
    return pcu_launch(d, s, k, pcu_rows_grid(rows), 1, 1, pcu_row_block(C), 1, args);
}

static int pcu_gamma_back(pcu_dev *d, pcu_stream *s, pdde_tensor *node, int rms) {
    pdde_tensor *x = node->src[0], *dy = node->src[1];
    long long rows, C;
    if (!pcu_norm_rows(x, &rows, &C)) return PDDE_OK;
    float eps = node->fparams[0];
    pcu_ptr stats;
    int e = pcu_scratch(d, s, (size_t)rows * 2 * sizeof(float), &stats);
    if (e) return e;
    pcu_ptr px = pcu_ptr_of(x), pdy = pcu_ptr_of(dy), pg = pcu_ptr_of(node);
    void *a1[] = {&px, &stats, &rows, &C, &eps, &rms};
    e = pcu_row_op(d, s, PCU_K_ROW_STATS, rows, C, a1);
    if (e) return e;
    void *a2[] = {&px, &pdy, &stats, &pg, &rows, &C};
    return pcu_launch(d, s, PCU_K_GAMMA_BACK, (unsigned)((C + 31) / 32), 1, 1, 32, 32, a2);
}

static int pcu_cross_entropy(pcu_dev *d, pcu_stream *s, pdde_tensor *node) {
    pdde_tensor *lg = node->src[0], *tg = node->src[1];
    long long rows, V;
    pcu_ptr py = pcu_ptr_of(node);
    if (!pcu_norm_rows(lg, &rows, &V)) {
        PCU_CHECK(d, d->fam->cu.MemsetD32Async(py, 0, 1, s->s), "cuMemsetD32Async");
        return PDDE_OK;
    }
    pcu_ptr part;
    int e = pcu_scratch(d, s, (size_t)rows * 2 * sizeof(float), &part);
    if (e) return e;
    pcu_ptr pl = pcu_ptr_of(lg), pt = pcu_ptr_of(tg);
    void *a1[] = {&pl, &pt, &part, &rows, &V};
    e = pcu_row_op(d, s, PCU_K_CE_ROWS, rows, V, a1);
    if (e) return e;
    void *a2[] = {&part, &rows, &py};
    return pcu_launch(d, s, PCU_K_CE_FINAL, 1, 1, 1, 1024, 1, a2);
}

static int pcu_cross_entropy_back(pcu_dev *d, pcu_stream *s, pdde_tensor *node) {
    pdde_tensor *lg = node->src[0], *tg = node->src[1], *dl = node->src[2];
    long long rows, V;
    if (!pcu_norm_rows(lg, &rows, &V)) return PDDE_OK;
    pcu_ptr cnt;
    int e = pcu_scratch(d, s, sizeof(float), &cnt);
    if (e) return e;
    pcu_ptr pl = pcu_ptr_of(lg), pt = pcu_ptr_of(tg), pd = pcu_ptr_of(dl), px = pcu_ptr_of(node);
    void *a1[] = {&pt, &rows, &V, &cnt};
    e = pcu_launch(d, s, PCU_K_CE_COUNT, 1, 1, 1, 1024, 1, a1);
    if (e) return e;
    void *a2[] = {&pl, &pt, &pd, &cnt, &px, &rows, &V};
    return pcu_row_op(d, s, PCU_K_CE_BACK, rows, V, a2);
}

static int pcu_dcopy(pcu_dev *d, pcu_stream *s, pcu_ptr dst, pcu_ptr src, size_t n) {
    if (dst == src || !n) return PDDE_OK;
    PCU_CHECK(d, d->fam->cu.MemcpyDtoDAsync(dst, src, n, s->s), "cuMemcpyDtoDAsync");
    return PDDE_OK;
}

static float pcu_gscale(const pdde_tensor *node) { return node->fparams[6] != 0.0f ? node->fparams[6] : 1.0f; }

static pdde_status pcu_compute(void *dev, void *stream, pdde_tensor *node) {
    pcu_dev *d = dev;
    pcu_stream *s = pcu_st(d, stream);
    int e = pcu_bind(d);
    if (e) return e;
    if (!pcu_supports_op(d, node))
        return pdde_error(d->fam->ctx, PDDE_ERR_UNSUPPORTED, "cuda: op %s on %s (%s) is not supported",
                          pdde_op_name(node->op), node->name, pdde_dtype_name(node->dtype));
    long long n = pcu_numel(node);
    pdde_tensor *x = node->nsrc > 0 ? node->src[0] : NULL;
    switch (node->op) {
    case PDDE_OP_MATMUL: return pcu_matmul(d, s, node);
    case PDDE_OP_ADD: return pcu_binary(d, s, node, PCU_B_ADD);
    case PDDE_OP_SUB: return pcu_binary(d, s, node, PCU_B_SUB);
    case PDDE_OP_MUL: return pcu_binary(d, s, node, PCU_B_MUL);
    case PDDE_OP_GRAD_ACCUM: return pcu_binary(d, s, node, PCU_B_ADD);
    case PDDE_OP_SCALE: return pcu_unary(d, s, node, PCU_U_SCALE, node->fparams[0]);
    case PDDE_OP_GELU: return pcu_unary(d, s, node, PCU_U_GELU, 0.0f);
    case PDDE_OP_RELU: return pcu_unary(d, s, node, PCU_U_RELU, 0.0f);
    case PDDE_OP_SILU: return pcu_unary(d, s, node, PCU_U_SILU, 0.0f);
    case PDDE_OP_GELU_BACK: return pcu_unary_back(d, s, node, PCU_U_GELU);
    case PDDE_OP_RELU_BACK: return pcu_unary_back(d, s, node, PCU_U_RELU);
    case PDDE_OP_SILU_BACK: return pcu_unary_back(d, s, node, PCU_U_SILU);
    case PDDE_OP_RESHAPE:
        return pcu_dcopy(d, s, pcu_ptr_of(node), pcu_ptr_of(x), pdde_tensor_nbytes(node));
    case PDDE_OP_LAYERNORM:
    case PDDE_OP_RMSNORM: {
        long long rows, C;
        if (!pcu_norm_rows(x, &rows, &C)) return PDDE_OK;
        float eps = node->fparams[0];
        pcu_ptr px = pcu_ptr_of(x), pg = pcu_ptr_of(node->src[1]), py = pcu_ptr_of(node);
        if (node->op == PDDE_OP_RMSNORM) {
            void *args[] = {&px, &pg, &py, &rows, &C, &eps};
            return pcu_row_op(d, s, PCU_K_RMSNORM, rows, C, args);
        }
        pcu_ptr pb = node->nsrc > 2 && node->src[2] ? pcu_ptr_of(node->src[2]) : 0;
        void *args[] = {&px, &pg, &pb, &py, &rows, &C, &eps};
        return pcu_row_op(d, s, PCU_K_LAYERNORM, rows, C, args);
    }
    case PDDE_OP_LAYERNORM_BACK:
    case PDDE_OP_RMSNORM_BACK: {
        long long rows, C;
        if (!pcu_norm_rows(x, &rows, &C)) return PDDE_OK;
        float eps = node->fparams[0];
        pcu_ptr px = pcu_ptr_of(x), pg = pcu_ptr_of(node->src[1]), pdy = pcu_ptr_of(node->src[2]),
                pdx = pcu_ptr_of(node);
        void *args[] = {&px, &pg, &pdy, &pdx, &rows, &C, &eps};
        return pcu_row_op(d, s, node->op == PDDE_OP_RMSNORM_BACK ? PCU_K_RMSNORM_BACK : PCU_K_LAYERNORM_BACK, rows, C,
                          args);
    }
    case PDDE_OP_LAYERNORM_BACK_GAMMA: return pcu_gamma_back(d, s, node, 0);
    case PDDE_OP_RMSNORM_BACK_GAMMA: return pcu_gamma_back(d, s, node, 1);
    case PDDE_OP_SOFTMAX: {
        long long rows, C;
        if (!pcu_norm_rows(x, &rows, &C)) return PDDE_OK;
        long long T = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1;
        int causal = node->iparams[0] != 0;
        pcu_ptr px = pcu_ptr_of(x), py = pcu_ptr_of(node);
        void *args[] = {&px, &py, &rows, &C, &T, &causal};
        return pcu_row_op(d, s, PCU_K_SOFTMAX, rows, C, args);
    }
    case PDDE_OP_SOFTMAX_BACK: {
        long long rows, C;
        if (!pcu_norm_rows(x, &rows, &C)) return PDDE_OK;
        pcu_ptr py = pcu_ptr_of(x), pdy = pcu_ptr_of(node->src[1]), pdx = pcu_ptr_of(node);
        void *args[] = {&py, &pdy, &pdx, &rows, &C};
        return pcu_row_op(d, s, PCU_K_SOFTMAX_BACK, rows, C, args);
    }
    case PDDE_OP_CROSS_ENTROPY: return pcu_cross_entropy(d, s, node);
    case PDDE_OP_CROSS_ENTROPY_BACK: return pcu_cross_entropy_back(d, s, node);
    case PDDE_OP_EMBEDDING: {
        pdde_tensor *ids = node->src[1];
        long long C = x->shape[x->ndim - 1], V = x->shape[0], nid = pcu_numel(ids);
        if (!nid || !C) return PDDE_OK;
        pcu_ptr pt = pcu_ptr_of(x), pi = pcu_ptr_of(ids), py = pcu_ptr_of(node);
        void *args[] = {&pt, &pi, &py, &nid, &C, &V};
        return pcu_launch(d, s, PCU_K_EMBEDDING, pcu_grid(d, nid * C, 256), 1, 1, 256, 1, args);
    }
    case PDDE_OP_EMBEDDING_BACK: {
        pdde_tensor *ids = node->src[1], *dy = node->src[2];
        long long C = node->shape[node->ndim - 1], V = node->shape[0], nid = pcu_numel(ids);
        pcu_ptr py = pcu_ptr_of(node);
        e = pcu_dcopy(d, s, py, pcu_ptr_of(x), pdde_tensor_nbytes(node));
        if (e || !nid || !C) return e;
        pcu_ptr pi = pcu_ptr_of(ids), pdy = pcu_ptr_of(dy);
        void *args[] = {&pdy, &pi, &py, &nid, &C, &V};
        return pcu_launch(d, s, PCU_K_EMBEDDING_BACK, pcu_grid(d, nid * C, 256), 1, 1, 256, 1, args);
    }
    case PDDE_OP_PERMUTE:
    case PDDE_OP_EXPAND: {
        if (!n) return PDDE_OK;
        pcu_shape sh;
        memset(&sh, 0, sizeof sh);
        sh.ndim = node->ndim;
        for (int i = 0; i < node->ndim; i++) sh.shape[i] = node->shape[i];
        float scale = 1.0f;
        if (node->op == PDDE_OP_PERMUTE) {
            long long st[PCU_MAX_DIMS], acc = 1;
            for (int i = x->ndim - 1; i >= 0; i--) {
                st[i] = acc;
                acc *= x->shape[i];
            }
            for (int i = 0; i < node->ndim; i++) {
                int p = node->iparams[i];
                if (p < 0 || p >= x->ndim)
                    return pdde_error(d->fam->ctx, PDDE_ERR_INVALID_ARG, "cuda: permute of %s: bad axis %d", node->name, p);
                sh.sa[i] = st[p];
            }
        } else {
            pcu_bcast_strides(x, node->ndim, node->shape, sh.sa);
            scale = node->fparams[0];
        }
        pcu_ptr px = pcu_ptr_of(x), py = pcu_ptr_of(node);
        void *args[] = {&px, &py, &n, &sh, &scale};
        return pcu_launch(d, s, PCU_K_GATHER, pcu_grid(d, n, 256), 1, 1, 256, 1, args);
    }
    case PDDE_OP_CONCAT: {
        int axis = node->iparams[0];
        long long outer, inner, total = node->shape[axis], off = 0;
        pcu_axis_split(node, axis, &outer, &inner);
        for (int i = 0; i < node->nsrc; i++) {
            long long len = node->src[i]->shape[axis];
            e = pcu_copy2d(d, s, pcu_ptr_of(node->src[i]), pcu_ptr_of(node), outer, len * inner, len * inner, 0,
                           total * inner, off * inner);
            if (e) return e;
            off += len;
        }
        return PDDE_OK;
    }
    case PDDE_OP_SLICE: {
        int axis = node->iparams[0];
        long long start = node->iparams[1], outer, inner, len = node->shape[axis], full = x->shape[axis];
        pcu_axis_split(node, axis, &outer, &inner);
        return pcu_copy2d(d, s, pcu_ptr_of(x), pcu_ptr_of(node), outer, len * inner, full * inner, start * inner,
                          len * inner, 0);
    }
    case PDDE_OP_SLICE_BACK: {
        int axis = node->iparams[0];
        long long start = node->iparams[1], outer, inner, len = x->shape[axis], full = node->shape[axis];
        pcu_axis_split(node, axis, &outer, &inner);
        if (n) PCU_CHECK(d, d->fam->cu.MemsetD32Async(pcu_ptr_of(node), 0, (size_t)n, s->s), "cuMemsetD32Async");
        return pcu_copy2d(d, s, pcu_ptr_of(x), pcu_ptr_of(node), outer, len * inner, len * inner, 0, full * inner,
                          start * inner);
    }
    case PDDE_OP_SUM:
    case PDDE_OP_MEAN: {
        int axis = node->iparams[0], red[PCU_MAX_DIMS];
        long long nred = 1;
        for (int i = 0; i < x->ndim; i++) {
            red[i] = axis < 0 || i == axis;
            if (red[i]) nred *= x->shape[i];
        }
        if (x->ndim == 0) nred = 1;
        float scale = node->op == PDDE_OP_MEAN ? (nred ? 1.0f / (float)nred : 0.0f) : 1.0f;
        if (pcu_numel(x) == 0) {
            if (n) PCU_CHECK(d, d->fam->cu.MemsetD32Async(pcu_ptr_of(node), 0, (size_t)n, s->s), "cuMemsetD32Async");
            return PDDE_OK;
        }
        return pcu_reduce(d, s, pcu_ptr_of(x), x->shape, x->ndim, red, pcu_ptr_of(node), scale);
    }
    case PDDE_OP_SUM_TO: {
        int red[PCU_MAX_DIMS], off = x->ndim - node->ndim;
        for (int i = 0; i < x->ndim; i++) {
            int64_t o = i < off ? 1 : node->shape[i - off];
            red[i] = o != x->shape[i];
        }
        return pcu_reduce(d, s, pcu_ptr_of(x), x->shape, x->ndim, red, pcu_ptr_of(node), 1.0f);
    }
    case PDDE_OP_DROPOUT:
    case PDDE_OP_DROPOUT_BACK: {
        if (!n) return PDDE_OK;
        float p = node->fparams[0];
        unsigned lo = (unsigned)node->iparams[0], hi = (unsigned)node->iparams[1], ctr = (unsigned)node->iparams[2];
        pcu_ptr px = pcu_ptr_of(x), py = pcu_ptr_of(node);
        void *args[] = {&px, &py, &n, &p, &lo, &hi, &ctr};
        return pcu_launch(d, s, PCU_K_DROPOUT, pcu_grid(d, n, 256), 1, 1, 256, 1, args);
    }
    case PDDE_OP_CAST: {
        if (!n) return PDDE_OK;
        if (x->dtype == node->dtype) return pcu_dcopy(d, s, pcu_ptr_of(node), pcu_ptr_of(x), pdde_tensor_nbytes(node));
        int sdt = (int)x->dtype, ddt = (int)node->dtype;
        pcu_ptr px = pcu_ptr_of(x), py = pcu_ptr_of(node);
        void *args[] = {&px, &py, &n, &sdt, &ddt};
        return pcu_launch(d, s, PCU_K_CAST, pcu_grid(d, n, 256), 1, 1, 256, 1, args);
    }
    case PDDE_OP_GRAD_NORM_SQ: {
        long long ng = pcu_numel(x);
        unsigned blocks = pcu_grid(d, ng, 256);
        if (blocks > 1024) blocks = 1024;
        pcu_ptr part;
        e = pcu_scratch(d, s, (size_t)blocks * sizeof(float), &part);
        if (e) return e;
        pcu_ptr px = pcu_ptr_of(x), py = pcu_ptr_of(node);
        pcu_ptr prev = node->nsrc > 1 && node->src[1] ? pcu_ptr_of(node->src[1]) : 0;
        int square = 1;
        void *a1[] = {&px, &ng, &square, &part};
        e = pcu_launch(d, s, PCU_K_SUM_PARTIAL, blocks, 1, 1, 256, 1, a1);
        if (e) return e;
        float gs = pcu_gscale(node), scale = gs * gs;
        long long np = blocks;
        void *a2[] = {&part, &np, &prev, &scale, &py};
        return pcu_launch(d, s, PCU_K_SUM_FINAL, 1, 1, 1, 256, 1, a2);
    }
    case PDDE_OP_SGD_UPDATE: {
        pdde_tensor *p = node->src[0];
        long long np = pcu_numel(p);
        if (!np) return PDDE_OK;
        pcu_ptr pp = pcu_ptr_of(p), pg = pcu_ptr_of(node->src[1]);
        pcu_ptr pm = node->nsrc > 2 && node->src[2] ? pcu_ptr_of(node->src[2]) : 0;
        pcu_ptr gn = node->nsrc > 3 && node->src[3] ? pcu_ptr_of(node->src[3]) : 0;
        float lr = node->fparams[0], mom = node->fparams[1], wd = p->ndim >= 2 ? node->fparams[4] : 0.0f,
              clip = node->fparams[5], gs = pcu_gscale(node);
        void *args[] = {&pp, &pg, &pm, &gn, &np, &lr, &mom, &wd, &clip, &gs};
        return pcu_launch(d, s, PCU_K_SGD, pcu_grid(d, np, 256), 1, 1, 256, 1, args);
    }
    case PDDE_OP_ADAMW_UPDATE: {
        pdde_tensor *p = node->src[0];
        long long np = pcu_numel(p);
        if (!np) return PDDE_OK;
        pcu_ptr pp = pcu_ptr_of(p), pg = pcu_ptr_of(node->src[1]), pm = pcu_ptr_of(node->src[2]),
                pv = pcu_ptr_of(node->src[3]);
        pcu_ptr gn = node->nsrc > 4 && node->src[4] ? pcu_ptr_of(node->src[4]) : 0;
        float lr = node->fparams[0], b1 = node->fparams[1], b2 = node->fparams[2], eps = node->fparams[3],
              wd = p->ndim >= 2 ? node->fparams[4] : 0.0f, clip = node->fparams[5], gs = pcu_gscale(node);
        int t = node->iparams[0] > 0 ? node->iparams[0] : 1;
        float bc1 = (float)(1.0 - pow((double)b1, t)), bc2 = (float)(1.0 - pow((double)b2, t));
        void *args[] = {&pp, &pg, &pm, &pv, &gn, &np, &lr, &b1, &b2, &eps, &wd, &clip, &gs, &bc1, &bc2};
        return pcu_launch(d, s, PCU_K_ADAMW, pcu_grid(d, np, 256), 1, 1, 256, 1, args);
    }
    default:
        return pdde_error(d->fam->ctx, PDDE_ERR_UNSUPPORTED, "cuda: op %s is not supported", pdde_op_name(node->op));
    }
}

const pdde_backend_iface pdde_backend_cuda = {
    .api_version = PDDE_BACKEND_API_VERSION,
    .struct_size = sizeof(pdde_backend_iface),
    .name = "cuda",
    .init = pcu_init,
    .free = pcu_free,
    .device_props = pcu_device_props,
    .device_open = pcu_device_open,
    .device_close = pcu_device_close,
    .supports_op = pcu_supports_op,
    .buffer_alloc = pcu_buffer_alloc,
    .buffer_free = pcu_buffer_free,
    .write = pcu_write,
    .read = pcu_read,
    .stream_create = pcu_stream_create,
    .stream_free = pcu_stream_free,
    .stream_sync = pcu_stream_sync,
    .compute = pcu_compute,
    .event_create = pcu_event_create,
    .event_free = pcu_event_free,
    .event_record = pcu_event_record,
    .event_sync = pcu_event_sync,
    .stream_wait_event = pcu_stream_wait_event,
};

#endif /* PDDE_NO_CUDA */
