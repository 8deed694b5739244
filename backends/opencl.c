/* backends/opencl.c — the OpenCL backend: every GPU / accelerator / CPU device of every OpenCL platform.
 *
 * The ICD loader (libOpenCL.so.1) is opened at run time and every cl* entry point is resolved with dlsym
 * into a function-pointer table held by the family, so pdde builds and runs without an OpenCL SDK or
 * driver and then simply reports the family as unavailable. The kernels are backends/gpu_kernels.cl
 * (the Level Zero backend's too, embedded as text by backends/gpu_kernels_cl.h), built from source
 * once per device and cached by the family for its whole life; backends/gpu_dispatch.h maps ops to
 * them. GEMM goes to CLBlast when the build has it (PDDE_HAVE_CLBLAST), else to the tiled k_gemm.
 *
 * Objects: family -> device (cl_context + program + kernels, created on first open) -> stream (an
 * in-order command queue with its own scratch buffer) / buffer (a cl_mem) -> event (a cl_event).
 * Tensors live at (cl_mem = node->data, byte offset = node->offset); kernels take both (no
 * sub-buffers: their origins have alignment limits).
 *
 * PDDE_OPENCL_COLSUM2=1, PDDE_OPENCL_ADAMW_CHUNKS=1 and PDDE_OPENCL_LN2=1 take the column sums, AdamW and layernorm
 * kernels that the CUDA backend's switches of the same names take (backends/gpu_dispatch.h), so that CI runs them on PoCL.
 * Debug hook: PDDE_OPENCL_DEBUG_SOURCE, read when the family is created, is appended to the kernel
 * source, so a test can make the build fail and check the PDDE_ERR_BUILD path. */
#if defined(__has_include)
#if !__has_include(<CL/cl.h>)
#define PDDE_OCL_NO_HEADERS /* no OpenCL headers at build time: the family is left out */
#endif
#endif
#ifndef PDDE_OCL_NO_HEADERS
#define PDDE_HAVE_OPENCL_BACKEND 1

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include "backend_impl.h" /* first: it sets _GNU_SOURCE */
#include <CL/cl.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe.h" /* (and gpu_dispatch.h) */
#include "gpu_kernels_cl.h"
#ifdef PDDE_HAVE_CLBLAST
#include <clblast_c.h>
#endif

/* ------------------------------------------------------------------------------------------------
 * The OpenCL entry points pdde uses, resolved from the ICD loader. */
#define PDDE_OCL_FUNCS(X)                                                                                   \
    X(cl_int, clGetPlatformIDs, (cl_uint, cl_platform_id *, cl_uint *))                                     \
    X(cl_int, clGetPlatformInfo, (cl_platform_id, cl_platform_info, size_t, void *, size_t *))              \
    X(cl_int, clGetDeviceIDs, (cl_platform_id, cl_device_type, cl_uint, cl_device_id *, cl_uint *))        \
    X(cl_int, clGetDeviceInfo, (cl_device_id, cl_device_info, size_t, void *, size_t *))                    \
    X(cl_context, clCreateContext,                                                                          \
      (const cl_context_properties *, cl_uint, const cl_device_id *,                                        \
       void(CL_CALLBACK *)(const char *, const void *, size_t, void *), void *, cl_int *))                  \
    X(cl_int, clReleaseContext, (cl_context))                                                               \
    X(cl_command_queue, clCreateCommandQueue, (cl_context, cl_device_id, cl_command_queue_properties, cl_int *)) \
    X(cl_int, clReleaseCommandQueue, (cl_command_queue))                                                    \
    X(cl_mem, clCreateBuffer, (cl_context, cl_mem_flags, size_t, void *, cl_int *))                         \
    X(cl_int, clReleaseMemObject, (cl_mem))                                                                 \
    X(cl_program, clCreateProgramWithSource, (cl_context, cl_uint, const char **, const size_t *, cl_int *)) \
    X(cl_int, clBuildProgram,                                                                               \
      (cl_program, cl_uint, const cl_device_id *, const char *, void(CL_CALLBACK *)(cl_program, void *), void *)) \
    X(cl_int, clGetProgramBuildInfo, (cl_program, cl_device_id, cl_program_build_info, size_t, void *, size_t *)) \
    X(cl_int, clReleaseProgram, (cl_program))                                                               \
    X(cl_kernel, clCreateKernel, (cl_program, const char *, cl_int *))                                      \
    X(cl_int, clReleaseKernel, (cl_kernel))                                                                 \
    X(cl_int, clGetKernelWorkGroupInfo, (cl_kernel, cl_device_id, cl_kernel_work_group_info, size_t, void *, size_t *)) \
    X(cl_int, clSetKernelArg, (cl_kernel, cl_uint, size_t, const void *))                                   \
    X(cl_int, clEnqueueNDRangeKernel,                                                                       \
      (cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *, const size_t *, cl_uint,       \
       const cl_event *, cl_event *))                                                                       \
    X(cl_int, clEnqueueWriteBuffer,                                                                         \
      (cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *, cl_uint, const cl_event *, cl_event *)) \
    X(cl_int, clEnqueueReadBuffer,                                                                          \
      (cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *, cl_uint, const cl_event *, cl_event *))   \
    X(cl_int, clEnqueueCopyBuffer,                                                                          \
      (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint, const cl_event *, cl_event *))    \
    X(cl_int, clEnqueueFillBuffer,                                                                          \
      (cl_command_queue, cl_mem, const void *, size_t, size_t, size_t, cl_uint, const cl_event *, cl_event *)) \
    X(cl_int, clEnqueueMarkerWithWaitList, (cl_command_queue, cl_uint, const cl_event *, cl_event *))       \
    X(cl_int, clEnqueueBarrierWithWaitList, (cl_command_queue, cl_uint, const cl_event *, cl_event *))      \
    X(cl_int, clFlush, (cl_command_queue))                                                                  \
    X(cl_int, clFinish, (cl_command_queue))                                                                 \
    X(void *, clEnqueueMapBuffer,                                                                           \
      (cl_command_queue, cl_mem, cl_bool, cl_map_flags, size_t, size_t, cl_uint, const cl_event *, cl_event *, cl_int *)) \
    X(cl_int, clEnqueueUnmapMemObject, (cl_command_queue, cl_mem, void *, cl_uint, const cl_event *, cl_event *)) \
    X(cl_int, clWaitForEvents, (cl_uint, const cl_event *))                                                 \
    X(cl_int, clGetEventProfilingInfo, (cl_event, cl_profiling_info, size_t, void *, size_t *))              \
    X(cl_int, clReleaseEvent, (cl_event))

typedef struct {
#define X(ret, name, args) ret(CL_API_CALL *name) args;
    PDDE_OCL_FUNCS(X)
#undef X
} pdde_ocl_api;

typedef struct {
    cl_command_queue q;
    cl_mem scratch; /* per stream, so that two streams never share temporaries */
    size_t scratch_bytes;
    /* a session's stream: the dispatcher's switches read once, when it is made (no operation reads the environment),
     * and whether the device's kernels are built (the default stream checks both at each operation) */
    int fixed, prepared;
    unsigned mem_kernels; /* PGD_MEM_* (PDDE_OPENCL_COLSUM2, PDDE_OPENCL_ADAMW_CHUNKS, PDDE_OPENCL_LN2) */
    int embedding_back;   /* PGD_EMB_* (PDDE_OPENCL_EMBEDDING_BACK; sorted by default) */
    int embedding_sort;   /* PGD_EMB_SORT_* (PDDE_OPENCL_EMBEDDING_SORT; by the ids' count by default) */
    int builtin_gemm;     /* PDDE_OPENCL_GEMM=builtin: k_gemm rather than CLBlast */
} pdde_ocl_stream;

typedef struct {
    cl_event ev; /* NULL until recorded */
} pdde_ocl_event;

struct pdde_ocl_family;

/* The value a kernel's argument was last set to (size 0: not known), so that a launch sets only the arguments that
 * changed (they keep their values on the kernel object between launches; PoCL copies each one it is given) */
#define PDDE_OCL_ARGS 40
typedef struct { uint64_t v; uint8_t size; } pdde_ocl_arg;

typedef struct {
    struct pdde_ocl_family *fam;
    int index;
    cl_platform_id platform;
    cl_device_id id;
    cl_device_type type;
    pdde_device_props props;
    uint64_t max_alloc;
    size_t max_wg;
    /* created on first open, kept until the family is freed (PoCL builds are slow: never rebuild) */
    int ready;
    cl_context cl;
    cl_program prog;
    cl_kernel k[PGD_K_COUNT];
    pdde_ocl_arg args[PGD_K_COUNT][PDDE_OCL_ARGS]; /* (under lock) */
    size_t wg;            /* the largest group of the row kernels: a power of two */
    size_t max_local;     /* the local memory k_ce_staged may take by its __local argument (past its own; 0: none) */
    int item_per_element; /* the program was built with PGD_ITEM_PER_ELEMENT */
    pdde_ocl_stream def;  /* the stream used when the core passes NULL */
    pthread_mutex_t lock; /* clSetKernelArg + enqueue of one kernel is one critical section */
    struct pdde_ocl_pinned { const char *p; size_t n; } *pinned; /* host_alloc's mapped buffers (under lock) */
    int n_pinned;
} pdde_ocl_device;

typedef struct pdde_ocl_family {
    pdde_context *ctx;
    void *lib;
    pdde_ocl_api cl;
    int n;
    pdde_ocl_device *devs;
    char *debug_source;
    pthread_mutex_t lock; /* first open of a device */
} pdde_ocl_family;

static const char *pdde_ocl_err_name(cl_int e) {
    switch (e) {
#define E(c) case c: return #c;
    E(CL_SUCCESS) E(CL_DEVICE_NOT_FOUND) E(CL_DEVICE_NOT_AVAILABLE) E(CL_COMPILER_NOT_AVAILABLE)
    E(CL_MEM_OBJECT_ALLOCATION_FAILURE) E(CL_OUT_OF_RESOURCES) E(CL_OUT_OF_HOST_MEMORY)
    E(CL_PROFILING_INFO_NOT_AVAILABLE) E(CL_MEM_COPY_OVERLAP) E(CL_BUILD_PROGRAM_FAILURE)
    E(CL_MAP_FAILURE) E(CL_MISALIGNED_SUB_BUFFER_OFFSET) E(CL_INVALID_VALUE) E(CL_INVALID_DEVICE_TYPE)
    E(CL_INVALID_PLATFORM) E(CL_INVALID_DEVICE) E(CL_INVALID_CONTEXT) E(CL_INVALID_QUEUE_PROPERTIES)
    E(CL_INVALID_COMMAND_QUEUE) E(CL_INVALID_HOST_PTR) E(CL_INVALID_MEM_OBJECT) E(CL_INVALID_BINARY)
    E(CL_INVALID_BUILD_OPTIONS) E(CL_INVALID_PROGRAM) E(CL_INVALID_PROGRAM_EXECUTABLE)
    E(CL_INVALID_KERNEL_NAME) E(CL_INVALID_KERNEL_DEFINITION) E(CL_INVALID_KERNEL) E(CL_INVALID_ARG_INDEX)
    E(CL_INVALID_ARG_VALUE) E(CL_INVALID_ARG_SIZE) E(CL_INVALID_KERNEL_ARGS) E(CL_INVALID_WORK_DIMENSION)
    E(CL_INVALID_WORK_GROUP_SIZE) E(CL_INVALID_WORK_ITEM_SIZE) E(CL_INVALID_GLOBAL_OFFSET)
    E(CL_INVALID_EVENT_WAIT_LIST) E(CL_INVALID_EVENT) E(CL_INVALID_OPERATION) E(CL_INVALID_BUFFER_SIZE)
    E(CL_INVALID_GLOBAL_WORK_SIZE) E(CL_INVALID_PROPERTY)
#undef E
    default: return "CL error";
    }
}

static pdde_status pdde_ocl_fail(pdde_ocl_device *d, cl_int e, const char *what) {
    if (e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES)
        return pdde_error(d->fam->ctx, PDDE_ERR_DEVICE_OOM, "opencl %s: %s: %s (%d)", d->props.name, what,
                          pdde_ocl_err_name(e), (int)e);
    return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "opencl %s: %s: %s (%d)", d->props.name, what,
                      pdde_ocl_err_name(e), (int)e);
}

/* ------------------------------------------------------------------------------------------------
 * Family and devices */

static void pdde_ocl_device_release(pdde_ocl_family *f, pdde_ocl_device *d) {
    if (!d->ready && !d->cl) return;
    if (d->def.scratch) f->cl.clReleaseMemObject(d->def.scratch);
    if (d->def.q) f->cl.clReleaseCommandQueue(d->def.q);
    for (int i = 0; i < PGD_K_COUNT; i++)
        if (d->k[i]) f->cl.clReleaseKernel(d->k[i]);
    if (d->prog) f->cl.clReleaseProgram(d->prog);
    if (d->cl) f->cl.clReleaseContext(d->cl);
    memset(&d->def, 0, sizeof d->def);
    memset(d->k, 0, sizeof d->k);
    memset(d->args, 0, sizeof d->args);
    d->prog = NULL;
    d->cl = NULL;
    d->ready = 0;
}

static void pdde_ocl_free(void *family) {
    pdde_ocl_family *f = family;
    if (!f) return;
    for (int i = 0; i < f->n; i++) {
        pdde_ocl_device_release(f, &f->devs[i]);
        pthread_mutex_destroy(&f->devs[i].lock);
        free(f->devs[i].pinned);
    }
    free(f->devs);
    free(f->debug_source);
    pthread_mutex_destroy(&f->lock);
    if (f->lib) dlclose(f->lib);
    free(f);
}

static pdde_status pdde_ocl_init(pdde_context *ctx, void **family, int *n_devices) {
    *family = NULL;
    *n_devices = 0;
    pdde_ocl_family *f = calloc(1, sizeof *f);
    if (!f) return pdde_error(ctx, PDDE_ERR_OOM, "opencl: out of host memory");
    f->ctx = ctx;
    pthread_mutex_init(&f->lock, NULL);
    f->lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!f->lib) {
        pdde_ocl_free(f);
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no OpenCL ICD loader (libOpenCL.so.1)");
    }
#define X(ret, name, args)                                                                                  \
    *(void **)&f->cl.name = dlsym(f->lib, #name); /* (ISO C has no object-to-function pointer cast) */     \
    if (!f->cl.name) {                                                                                      \
        pdde_ocl_free(f);                                                                                   \
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "OpenCL ICD loader lacks %s (OpenCL 1.2 needed)", #name); \
    }
    PDDE_OCL_FUNCS(X)
#undef X
    cl_uint np = 0;
    if (f->cl.clGetPlatformIDs(0, NULL, &np) != CL_SUCCESS || np == 0) {
        pdde_ocl_free(f);
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no OpenCL platform (no ICD installed in /etc/OpenCL/vendors)");
    }
    cl_platform_id *plats = calloc(np, sizeof *plats);
    if (!plats || f->cl.clGetPlatformIDs(np, plats, NULL) != CL_SUCCESS) {
        free(plats);
        pdde_ocl_free(f);
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no OpenCL platform");
    }
    const cl_device_type want = CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR | CL_DEVICE_TYPE_CPU;
    for (cl_uint p = 0; p < np; p++) {
        cl_uint nd = 0;
        if (f->cl.clGetDeviceIDs(plats[p], want, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
        cl_device_id *ids = calloc(nd, sizeof *ids);
        pdde_ocl_device *grown = realloc(f->devs, (size_t)(f->n + (int)nd) * sizeof *grown);
        if (!ids || !grown) {
            free(ids);
            if (grown) f->devs = grown;
            free(plats);
            pdde_ocl_free(f);
            return pdde_error(ctx, PDDE_ERR_OOM, "opencl: out of host memory");
        }
        f->devs = grown;
        if (f->cl.clGetDeviceIDs(plats[p], want, nd, ids, NULL) != CL_SUCCESS) nd = 0;
        for (cl_uint i = 0; i < nd; i++) {
            pdde_ocl_device *d = &f->devs[f->n];
            memset(d, 0, sizeof *d);
            d->fam = f;
            d->index = f->n;
            d->platform = plats[p];
            d->id = ids[i];
            cl_ulong mem = 0, maxalloc = 0;
            cl_uint cu = 0;
            size_t mwg = 1;
            f->cl.clGetDeviceInfo(ids[i], CL_DEVICE_TYPE, sizeof d->type, &d->type, NULL);
            f->cl.clGetDeviceInfo(ids[i], CL_DEVICE_NAME, sizeof d->props.name - 1, d->props.name, NULL);
            f->cl.clGetDeviceInfo(ids[i], CL_DEVICE_GLOBAL_MEM_SIZE, sizeof mem, &mem, NULL);
            f->cl.clGetDeviceInfo(ids[i], CL_DEVICE_MAX_MEM_ALLOC_SIZE, sizeof maxalloc, &maxalloc, NULL);
            f->cl.clGetDeviceInfo(ids[i], CL_DEVICE_MAX_COMPUTE_UNITS, sizeof cu, &cu, NULL);
            f->cl.clGetDeviceInfo(ids[i], CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof mwg, &mwg, NULL);
            d->props.kind = (d->type & CL_DEVICE_TYPE_GPU) ? PDDE_DEVICE_GPU : PDDE_DEVICE_ACCEL;
            d->props.on_host_cores = (d->type & CL_DEVICE_TYPE_CPU) != 0;
            snprintf(d->props.backend, sizeof d->props.backend, "opencl");
            d->props.memory_total = mem;
            d->props.compute_units = (int)cu;
            d->max_alloc = maxalloc;
            d->max_wg = mwg ? mwg : 1;
            pthread_mutex_init(&d->lock, NULL);
            f->n++;
        }
        free(ids);
    }
    free(plats);
    if (f->n == 0) {
        pdde_ocl_free(f);
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no OpenCL device (GPU, accelerator or CPU) on any platform");
    }
    const char *dbg = getenv("PDDE_OPENCL_DEBUG_SOURCE");
    if (dbg && *dbg) f->debug_source = strdup(dbg);
    *family = f;
    *n_devices = f->n;
    return PDDE_OK;
}

static pdde_status pdde_ocl_device_props(void *family, int index, pdde_device_props *out) {
    pdde_ocl_family *f = family;
    if (!f || index < 0 || index >= f->n) return PDDE_ERR_INVALID_ARG;
    *out = f->devs[index].props;
    return PDDE_OK;
}

/* The context and default queue of a device (on open). */
static pdde_status pdde_ocl_device_setup(pdde_ocl_family *f, pdde_ocl_device *d) {
    cl_int e = CL_SUCCESS;
    cl_context_properties cp[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)d->platform, 0};
    d->cl = f->cl.clCreateContext(cp, 1, &d->id, NULL, NULL, &e);
    if (!d->cl) return pdde_ocl_fail(d, e, "clCreateContext");
    d->def.q = f->cl.clCreateCommandQueue(d->cl, d->id, 0, &e);
    if (!d->def.q) return pdde_ocl_fail(d, e, "clCreateCommandQueue");
    d->ready = 1;
    return PDDE_OK;
}

/* The program (built once per device, then cached for the family's life) and its kernels. Built on
 * first use, i.e. at the first buffer_alloc (session init) or compute, so that a build failure
 * reaches the caller as PDDE_ERR_BUILD with the log. */
static pdde_status pdde_ocl_build(pdde_ocl_family *f, pdde_ocl_device *d) {
    cl_int e = CL_SUCCESS;
    /* the source's pieces, then the debug text (the pieces' array ends with a NULL: the same count) */
    const char *src[sizeof pdde_gpu_kernels_cl_parts / sizeof *pdde_gpu_kernels_cl_parts];
    cl_uint n = 0;
    while (pdde_gpu_kernels_cl_parts[n]) src[n] = pdde_gpu_kernels_cl_parts[n], n++;
    src[n++] = f->debug_source ? f->debug_source : "";
    d->prog = f->cl.clCreateProgramWithSource(d->cl, n, src, NULL, &e);
    if (!d->prog) return pdde_ocl_fail(d, e, "clCreateProgramWithSource");
    /* beyond GPUs (a CPU device) the elementwise kernels get an item per element (see the source) */
    d->item_per_element = !(d->type & CL_DEVICE_TYPE_GPU);
    const char *opts = d->item_per_element ? "-cl-std=CL1.2 -DPGD_BUFFER_OFFSETS -DPGD_ITEM_PER_ELEMENT"
                                           : "-cl-std=CL1.2 -DPGD_BUFFER_OFFSETS";
    e = f->cl.clBuildProgram(d->prog, 1, &d->id, opts, NULL, NULL);
    if (e != CL_SUCCESS) {
        size_t len = 0;
        f->cl.clGetProgramBuildInfo(d->prog, d->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
        char *log = malloc(len + 1);
        if (log) {
            log[0] = 0;
            f->cl.clGetProgramBuildInfo(d->prog, d->id, CL_PROGRAM_BUILD_LOG, len, log, NULL);
            log[len] = 0;
        }
        pdde_status st = pdde_error(f->ctx, PDDE_ERR_BUILD, "opencl %s: kernel build failed (%s): %s", d->props.name,
                                    pdde_ocl_err_name(e), log && log[0] ? log : "(no log)");
        free(log);
        f->cl.clReleaseProgram(d->prog);
        d->prog = NULL;
        return st;
    }
    size_t wg = d->max_wg;
    for (int i = 0; i < PGD_K_COUNT; i++) {
        d->k[i] = f->cl.clCreateKernel(d->prog, pgd_kernel_names[i], &e);
        if (!d->k[i]) {
            pdde_status st = pdde_ocl_fail(d, e, pgd_kernel_names[i]);
            for (int j = 0; j < i; j++) f->cl.clReleaseKernel(d->k[j]), d->k[j] = NULL;
            f->cl.clReleaseProgram(d->prog);
            d->prog = NULL;
            return st;
        }
        size_t kw = 0;
        if (i != PGD_K_GEMM &&
            f->cl.clGetKernelWorkGroupInfo(d->k[i], d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof kw, &kw, NULL) ==
                CL_SUCCESS &&
            kw > 0 && kw < wg)
            wg = kw;
    }
    /* up to 1024 on GPUs, 64 elsewhere (a CPU runs a work-group as a loop: wider is no faster) */
    size_t want = (d->type & CL_DEVICE_TYPE_GPU) ? 1024 : 64;
    d->wg = 1;
    while (d->wg * 2 <= want && d->wg * 2 <= wg) d->wg *= 2;
    cl_ulong local = 0, used = 0;
    if (f->cl.clGetDeviceInfo(d->id, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL) != CL_SUCCESS ||
        f->cl.clGetKernelWorkGroupInfo(d->k[PGD_K_CE_STAGED], d->id, CL_KERNEL_LOCAL_MEM_SIZE, sizeof used, &used, NULL) != CL_SUCCESS)
        local = used = 0;
    d->max_local = local > used + 1024 ? (size_t)(local - used - 1024) : 0;
    return PDDE_OK;
}

static pdde_status pdde_ocl_prepare(pdde_ocl_device *d) {
    pdde_ocl_family *f = d->fam;
    pdde_status st = PDDE_OK;
    pthread_mutex_lock(&f->lock);
    if (!d->prog) st = pdde_ocl_build(f, d);
    pthread_mutex_unlock(&f->lock);
    return st;
}

static pdde_status pdde_ocl_device_open(void *family, int index, void **dev) {
    pdde_ocl_family *f = family;
    *dev = NULL;
    if (!f || index < 0 || index >= f->n) return PDDE_ERR_INVALID_ARG;
    pdde_ocl_device *d = &f->devs[index];
    pdde_status st = PDDE_OK;
    pthread_mutex_lock(&f->lock);
    if (!d->ready) {
        st = pdde_ocl_device_setup(f, d);
        if (st != PDDE_OK) pdde_ocl_device_release(f, d);
    }
    pthread_mutex_unlock(&f->lock);
    if (st == PDDE_OK) *dev = d;
    return st;
}

/* The device stays set up (program cached) until the family is freed. */
static void pdde_ocl_device_close(void *dev) { (void)dev; }

/* ------------------------------------------------------------------------------------------------
 * Buffers, streams, events */

static pdde_status pdde_ocl_buffer_alloc(void *dev, size_t nbytes, void **handle) {
    pdde_ocl_device *d = dev;
    *handle = NULL;
    pdde_status st = pdde_ocl_prepare(d);
    if (st != PDDE_OK) return st;
    if (nbytes > d->max_alloc || nbytes > d->props.memory_total)
        return pdde_error(d->fam->ctx, PDDE_ERR_DEVICE_OOM,
                          "opencl %s: cannot allocate %zu bytes (largest buffer %llu bytes, memory %llu bytes)",
                          d->props.name, nbytes, (unsigned long long)d->max_alloc,
                          (unsigned long long)d->props.memory_total);
    cl_int e = CL_SUCCESS;
    cl_mem m = d->fam->cl.clCreateBuffer(d->cl, CL_MEM_READ_WRITE, nbytes ? nbytes : 16, NULL, &e);
    if (!m) {
        if (e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_RESOURCES || e == CL_OUT_OF_HOST_MEMORY ||
            e == CL_INVALID_BUFFER_SIZE)
            return pdde_error(d->fam->ctx, PDDE_ERR_DEVICE_OOM, "opencl %s: cannot allocate %zu bytes: %s (%d)",
                              d->props.name, nbytes, pdde_ocl_err_name(e), (int)e);
        return pdde_ocl_fail(d, e, "clCreateBuffer");
    }
    *handle = m;
    return PDDE_OK;
}

/* A buffer released: the kernels' remembered arguments are forgotten (a buffer made later may get its handle, which
 * a runtime may have translated when it was set). */
static void pdde_ocl_args_forget(pdde_ocl_device *d) {
    pthread_mutex_lock(&d->lock);
    memset(d->args, 0, sizeof d->args);
    pthread_mutex_unlock(&d->lock);
}

static void pdde_ocl_buffer_free(void *dev, void *handle) {
    pdde_ocl_device *d = dev;
    if (handle) d->fam->cl.clReleaseMemObject((cl_mem)handle), pdde_ocl_args_forget(d);
}

/* Host memory the runtime can copy by DMA (pinned where it pins): a CL_MEM_ALLOC_HOST_PTR buffer,
 * mapped for good. The buffer handle sits in the 64 bytes before the pointer returned. */
#define PDDE_OCL_HOST_HEADER 64
static pdde_status pdde_ocl_host_alloc(void *dev, size_t nbytes, void **ptr) {
    pdde_ocl_device *d = dev;
    *ptr = NULL;
    pdde_status st = pdde_ocl_prepare(d);
    if (st != PDDE_OK) return st;
    cl_int e = CL_SUCCESS;
    size_t total = nbytes + PDDE_OCL_HOST_HEADER;
    cl_mem m = d->fam->cl.clCreateBuffer(d->cl, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, total, NULL, &e);
    if (!m) return pdde_ocl_fail(d, e, "clCreateBuffer (host staging)");
    char *p = d->fam->cl.clEnqueueMapBuffer(d->def.q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, total, 0, NULL, NULL, &e);
    if (!p) {
        d->fam->cl.clReleaseMemObject(m);
        return pdde_ocl_fail(d, e, "clEnqueueMapBuffer (host staging)");
    }
    memcpy(p, &m, sizeof m);
    *ptr = p + PDDE_OCL_HOST_HEADER;
    pthread_mutex_lock(&d->lock);
    struct pdde_ocl_pinned *more = realloc(d->pinned, (size_t)(d->n_pinned + 1) * sizeof *more);
    if (more) d->pinned = more, more[d->n_pinned++] = (struct pdde_ocl_pinned){*ptr, nbytes};
    pthread_mutex_unlock(&d->lock); /* (not listed: its copies stay blocking) */
    return PDDE_OK;
}

static void pdde_ocl_host_free(void *dev, void *ptr) {
    pdde_ocl_device *d = dev;
    if (!ptr) return;
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->n_pinned; i++)
        if (d->pinned[i].p == ptr) { d->pinned[i] = d->pinned[--d->n_pinned]; break; }
    pthread_mutex_unlock(&d->lock);
    char *p = (char *)ptr - PDDE_OCL_HOST_HEADER;
    cl_mem m;
    memcpy(&m, p, sizeof m);
    d->fam->cl.clEnqueueUnmapMemObject(d->def.q, m, p, 0, NULL, NULL);
    d->fam->cl.clFinish(d->def.q);
    d->fam->cl.clReleaseMemObject(m);
}

static pdde_ocl_stream *pdde_ocl_st(pdde_ocl_device *d, void *stream) {
    return stream ? (pdde_ocl_stream *)stream : &d->def;
}

/* Whether [p, p + n) lies in one of host_alloc's buffers (whose owner keeps it until the stream is
 * synchronized, as the interface says). */
static cl_bool pdde_ocl_async(pdde_ocl_device *d, const void *p, size_t n) {
    cl_bool in = CL_FALSE;
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->n_pinned && !in; i++)
        in = (const char *)p >= d->pinned[i].p && (const char *)p + n <= d->pinned[i].p + d->pinned[i].n;
    pthread_mutex_unlock(&d->lock);
    return in;
}

/* Copies are blocking (the caller's host memory may be gone as soon as the call returns), but for
 * those of host_alloc's memory: ordered on the stream, complete when it is synchronized (CUDA's). */
static pdde_status pdde_ocl_write(void *dev, void *stream, void *handle, size_t offset, const void *src, size_t n) {
    pdde_ocl_device *d = dev;
    if (n == 0) return PDDE_OK;
    cl_bool blocking = !pdde_ocl_async(d, src, n);
    cl_int e = d->fam->cl.clEnqueueWriteBuffer(pdde_ocl_st(d, stream)->q, (cl_mem)handle, blocking, offset, n, src, 0,
                                               NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueWriteBuffer");
}

/* (device to device: in queue order, no host memory involved, so not blocking) */
static pdde_status pdde_ocl_copy(void *dev, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset, size_t n) {
    pdde_ocl_device *d = dev;
    if (n == 0) return PDDE_OK;
    cl_int e = d->fam->cl.clEnqueueCopyBuffer(pdde_ocl_st(d, stream)->q, (cl_mem)src, (cl_mem)dst, src_offset, dst_offset, n, 0,
                                              NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueCopyBuffer");
}

static pdde_status pdde_ocl_read(void *dev, void *stream, void *handle, size_t offset, void *dst, size_t n) {
    pdde_ocl_device *d = dev;
    if (n == 0) return PDDE_OK;
    cl_bool blocking = !pdde_ocl_async(d, dst, n);
    cl_int e = d->fam->cl.clEnqueueReadBuffer(pdde_ocl_st(d, stream)->q, (cl_mem)handle, blocking, offset, n, dst, 0,
                                              NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueReadBuffer");
}

/* PDDE_OPENCL_GEMM=builtin: GEMMs on k_gemm even where the build has CLBlast (auto: CLBlast where it is) */
static int pdde_ocl_gemm_env(void) {
    static const char *const words[] = {"auto", "builtin"};
    return pdde_env_choice("PDDE_OPENCL_GEMM", words, 2, 0) == 1;
}

/* (a 4-byte pattern where offset and n allow it: runtimes fill words faster than bytes) */
static pdde_status pdde_ocl_zero(void *dev, void *stream, void *handle, size_t offset, size_t n) {
    pdde_ocl_device *d = dev;
    if (!n) return PDDE_OK;
    static const uint32_t zero = 0;
    size_t pattern = offset % 4 || n % 4 ? 1 : 4;
    cl_int e = d->fam->cl.clEnqueueFillBuffer(pdde_ocl_st(d, stream)->q, (cl_mem)handle, &zero, pattern, offset, n, 0, NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueFillBuffer");
}

/* (timed: a profiling queue, whose markers carry the device's clock) */
static pdde_status pdde_ocl_stream_open(pdde_ocl_device *d, cl_command_queue_properties props, void **stream) {
    *stream = NULL;
    pdde_ocl_stream *s = calloc(1, sizeof *s);
    if (!s) return pdde_error(d->fam->ctx, PDDE_ERR_OOM, "opencl: out of host memory");
    cl_int e = CL_SUCCESS;
    s->q = d->fam->cl.clCreateCommandQueue(d->cl, d->id, props, &e);
    if (!s->q) {
        free(s);
        return pdde_ocl_fail(d, e, "clCreateCommandQueue");
    }
    s->fixed = 1, s->mem_kernels = pgd_mem_kernels_env("PDDE_OPENCL_", 0), s->builtin_gemm = pdde_ocl_gemm_env();
    s->embedding_back = pgd_embedding_back_env("PDDE_OPENCL_", PGD_EMB_SORTED), s->embedding_sort = pgd_embedding_sort_env("PDDE_OPENCL_");
    *stream = s;
    return PDDE_OK;
}

static pdde_status pdde_ocl_stream_create(void *dev, void **stream) { return pdde_ocl_stream_open(dev, 0, stream); }
static pdde_status pdde_ocl_stream_create_timed(void *dev, void **stream) {
    return pdde_ocl_stream_open(dev, CL_QUEUE_PROFILING_ENABLE, stream);
}

static void pdde_ocl_stream_free(void *dev, void *stream) {
    pdde_ocl_device *d = dev;
    pdde_ocl_stream *s = stream;
    if (!s) return;
    d->fam->cl.clFinish(s->q);
    if (s->scratch) d->fam->cl.clReleaseMemObject(s->scratch), pdde_ocl_args_forget(d);
    d->fam->cl.clReleaseCommandQueue(s->q);
    free(s);
}

static pdde_status pdde_ocl_stream_sync(void *dev, void *stream) {
    pdde_ocl_device *d = dev;
    cl_int e = d->fam->cl.clFinish(pdde_ocl_st(d, stream)->q);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clFinish");
}

static pdde_status pdde_ocl_event_create(void *dev, void **event) {
    pdde_ocl_device *d = dev;
    *event = calloc(1, sizeof(pdde_ocl_event));
    return *event ? PDDE_OK : pdde_error(d->fam->ctx, PDDE_ERR_OOM, "opencl: out of host memory");
}

static void pdde_ocl_event_free(void *dev, void *event) {
    pdde_ocl_device *d = dev;
    pdde_ocl_event *ev = event;
    if (!ev) return;
    if (ev->ev) d->fam->cl.clReleaseEvent(ev->ev);
    free(ev);
}

static pdde_status pdde_ocl_event_record(void *dev, void *event, void *stream) {
    pdde_ocl_device *d = dev;
    pdde_ocl_event *ev = event;
    cl_event ne = NULL;
    cl_int e = d->fam->cl.clEnqueueMarkerWithWaitList(pdde_ocl_st(d, stream)->q, 0, NULL, &ne);
    if (e != CL_SUCCESS) return pdde_ocl_fail(d, e, "clEnqueueMarkerWithWaitList");
    if (ev->ev) d->fam->cl.clReleaseEvent(ev->ev);
    ev->ev = ne;
    d->fam->cl.clFlush(pdde_ocl_st(d, stream)->q); /* so that waiting on it from elsewhere cannot stall */
    return PDDE_OK;
}

static pdde_status pdde_ocl_event_sync(void *dev, void *event) {
    pdde_ocl_device *d = dev;
    pdde_ocl_event *ev = event;
    if (!ev->ev) return PDDE_OK;
    cl_int e = d->fam->cl.clWaitForEvents(1, &ev->ev);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clWaitForEvents");
}

/* A marker completes when the commands before it have: its end is the time the queue reached it. */
static pdde_status pdde_ocl_event_elapsed(void *dev, void *e0, void *e1, double *ms) {
    pdde_ocl_device *d = dev;
    const pdde_ocl_event *a = e0, *b = e1;
    cl_ulong t0 = 0, t1 = 0;
    if (!a->ev || !b->ev) return pdde_error(d->fam->ctx, PDDE_ERR_STATE, "opencl: event_elapsed: an event was never recorded");
    cl_int e = d->fam->cl.clGetEventProfilingInfo(a->ev, CL_PROFILING_COMMAND_END, sizeof t0, &t0, NULL);
    if (e == CL_SUCCESS) e = d->fam->cl.clGetEventProfilingInfo(b->ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    if (e != CL_SUCCESS) return pdde_ocl_fail(d, e, "clGetEventProfilingInfo (was the stream made by stream_create_timed?)");
    *ms = 1e-6 * ((double)t1 - (double)t0);
    return PDDE_OK;
}

static pdde_status pdde_ocl_stream_wait_event(void *dev, void *stream, void *event) {
    pdde_ocl_device *d = dev;
    pdde_ocl_event *ev = event;
    if (!ev->ev) return PDDE_OK;
    cl_int e = d->fam->cl.clEnqueueBarrierWithWaitList(pdde_ocl_st(d, stream)->q, 1, &ev->ev, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueBarrierWithWaitList");
}

/* ------------------------------------------------------------------------------------------------
 * Ops: backends/gpu_dispatch.h maps each op to kernels of backends/gpu_kernels.cl; these callbacks run
 * them on an OpenCL queue. A device address is a cl_mem and a byte offset, and each pointer argument
 * of a kernel is those two (the source is built with PGD_BUFFER_OFFSETS). */

/* Argument n of kernel k set to the size bytes at v, unless it holds them already (caller holds d->lock). */
static cl_int pdde_ocl_set_arg(pdde_ocl_device *d, int k, cl_uint n, size_t size, const void *v) {
    pdde_ocl_arg *a = n < PDDE_OCL_ARGS ? &d->args[k][n] : NULL;
    uint64_t bits = 0;
    if (a && size <= sizeof bits) {
        memcpy(&bits, v, size);
        if (a->size == size && a->v == bits) return CL_SUCCESS;
    }
    cl_int e = d->fam->cl.clSetKernelArg(d->k[k], n, size, v);
    if (a) a->size = e == CL_SUCCESS && size <= sizeof bits ? (uint8_t)size : 0, a->v = bits;
    return e;
}

static int pdde_ocl_cb_launch(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, int nargs, const pgd_arg *args) {
    pdde_ocl_device *d = impl;
    const pdde_ocl_api *cl = &d->fam->cl;
    cl_kernel kern = d->k[k];
    cl_int e = CL_SUCCESS;
    cl_uint n = 0;
    pthread_mutex_lock(&d->lock); /* the kernel object is shared: its arguments and the enqueue go together */
    for (int i = 0; i < nargs && e == CL_SUCCESS; i++) {
        if (args[i].is_ptr == PGD_ARG_LOCAL) { /* (local memory of that size: not a value the cache can hold) */
            if (n < PDDE_OCL_ARGS) d->args[k][n].size = 0;
            e = cl->clSetKernelArg(kern, n++, args[i].size, NULL);
        } else if (args[i].is_ptr) {
            const pgd_ptr *p = args[i].p;
            cl_mem m = (cl_mem)(uintptr_t)p->base; /* NULL gives the kernel a null pointer */
            cl_ulong off = p->off;
            e = pdde_ocl_set_arg(d, k, n++, sizeof m, &m);
            if (e == CL_SUCCESS) e = pdde_ocl_set_arg(d, k, n++, sizeof off, &off);
        } else {
            e = pdde_ocl_set_arg(d, k, n++, args[i].size, args[i].p);
        }
    }
    size_t global[3] = {(size_t)gx * bx, (size_t)gy * by, gz}, local[3] = {bx, by, 1};
    if (e == CL_SUCCESS)
        e = cl->clEnqueueNDRangeKernel(((pdde_ocl_stream *)stream)->q, kern, 3, NULL, global, local, 0, NULL, NULL);
    pthread_mutex_unlock(&d->lock);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, pgd_kernel_names[k]);
}

/* Per-stream scratch, so that two streams never share temporaries. */
static int pdde_ocl_cb_scratch(void *impl, void *stream, size_t nbytes, pgd_ptr *out) {
    pdde_ocl_device *d = impl;
    pdde_ocl_stream *s = stream;
    if (s->scratch_bytes < nbytes) {
        size_t want = nbytes < 65536 ? 65536 : nbytes;
        /* releasing is safe while queued kernels still use it: OpenCL keeps it alive until they finish */
        if (s->scratch) d->fam->cl.clReleaseMemObject(s->scratch), pdde_ocl_args_forget(d);
        s->scratch = NULL;
        s->scratch_bytes = 0;
        cl_int e = CL_SUCCESS;
        s->scratch = d->fam->cl.clCreateBuffer(d->cl, CL_MEM_READ_WRITE, want, NULL, &e);
        if (!s->scratch) return pdde_ocl_fail(d, e, "scratch clCreateBuffer");
        s->scratch_bytes = want;
    }
    *out = (pgd_ptr){(uintptr_t)s->scratch, 0};
    return PDDE_OK;
}

static int pdde_ocl_cb_fill32(void *impl, void *stream, pgd_ptr dst, uint32_t value, size_t count) {
    pdde_ocl_device *d = impl;
    if (!count) return PDDE_OK;
    cl_int e = d->fam->cl.clEnqueueFillBuffer(((pdde_ocl_stream *)stream)->q, (cl_mem)(uintptr_t)dst.base, &value,
                                              sizeof value, dst.off, count * sizeof value, 0, NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueFillBuffer");
}

static int pdde_ocl_cb_copy(void *impl, void *stream, pgd_ptr dst, pgd_ptr src, size_t nbytes) {
    pdde_ocl_device *d = impl;
    cl_int e = d->fam->cl.clEnqueueCopyBuffer(((pdde_ocl_stream *)stream)->q, (cl_mem)(uintptr_t)src.base,
                                              (cl_mem)(uintptr_t)dst.base, src.off, dst.off, nbytes, 0, NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueCopyBuffer");
}

#ifdef PDDE_HAVE_CLBLAST
/* GEMM through CLBlast (row-major; offsets and strides in elements; a shared operand has stride 0). */
static int pdde_ocl_cb_gemm(void *impl, void *stream, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a,
                            int64_t sA, pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    pdde_ocl_device *d = impl;
    cl_command_queue *q = &((pdde_ocl_stream *)stream)->q;
    CLBlastTranspose cta = ta ? CLBlastTransposeYes : CLBlastTransposeNo, ctb = tb ? CLBlastTransposeYes : CLBlastTransposeNo;
    cl_mem ma = (cl_mem)(uintptr_t)a.base, mb = (cl_mem)(uintptr_t)b.base, mc = (cl_mem)(uintptr_t)c.base;
    size_t lda = (size_t)(ta ? M : K), ldb = (size_t)(tb ? K : N), ao = a.off / 4, bo = b.off / 4, co = c.off / 4;
    CLBlastStatusCode r;
    if (batch == 1)
        r = CLBlastSgemm(CLBlastLayoutRowMajor, cta, ctb, (size_t)M, (size_t)N, (size_t)K, 1.0f, ma, ao, lda, mb, bo, ldb,
                         0.0f, mc, co, (size_t)N, q, NULL);
    else
        r = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, cta, ctb, (size_t)M, (size_t)N, (size_t)K, 1.0f, ma, ao, lda,
                                       (size_t)sA, mb, bo, ldb, (size_t)sB, 0.0f, mc, co, (size_t)N, (size_t)sC,
                                       (size_t)batch, q, NULL);
    if (r == CLBlastSuccess) return PDDE_OK;
    if (r == CLBlastOpenCLOutOfResources || r == CLBlastTempBufferAllocFailure)
        return pdde_error(d->fam->ctx, PDDE_ERR_DEVICE_OOM, "opencl %s: CLBlast sgemm %lldx%lldx%lld: out of memory (%d)",
                          d->props.name, (long long)M, (long long)N, (long long)K, (int)r);
    return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "opencl %s: CLBlast sgemm %lldx%lldx%lld (batch %lld) failed: %d",
                      d->props.name, (long long)M, (long long)N, (long long)K, (long long)batch, (int)r);
}
#endif

/* The dispatcher's view of device d and stream (after its kernels are built). */
static pdde_status pdde_ocl_dispatcher(pdde_ocl_device *d, void *stream, pgd_ctx *out) {
    pdde_ocl_stream *s = pdde_ocl_st(d, stream);
    if (!s->prepared) {
        pdde_status st = pdde_ocl_prepare(d);
        if (st != PDDE_OK) return st;
        s->prepared = s->fixed; /* (the device keeps its kernels until the family is freed, after its streams) */
    }
    *out = (pgd_ctx){
        .ctx = d->fam->ctx, .name = "opencl", .impl = d, .stream = s,
        .units = d->props.compute_units > 0 ? (unsigned)d->props.compute_units : 1, .max_block = (unsigned)d->wg,
        .item_per_element = d->item_per_element,
        .launch = pdde_ocl_cb_launch, .scratch = pdde_ocl_cb_scratch, .fill32 = pdde_ocl_cb_fill32,
        .copy = pdde_ocl_cb_copy,
        /* the tiled kernels' groups: FR in backends/gpu_kernels.cl */
        .attention_default = PGD_ATT_ROWS, .has_flash = PGD_FLASH_BF16 | PGD_FLASH_F32, .flash_rows = 64, .flash_threads = 64,
        /* (PDDE_OPENCL_COLSUM2=1, PDDE_OPENCL_ADAMW_CHUNKS=1, PDDE_OPENCL_CE1=1, PDDE_OPENCL_LN2=1: gpu_dispatch.h) */
        .mem_kernels = s->fixed ? s->mem_kernels : pgd_mem_kernels_env("PDDE_OPENCL_", 0), .max_local = d->max_local,
        /* (reproducible, the CPU's sums: PDDE_OPENCL_EMBEDDING_BACK=atomic for the float atomics) */
        .embedding_back = s->fixed ? s->embedding_back : pgd_embedding_back_env("PDDE_OPENCL_", PGD_EMB_SORTED),
        .embedding_sort = s->fixed ? s->embedding_sort : pgd_embedding_sort_env("PDDE_OPENCL_"),
    };
#ifdef PDDE_HAVE_CLBLAST
    if (!(s->fixed ? s->builtin_gemm : pdde_ocl_gemm_env())) out->gemm = pdde_ocl_cb_gemm;
#endif
    return PDDE_OK;
}

static pdde_status pdde_ocl_compute(void *dev, void *stream, pdde_tensor *node) {
    pgd_ctx g;
    pdde_status st = pdde_ocl_dispatcher(dev, stream, &g);
    return st ? st : pgd_compute_any(&g, node);
}

static pdde_status pdde_ocl_compute_group(void *dev, void *stream, pdde_tensor *const *nodes, int n) {
    pgd_ctx g;
    pdde_status st = pdde_ocl_dispatcher(dev, stream, &g);
    return st ? st : pgd_compute_group(&g, nodes, n);
}

static int pdde_ocl_supports_op(void *dev, const pdde_tensor *node) {
    (void)dev;
    return pgd_supports_op(node) || pgd_supports_moe(node) || pgd_supports_rope(node);
}

const pdde_backend_iface pdde_backend_opencl = {
    .api_version = PDDE_BACKEND_API_VERSION,
    .struct_size = sizeof(pdde_backend_iface),
    .name = "opencl",
    .init = pdde_ocl_init,
    .free = pdde_ocl_free,
    .device_props = pdde_ocl_device_props,
    .device_open = pdde_ocl_device_open,
    .device_close = pdde_ocl_device_close,
    .supports_op = pdde_ocl_supports_op,
    .buffer_alloc = pdde_ocl_buffer_alloc,
    .buffer_free = pdde_ocl_buffer_free,
    .write = pdde_ocl_write,
    .read = pdde_ocl_read,
    .copy = pdde_ocl_copy,
    .stream_create = pdde_ocl_stream_create,
    .stream_free = pdde_ocl_stream_free,
    .stream_sync = pdde_ocl_stream_sync,
    .compute = pdde_ocl_compute,
    .event_create = pdde_ocl_event_create,
    .event_free = pdde_ocl_event_free,
    .event_record = pdde_ocl_event_record,
    .event_sync = pdde_ocl_event_sync,
    .stream_wait_event = pdde_ocl_stream_wait_event,
    .host_alloc = pdde_ocl_host_alloc,
    .host_free = pdde_ocl_host_free,
    .compute_group = pdde_ocl_compute_group,
    .stream_create_timed = pdde_ocl_stream_create_timed,
    .event_create_timed = pdde_ocl_event_create,
    .event_elapsed = pdde_ocl_event_elapsed,
    .zero = pdde_ocl_zero,
};

#endif /* PDDE_OCL_NO_HEADERS */
