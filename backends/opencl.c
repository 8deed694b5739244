/* backends/opencl.c — the OpenCL backend: every GPU / accelerator / CPU device of every OpenCL platform.
 *
 * The ICD loader (libOpenCL.so.1) is opened at run time and every cl* entry point is resolved with dlsym
 * into a function-pointer table held by the family, so pdde builds and runs without an OpenCL SDK or
 * driver and then simply reports the family as unavailable. Kernels (backends/opencl_kernels.h) are
 * built once per device and cached by the family for its whole life; GEMM goes to CLBlast when the
 * build has it (PDDE_HAVE_CLBLAST), else to a tiled kernel of our own.
 *
 * Objects: family -> device (cl_context + program + kernels, created on first open) -> stream (an
 * in-order command queue with its own scratch buffer) / buffer (a cl_mem) -> event (a cl_event).
 * Tensors live at (cl_mem = node->data, byte offset = node->offset); kernels take offsets in elements
 * (no sub-buffers: their origins have alignment limits).
 *
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
#include <CL/cl.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pdde.h"
#include "backends/opencl_kernels.h"
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
    X(cl_int, clEnqueueMarkerWithWaitList, (cl_command_queue, cl_uint, const cl_event *, cl_event *))       \
    X(cl_int, clEnqueueBarrierWithWaitList, (cl_command_queue, cl_uint, const cl_event *, cl_event *))      \
    X(cl_int, clFlush, (cl_command_queue))                                                                  \
    X(cl_int, clFinish, (cl_command_queue))                                                                 \
    X(cl_int, clWaitForEvents, (cl_uint, const cl_event *))                                                 \
    X(cl_int, clReleaseEvent, (cl_event))

typedef struct {
#define X(ret, name, args) ret(CL_API_CALL *name) args;
    PDDE_OCL_FUNCS(X)
#undef X
} pdde_ocl_api;

/* Kernels of backends/opencl_kernels.h, created once per device; the C name is "k_" + the id's name. */
#define PDDE_OCL_KERNELS(X)                                                                                 \
    X(fill) X(copy2d) X(binary) X(unary) X(unary_back) X(norm) X(norm_back) X(row_stats) X(norm_back_gamma)  \
    X(softmax) X(softmax_back) X(ce_rows) X(ce_reduce) X(ce_count) X(ce_back) X(embedding) X(embedding_back) \
    X(gather) X(reduce_rows) X(sum_chunks) X(reduce_mid) X(reduce_gen) X(cast) X(dropout) X(sgd) X(adamw)    \
    X(gemm)

enum {
#define X(n) PDDE_OCL_K_##n,
    PDDE_OCL_KERNELS(X)
#undef X
    PDDE_OCL_K_COUNT
};

static const char *const pdde_ocl_kernel_names[] = {
#define X(n) "k_" #n,
    PDDE_OCL_KERNELS(X)
#undef X
};

typedef struct {
    cl_command_queue q;
    cl_mem scratch; /* per stream, so that two streams never share temporaries */
    size_t scratch_bytes;
} pdde_ocl_stream;

typedef struct {
    cl_event ev; /* NULL until recorded */
} pdde_ocl_event;

struct pdde_ocl_family;

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
    cl_kernel k[PDDE_OCL_K_COUNT];
    size_t wg;            /* local size of the row kernels: a power of two */
    pdde_ocl_stream def;  /* the stream used when the core passes NULL */
    pthread_mutex_t lock; /* clSetKernelArg + enqueue of one kernel is one critical section */
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
    for (int i = 0; i < PDDE_OCL_K_COUNT; i++)
        if (d->k[i]) f->cl.clReleaseKernel(d->k[i]);
    if (d->prog) f->cl.clReleaseProgram(d->prog);
    if (d->cl) f->cl.clReleaseContext(d->cl);
    memset(&d->def, 0, sizeof d->def);
    memset(d->k, 0, sizeof d->k);
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
    f->cl.name = (ret(CL_API_CALL *) args)dlsym(f->lib, #name);                                             \
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
    /* the stringified source is one line: break it after ; { } so that build logs point somewhere */
    size_t n1 = strlen(pdde_ocl_source), n2 = strlen(pdde_ocl_source_train);
    char *text = malloc(2 * (n1 + n2) + 4);
    if (!text) return pdde_error(f->ctx, PDDE_ERR_OOM, "opencl: out of host memory");
    char *o = text;
    const char *parts[2] = {pdde_ocl_source, pdde_ocl_source_train};
    for (int part = 0; part < 2; part++) {
        for (const char *pc = parts[part]; *pc; pc++) {
            *o++ = *pc;
            if (*pc == ';' || *pc == '{' || *pc == '}') *o++ = '\n';
        }
        *o++ = '\n';
    }
    *o = 0;
    /* no a*b+c contraction into fma: the CPU reference (ISO C11) does not contract either */
    const char *src[3] = {"#pragma OPENCL FP_CONTRACT OFF\n", text, f->debug_source ? f->debug_source : ""};
    d->prog = f->cl.clCreateProgramWithSource(d->cl, 3, src, NULL, &e);
    free(text);
    if (!d->prog) return pdde_ocl_fail(d, e, "clCreateProgramWithSource");
    e = f->cl.clBuildProgram(d->prog, 1, &d->id, "-cl-std=CL1.2", NULL, NULL);
    if (e != CL_SUCCESS) {
        size_t n = 0;
        f->cl.clGetProgramBuildInfo(d->prog, d->id, CL_PROGRAM_BUILD_LOG, 0, NULL, &n);
        char *log = malloc(n + 1);
        if (log) {
            log[0] = 0;
            f->cl.clGetProgramBuildInfo(d->prog, d->id, CL_PROGRAM_BUILD_LOG, n, log, NULL);
            log[n] = 0;
        }
        pdde_status st = pdde_error(f->ctx, PDDE_ERR_BUILD, "opencl %s: kernel build failed (%s): %s", d->props.name,
                                    pdde_ocl_err_name(e), log && log[0] ? log : "(no log)");
        free(log);
        f->cl.clReleaseProgram(d->prog);
        d->prog = NULL;
        return st;
    }
    size_t wg = d->max_wg;
    for (int i = 0; i < PDDE_OCL_K_COUNT; i++) {
        d->k[i] = f->cl.clCreateKernel(d->prog, pdde_ocl_kernel_names[i], &e);
        if (!d->k[i]) {
            pdde_status st = pdde_ocl_fail(d, e, pdde_ocl_kernel_names[i]);
            for (int j = 0; j < i; j++) f->cl.clReleaseKernel(d->k[j]), d->k[j] = NULL;
            f->cl.clReleaseProgram(d->prog);
            d->prog = NULL;
            return st;
        }
        size_t kw = 0;
        if (i != PDDE_OCL_K_gemm &&
            f->cl.clGetKernelWorkGroupInfo(d->k[i], d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof kw, &kw, NULL) ==
                CL_SUCCESS &&
            kw > 0 && kw < wg)
            wg = kw;
    }
    /* 256 on GPUs, 64 elsewhere (a CPU runs a work-group as a loop: wider is no faster) */
    size_t want = (d->type & CL_DEVICE_TYPE_GPU) ? 256 : 64;
    d->wg = 1;
    while (d->wg * 2 <= want && d->wg * 2 <= wg) d->wg *= 2;
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

static void pdde_ocl_buffer_free(void *dev, void *handle) {
    pdde_ocl_device *d = dev;
    if (handle) d->fam->cl.clReleaseMemObject((cl_mem)handle);
}

static pdde_ocl_stream *pdde_ocl_st(pdde_ocl_device *d, void *stream) {
    return stream ? (pdde_ocl_stream *)stream : &d->def;
}

/* Copies are blocking: the caller's host memory may be gone as soon as the call returns. */
static pdde_status pdde_ocl_write(void *dev, void *stream, void *handle, size_t offset, const void *src, size_t n) {
    pdde_ocl_device *d = dev;
    if (n == 0) return PDDE_OK;
    cl_int e = d->fam->cl.clEnqueueWriteBuffer(pdde_ocl_st(d, stream)->q, (cl_mem)handle, CL_TRUE, offset, n, src, 0,
                                               NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueWriteBuffer");
}

static pdde_status pdde_ocl_read(void *dev, void *stream, void *handle, size_t offset, void *dst, size_t n) {
    pdde_ocl_device *d = dev;
    if (n == 0) return PDDE_OK;
    cl_int e = d->fam->cl.clEnqueueReadBuffer(pdde_ocl_st(d, stream)->q, (cl_mem)handle, CL_TRUE, offset, n, dst, 0,
                                              NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueReadBuffer");
}

static pdde_status pdde_ocl_stream_create(void *dev, void **stream) {
    pdde_ocl_device *d = dev;
    *stream = NULL;
    pdde_ocl_stream *s = calloc(1, sizeof *s);
    if (!s) return pdde_error(d->fam->ctx, PDDE_ERR_OOM, "opencl: out of host memory");
    cl_int e = CL_SUCCESS;
    s->q = d->fam->cl.clCreateCommandQueue(d->cl, d->id, 0, &e);
    if (!s->q) {
        free(s);
        return pdde_ocl_fail(d, e, "clCreateCommandQueue");
    }
    *stream = s;
    return PDDE_OK;
}

static void pdde_ocl_stream_free(void *dev, void *stream) {
    pdde_ocl_device *d = dev;
    pdde_ocl_stream *s = stream;
    if (!s) return;
    d->fam->cl.clFinish(s->q);
    if (s->scratch) d->fam->cl.clReleaseMemObject(s->scratch);
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

static pdde_status pdde_ocl_stream_wait_event(void *dev, void *stream, void *event) {
    pdde_ocl_device *d = dev;
    pdde_ocl_event *ev = event;
    if (!ev->ev) return PDDE_OK;
    cl_int e = d->fam->cl.clEnqueueBarrierWithWaitList(pdde_ocl_st(d, stream)->q, 1, &ev->ev, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueBarrierWithWaitList");
}

/* ------------------------------------------------------------------------------------------------
 * Kernel launches */

typedef struct {
    pdde_ocl_device *d;
    cl_kernel k;
    int kid;
    cl_uint n;
    cl_int err;
} pdde_ocl_call;

static pdde_ocl_call pdde_ocl_begin(pdde_ocl_device *d, int kid) {
    pthread_mutex_lock(&d->lock);
    pdde_ocl_call c = {d, d->k[kid], kid, 0, CL_SUCCESS};
    return c;
}

static void pdde_ocl_arg(pdde_ocl_call *c, size_t size, const void *v) {
    cl_int e = c->d->fam->cl.clSetKernelArg(c->k, c->n++, size, v);
    if (e != CL_SUCCESS && c->err == CL_SUCCESS) c->err = e;
}
static void pdde_ocl_mem(pdde_ocl_call *c, cl_mem m) { pdde_ocl_arg(c, sizeof m, &m); }
static void pdde_ocl_int(pdde_ocl_call *c, int v) { cl_int x = v; pdde_ocl_arg(c, sizeof x, &x); }
static void pdde_ocl_uint(pdde_ocl_call *c, uint32_t v) { cl_uint x = v; pdde_ocl_arg(c, sizeof x, &x); }
static void pdde_ocl_long(pdde_ocl_call *c, int64_t v) { cl_long x = v; pdde_ocl_arg(c, sizeof x, &x); }
static void pdde_ocl_float(pdde_ocl_call *c, float v) { cl_float x = v; pdde_ocl_arg(c, sizeof x, &x); }
static void pdde_ocl_int8(pdde_ocl_call *c, const int v[8]) {
    cl_int8 x;
    for (int i = 0; i < 8; i++) x.s[i] = v[i];
    pdde_ocl_arg(c, sizeof x, &x);
}
static void pdde_ocl_local(pdde_ocl_call *c, size_t bytes) { pdde_ocl_arg(c, bytes, NULL); }

/* Enqueues with global = groups * local (1-D), or the given 3-D sizes; ends the critical section. */
static pdde_status pdde_ocl_launch3(pdde_ocl_call *c, pdde_ocl_stream *s, const size_t g[3], const size_t l[3],
                                    cl_uint dims) {
    cl_int e = c->err;
    if (e == CL_SUCCESS) e = c->d->fam->cl.clEnqueueNDRangeKernel(s->q, c->k, dims, NULL, g, l, 0, NULL, NULL);
    pthread_mutex_unlock(&c->d->lock);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(c->d, e, pdde_ocl_kernel_names[c->kid]);
}

/* one work-item per element, rounded up to whole groups */
static pdde_status pdde_ocl_launch_n(pdde_ocl_call *c, pdde_ocl_stream *s, int64_t n) {
    size_t l = c->d->wg, g = ((size_t)n + l - 1) / l * l, g3[3] = {g, 1, 1}, l3[3] = {l, 1, 1};
    return pdde_ocl_launch3(c, s, g3, l3, 1);
}

/* one work-group per row */
static pdde_status pdde_ocl_launch_rows(pdde_ocl_call *c, pdde_ocl_stream *s, int64_t rows) {
    size_t l = c->d->wg, g3[3] = {(size_t)rows * l, 1, 1}, l3[3] = {l, 1, 1};
    return pdde_ocl_launch3(c, s, g3, l3, 1);
}

static pdde_status pdde_ocl_scratch(pdde_ocl_device *d, pdde_ocl_stream *s, size_t bytes, cl_mem *out) {
    if (bytes < 64) bytes = 64;
    if (s->scratch_bytes < bytes) {
        /* releasing is safe while queued kernels still use it: OpenCL keeps it alive until they finish */
        if (s->scratch) d->fam->cl.clReleaseMemObject(s->scratch);
        s->scratch = NULL;
        s->scratch_bytes = 0;
        cl_int e = CL_SUCCESS;
        s->scratch = d->fam->cl.clCreateBuffer(d->cl, CL_MEM_READ_WRITE, bytes, NULL, &e);
        if (!s->scratch) return pdde_ocl_fail(d, e, "scratch clCreateBuffer");
        s->scratch_bytes = bytes;
    }
    *out = s->scratch;
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Ops */

#define PDDE_OCL_MEM(t) ((cl_mem)(t)->data)
#define PDDE_OCL_OFF(t) ((int64_t)((t)->offset / pdde_dtype_size((t)->dtype)))

static int64_t pdde_ocl_numel(const pdde_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

static int64_t pdde_ocl_last(const pdde_tensor *t) { return t->ndim ? t->shape[t->ndim - 1] : 1; }

/* shape of t padded on the left with 1s to 6 dims, into s[8] (s[6], s[7] = 1) */
static void pdde_ocl_pad(const pdde_tensor *t, int s[8]) {
    for (int i = 0; i < 8; i++) s[i] = 1;
    for (int i = 0; i < t->ndim; i++) s[6 - t->ndim + i] = (int)t->shape[i];
}

/* strides of padded shape s, with 0 where bcast and s[i] == 1 */
static void pdde_ocl_strides(const int s[8], int str[8], int zero_ones) {
    int acc = 1;
    for (int i = 7; i >= 0; i--) str[i] = 0;
    for (int i = 5; i >= 0; i--) {
        str[i] = (zero_ones && s[i] == 1) ? 0 : acc;
        acc *= s[i];
    }
}

static pdde_status pdde_ocl_fill(pdde_ocl_device *d, pdde_ocl_stream *s, cl_mem m, int64_t off, int64_t n, float v) {
    if (n <= 0) return PDDE_OK;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_fill);
    pdde_ocl_mem(&c, m);
    pdde_ocl_long(&c, off);
    pdde_ocl_long(&c, n);
    pdde_ocl_float(&c, v);
    return pdde_ocl_launch_n(&c, s, n);
}

static pdde_status pdde_ocl_copy2d(pdde_ocl_device *d, pdde_ocl_stream *s, cl_mem x, int64_t xo, int64_t xld, cl_mem y,
                                   int64_t yo, int64_t yld, int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0) return PDDE_OK;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_copy2d);
    pdde_ocl_mem(&c, x);
    pdde_ocl_long(&c, xo);
    pdde_ocl_long(&c, xld);
    pdde_ocl_mem(&c, y);
    pdde_ocl_long(&c, yo);
    pdde_ocl_long(&c, yld);
    pdde_ocl_long(&c, rows);
    pdde_ocl_long(&c, cols);
    return pdde_ocl_launch_n(&c, s, rows * cols);
}

/* a byte copy between two tensors' storage (views that the core did not alias, in-place bases) */
static pdde_status pdde_ocl_copy_bytes(pdde_ocl_device *d, pdde_ocl_stream *s, const pdde_tensor *src,
                                       const pdde_tensor *dst, size_t nbytes) {
    if (nbytes == 0 || (src->data == dst->data && src->offset == dst->offset)) return PDDE_OK;
    cl_int e = d->fam->cl.clEnqueueCopyBuffer(s->q, PDDE_OCL_MEM(src), PDDE_OCL_MEM(dst), src->offset, dst->offset,
                                              nbytes, 0, NULL, NULL);
    return e == CL_SUCCESS ? PDDE_OK : pdde_ocl_fail(d, e, "clEnqueueCopyBuffer");
}

static pdde_status pdde_ocl_gemm(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *a = node->src[0], *b = node->src[1];
    int ta = node->iparams[0] != 0, tb = node->iparams[1] != 0;
    int nd = node->ndim;
    int64_t M = node->shape[nd - 2], N = node->shape[nd - 1];
    int64_t K = ta ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
    int64_t batch = pdde_ocl_numel(node) / (M * N > 0 ? M * N : 1);
    if (M == 0 || N == 0 || batch == 0) return PDDE_OK;
    if (K == 0) return pdde_ocl_fill(d, s, PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), pdde_ocl_numel(node), 0.0f);
    int64_t a_batch = pdde_ocl_numel(a) / (M * K), b_batch = pdde_ocl_numel(b) / (K * N);
    int64_t lda = pdde_ocl_last(a), ldb = pdde_ocl_last(b), ldc = N;
    int64_t sa = a_batch > 1 ? M * K : 0, sb = b_batch > 1 ? K * N : 0, sc = M * N;
    int64_t ao = PDDE_OCL_OFF(a), bo = PDDE_OCL_OFF(b), co = PDDE_OCL_OFF(node);
    /* a shared B under a non-transposed A: one big GEMM over all the rows */
    if (batch > 1 && sb == 0 && sa != 0 && !ta) {
        M *= batch;
        batch = 1;
    }
#ifdef PDDE_HAVE_CLBLAST
    CLBlastTranspose cta = ta ? CLBlastTransposeYes : CLBlastTransposeNo, ctb = tb ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastStatusCode r;
    if (batch == 1) {
        r = CLBlastSgemm(CLBlastLayoutRowMajor, cta, ctb, (size_t)M, (size_t)N, (size_t)K, 1.0f, PDDE_OCL_MEM(a),
                         (size_t)ao, (size_t)lda, PDDE_OCL_MEM(b), (size_t)bo, (size_t)ldb, 0.0f, PDDE_OCL_MEM(node),
                         (size_t)co, (size_t)ldc, &s->q, NULL);
    } else {
        /* a shared operand (2-D, the same for every batch) is a batch stride of 0 */
        r = CLBlastSgemmStridedBatched(CLBlastLayoutRowMajor, cta, ctb, (size_t)M, (size_t)N, (size_t)K, 1.0f,
                                       PDDE_OCL_MEM(a), (size_t)ao, (size_t)lda, (size_t)sa, PDDE_OCL_MEM(b), (size_t)bo,
                                       (size_t)ldb, (size_t)sb, 0.0f, PDDE_OCL_MEM(node), (size_t)co, (size_t)ldc,
                                       (size_t)sc, (size_t)batch, &s->q, NULL);
    }
    if (r != CLBlastSuccess) {
        if (r == CLBlastOpenCLOutOfResources || r == CLBlastTempBufferAllocFailure)
            return pdde_error(d->fam->ctx, PDDE_ERR_DEVICE_OOM, "opencl %s: CLBlast sgemm %lldx%lldx%lld: out of memory (%d)",
                              d->props.name, (long long)M, (long long)N, (long long)K, (int)r);
        return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "opencl %s: CLBlast sgemm %lldx%lldx%lld (batch %lld) failed: %d",
                          d->props.name, (long long)M, (long long)N, (long long)K, (long long)batch, (int)r);
    }
    return PDDE_OK;
#else
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_gemm);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(a));
    pdde_ocl_long(&c, ao);
    pdde_ocl_long(&c, lda);
    pdde_ocl_long(&c, sa);
    pdde_ocl_int(&c, ta);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(b));
    pdde_ocl_long(&c, bo);
    pdde_ocl_long(&c, ldb);
    pdde_ocl_long(&c, sb);
    pdde_ocl_int(&c, tb);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, co);
    pdde_ocl_long(&c, ldc);
    pdde_ocl_long(&c, sc);
    pdde_ocl_int(&c, (int)M);
    pdde_ocl_int(&c, (int)N);
    pdde_ocl_int(&c, (int)K);
    size_t g[3] = {(size_t)(N + 15) / 16 * 16, (size_t)(M + 15) / 16 * 16, (size_t)batch}, l[3] = {16, 16, 1};
    return pdde_ocl_launch3(&c, s, g, l, 3);
#endif
}

static pdde_status pdde_ocl_binary(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node, int op) {
    const pdde_tensor *a = node->src[0], *b = node->src[1];
    int64_t n = pdde_ocl_numel(node), nb = pdde_ocl_numel(b);
    if (n == 0) return PDDE_OK;
    int sa[8], sbp[8], bstr[8];
    pdde_ocl_pad(node, sa);
    pdde_ocl_pad(b, sbp);
    pdde_ocl_strides(sbp, bstr, 1);
    int mode = 2;
    if (nb == n) mode = 0;
    else {
        /* b equal to a suffix of a's shape (after its leading 1s): it repeats every nb elements */
        int first = 0;
        while (first < 6 && sbp[first] == 1) first++;
        int suffix = 1;
        for (int i = first; i < 6; i++)
            if (sbp[i] != sa[i]) suffix = 0;
        if (suffix) mode = 1;
    }
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_binary);
    pdde_ocl_int(&c, op);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(a));
    pdde_ocl_long(&c, PDDE_OCL_OFF(a));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(b));
    pdde_ocl_long(&c, PDDE_OCL_OFF(b));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, n);
    pdde_ocl_int(&c, mode);
    pdde_ocl_long(&c, nb > 0 ? nb : 1);
    pdde_ocl_int8(&c, sa);
    pdde_ocl_int8(&c, bstr);
    return pdde_ocl_launch_n(&c, s, n);
}

static pdde_status pdde_ocl_unary(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node, int op, float f) {
    const pdde_tensor *x = node->src[0];
    int64_t n = pdde_ocl_numel(node);
    if (n == 0) return PDDE_OK;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_unary);
    pdde_ocl_int(&c, op);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, n);
    pdde_ocl_float(&c, f);
    return pdde_ocl_launch_n(&c, s, n);
}

static pdde_status pdde_ocl_unary_back(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node, int op) {
    const pdde_tensor *x = node->src[0], *dy = node->src[1];
    int64_t n = pdde_ocl_numel(node);
    if (n == 0) return PDDE_OK;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_unary_back);
    pdde_ocl_int(&c, op);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(dy));
    pdde_ocl_long(&c, PDDE_OCL_OFF(dy));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, n);
    return pdde_ocl_launch_n(&c, s, n);
}

/* LAYERNORM / RMSNORM forward and their dx */
static pdde_status pdde_ocl_norm(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node, int rms, int back) {
    const pdde_tensor *x = node->src[0], *g = node->src[1];
    const pdde_tensor *third = back ? node->src[2] : (rms ? node->src[1] : node->src[2]); /* dy or beta */
    int64_t C = pdde_ocl_last(x), rows = C ? pdde_ocl_numel(x) / C : 0;
    if (rows == 0 || C == 0) return PDDE_OK;
    pdde_ocl_call c = pdde_ocl_begin(d, back ? PDDE_OCL_K_norm_back : PDDE_OCL_K_norm);
    pdde_ocl_int(&c, rms);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(g));
    pdde_ocl_long(&c, PDDE_OCL_OFF(g));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(third));
    pdde_ocl_long(&c, PDDE_OCL_OFF(third));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_int(&c, (int)C);
    pdde_ocl_float(&c, node->fparams[0]);
    pdde_ocl_local(&c, d->wg * sizeof(float));
    return pdde_ocl_launch_rows(&c, s, rows);
}

/* LAYERNORM_BACK_GAMMA / RMSNORM_BACK_GAMMA: row statistics into scratch, then one work-item per column */
static pdde_status pdde_ocl_norm_back_gamma(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node, int rms) {
    const pdde_tensor *x = node->src[0], *dy = node->src[1];
    int64_t C = pdde_ocl_last(x), rows = C ? pdde_ocl_numel(x) / C : 0;
    if (C == 0) return PDDE_OK;
    if (rows == 0) return pdde_ocl_fill(d, s, PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), C, 0.0f);
    cl_mem st = NULL;
    pdde_status r = pdde_ocl_scratch(d, s, (size_t)rows * 2 * sizeof(float), &st);
    if (r != PDDE_OK) return r;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_row_stats);
    pdde_ocl_int(&c, rms);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, st);
    pdde_ocl_int(&c, (int)C);
    pdde_ocl_float(&c, node->fparams[0]);
    pdde_ocl_local(&c, d->wg * sizeof(float));
    if ((r = pdde_ocl_launch_rows(&c, s, rows)) != PDDE_OK) return r;
    c = pdde_ocl_begin(d, PDDE_OCL_K_norm_back_gamma);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(dy));
    pdde_ocl_long(&c, PDDE_OCL_OFF(dy));
    pdde_ocl_mem(&c, st);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, rows);
    pdde_ocl_int(&c, (int)C);
    return pdde_ocl_launch_n(&c, s, C);
}

static pdde_status pdde_ocl_softmax(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int64_t C = pdde_ocl_last(x), rows = C ? pdde_ocl_numel(x) / C : 0;
    if (rows == 0) return PDDE_OK;
    int64_t T = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_softmax);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_int(&c, (int)C);
    pdde_ocl_int(&c, node->iparams[0] != 0);
    pdde_ocl_int(&c, (int)(T > 0 ? T : 1));
    pdde_ocl_local(&c, d->wg * sizeof(float));
    return pdde_ocl_launch_rows(&c, s, rows);
}

static pdde_status pdde_ocl_softmax_back(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *y = node->src[0], *dy = node->src[1];
    int64_t C = pdde_ocl_last(y), rows = C ? pdde_ocl_numel(y) / C : 0;
    if (rows == 0) return PDDE_OK;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_softmax_back);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(y));
    pdde_ocl_long(&c, PDDE_OCL_OFF(y));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(dy));
    pdde_ocl_long(&c, PDDE_OCL_OFF(dy));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_int(&c, (int)C);
    pdde_ocl_local(&c, d->wg * sizeof(float));
    return pdde_ocl_launch_rows(&c, s, rows);
}

static pdde_status pdde_ocl_cross_entropy(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0], *t = node->src[1];
    int64_t V = pdde_ocl_last(x), N = pdde_ocl_numel(t);
    cl_mem st = NULL;
    pdde_status r = pdde_ocl_scratch(d, s, (size_t)(N > 0 ? N : 1) * 2 * sizeof(float), &st);
    if (r != PDDE_OK) return r;
    pdde_ocl_call c;
    if (N > 0 && V > 0) {
        c = pdde_ocl_begin(d, PDDE_OCL_K_ce_rows);
        pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
        pdde_ocl_long(&c, PDDE_OCL_OFF(x));
        pdde_ocl_mem(&c, PDDE_OCL_MEM(t));
        pdde_ocl_long(&c, PDDE_OCL_OFF(t));
        pdde_ocl_mem(&c, st);
        pdde_ocl_int(&c, (int)V);
        pdde_ocl_local(&c, d->wg * sizeof(float));
        if ((r = pdde_ocl_launch_rows(&c, s, N)) != PDDE_OK) return r;
    } else {
        N = 0;
    }
    c = pdde_ocl_begin(d, PDDE_OCL_K_ce_reduce);
    pdde_ocl_mem(&c, st);
    pdde_ocl_long(&c, N);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_local(&c, d->wg * sizeof(float));
    return pdde_ocl_launch_rows(&c, s, 1);
}

static pdde_status pdde_ocl_cross_entropy_back(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0], *t = node->src[1], *dl = node->src[2];
    int64_t V = pdde_ocl_last(x), N = pdde_ocl_numel(t);
    if (N == 0 || V == 0) return PDDE_OK;
    cl_mem st = NULL;
    pdde_status r = pdde_ocl_scratch(d, s, sizeof(float), &st);
    if (r != PDDE_OK) return r;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_ce_count);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(t));
    pdde_ocl_long(&c, PDDE_OCL_OFF(t));
    pdde_ocl_long(&c, N);
    pdde_ocl_int(&c, (int)V);
    pdde_ocl_mem(&c, st);
    pdde_ocl_local(&c, d->wg * sizeof(float));
    if ((r = pdde_ocl_launch_rows(&c, s, 1)) != PDDE_OK) return r;
    c = pdde_ocl_begin(d, PDDE_OCL_K_ce_back);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(t));
    pdde_ocl_long(&c, PDDE_OCL_OFF(t));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(dl));
    pdde_ocl_long(&c, PDDE_OCL_OFF(dl));
    pdde_ocl_mem(&c, st);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_int(&c, (int)V);
    pdde_ocl_local(&c, d->wg * sizeof(float));
    return pdde_ocl_launch_rows(&c, s, N);
}

static pdde_status pdde_ocl_embedding(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *w = node->src[0], *ids = node->src[1];
    int64_t C = pdde_ocl_last(w), V = w->ndim >= 2 ? w->shape[0] : 1, n = pdde_ocl_numel(node);
    if (n == 0 || C == 0) return PDDE_OK;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_embedding);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(w));
    pdde_ocl_long(&c, PDDE_OCL_OFF(w));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(ids));
    pdde_ocl_long(&c, PDDE_OCL_OFF(ids));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, n);
    pdde_ocl_int(&c, (int)C);
    pdde_ocl_int(&c, (int)V);
    return pdde_ocl_launch_n(&c, s, n);
}

/* src: [base grad,] ids, dy. Without a base the gradient starts from zeros. */
static pdde_status pdde_ocl_embedding_back(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    int has_base = node->nsrc == 3;
    const pdde_tensor *ids = node->src[has_base ? 1 : 0], *dy = node->src[has_base ? 2 : 1];
    int64_t C = pdde_ocl_last(node), V = node->ndim >= 2 ? node->shape[0] : 1, N = pdde_ocl_numel(ids);
    pdde_status r = has_base ? pdde_ocl_copy_bytes(d, s, node->src[0], node, pdde_tensor_nbytes(node))
                             : pdde_ocl_fill(d, s, PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), pdde_ocl_numel(node), 0.0f);
    if (r != PDDE_OK || N == 0 || C == 0) return r;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_embedding_back);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(ids));
    pdde_ocl_long(&c, PDDE_OCL_OFF(ids));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(dy));
    pdde_ocl_long(&c, PDDE_OCL_OFF(dy));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, N);
    pdde_ocl_int(&c, (int)C);
    pdde_ocl_int(&c, (int)V);
    return pdde_ocl_launch_n(&c, s, C);
}

static pdde_status pdde_ocl_gather(pdde_ocl_device *d, pdde_ocl_stream *s, const pdde_tensor *x, pdde_tensor *node,
                                   const int shp[8], const int str[8], float f) {
    int64_t n = pdde_ocl_numel(node);
    if (n == 0) return PDDE_OK;
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_gather);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, n);
    pdde_ocl_int8(&c, shp);
    pdde_ocl_int8(&c, str);
    pdde_ocl_float(&c, f);
    return pdde_ocl_launch_n(&c, s, n);
}

static pdde_status pdde_ocl_permute(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int xs[8], xstr[8], shp[8], str[8];
    pdde_ocl_pad(x, xs);
    pdde_ocl_strides(xs, xstr, 0);
    pdde_ocl_pad(node, shp);
    for (int i = 0; i < 8; i++) str[i] = 0;
    int pad = 6 - node->ndim;
    for (int i = 0; i < node->ndim; i++) str[pad + i] = xstr[6 - x->ndim + node->iparams[i]];
    return pdde_ocl_gather(d, s, x, node, shp, str, 1.0f);
}

static pdde_status pdde_ocl_expand(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int xs[8], str[8], shp[8];
    pdde_ocl_pad(x, xs);
    pdde_ocl_strides(xs, str, 1);
    pdde_ocl_pad(node, shp);
    return pdde_ocl_gather(d, s, x, node, shp, str, node->fparams[0]);
}

/* y[yo + row] = (add ? add : 0) + scale * sum over each row of L elements of x (or of x^2) */
static pdde_status pdde_ocl_reduce_rows(pdde_ocl_device *d, pdde_ocl_stream *s, cl_mem x, int64_t xo, cl_mem y,
                                        int64_t yo, int64_t rows, int64_t L, float scale, int sq,
                                        const pdde_tensor *add) {
    pdde_status r;
    /* a long single row: partial sums over chunks first, so that more than one work-group runs */
    if (rows == 1 && L > 16 * (int64_t)d->wg * 64) {
        int64_t chunks = 256, chunk = (L + chunks - 1) / chunks;
        chunks = (L + chunk - 1) / chunk;
        cl_mem st = NULL;
        if ((r = pdde_ocl_scratch(d, s, (size_t)chunks * sizeof(float), &st)) != PDDE_OK) return r;
        pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_sum_chunks);
        pdde_ocl_mem(&c, x);
        pdde_ocl_long(&c, xo);
        pdde_ocl_long(&c, L);
        pdde_ocl_long(&c, chunk);
        pdde_ocl_int(&c, sq);
        pdde_ocl_mem(&c, st);
        pdde_ocl_local(&c, d->wg * sizeof(float));
        if ((r = pdde_ocl_launch_rows(&c, s, chunks)) != PDDE_OK) return r;
        x = st;
        xo = 0;
        L = chunks;
        sq = 0;
    }
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_reduce_rows);
    pdde_ocl_mem(&c, x);
    pdde_ocl_long(&c, xo);
    pdde_ocl_mem(&c, y);
    pdde_ocl_long(&c, yo);
    pdde_ocl_long(&c, L);
    pdde_ocl_float(&c, scale);
    pdde_ocl_int(&c, sq);
    pdde_ocl_mem(&c, add ? PDDE_OCL_MEM(add) : y);
    pdde_ocl_long(&c, add ? PDDE_OCL_OFF(add) : 0);
    pdde_ocl_int(&c, add != NULL);
    pdde_ocl_local(&c, d->wg * sizeof(float));
    return pdde_ocl_launch_rows(&c, s, rows);
}

static pdde_status pdde_ocl_reduce_mid(pdde_ocl_device *d, pdde_ocl_stream *s, const pdde_tensor *x, pdde_tensor *node,
                                       int64_t outer, int64_t L, int64_t inner, float scale) {
    if (outer * inner == 0) return PDDE_OK;
    if (inner == 1)
        return pdde_ocl_reduce_rows(d, s, PDDE_OCL_MEM(x), PDDE_OCL_OFF(x), PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), outer,
                                    L, scale, 0, NULL);
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_reduce_mid);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, outer);
    pdde_ocl_long(&c, L);
    pdde_ocl_long(&c, inner);
    pdde_ocl_float(&c, scale);
    return pdde_ocl_launch_n(&c, s, outer * inner);
}

/* SUM / MEAN over one axis or all */
static pdde_status pdde_ocl_sum(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node, int mean) {
    const pdde_tensor *x = node->src[0];
    int axis = node->iparams[0];
    int64_t n = pdde_ocl_numel(x);
    if (axis < 0 || x->ndim == 0) {
        float scale = mean ? (float)(1.0 / (double)n) : 1.0f;
        if (n == 0) return pdde_ocl_fill(d, s, PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), 1, 0.0f);
        return pdde_ocl_reduce_rows(d, s, PDDE_OCL_MEM(x), PDDE_OCL_OFF(x), PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), 1, n,
                                    scale, 0, NULL);
    }
    int64_t outer = 1, inner = 1, L = x->shape[axis];
    for (int i = 0; i < axis; i++) outer *= x->shape[i];
    for (int i = axis + 1; i < x->ndim; i++) inner *= x->shape[i];
    if (L == 0) return pdde_ocl_fill(d, s, PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), outer * inner, 0.0f);
    return pdde_ocl_reduce_mid(d, s, x, node, outer, L, inner, mean ? 1.0f / (float)L : 1.0f);
}

/* SUM_TO: reduce src0 to this node's broadcast-compatible shape */
static pdde_status pdde_ocl_sum_to(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int64_t n = pdde_ocl_numel(node), nx = pdde_ocl_numel(x);
    if (n == 0) return PDDE_OK;
    if (nx == 0) return pdde_ocl_fill(d, s, PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), n, 0.0f);
    if (n == nx) return pdde_ocl_copy_bytes(d, s, x, node, pdde_tensor_nbytes(node));
    int xs[8], os[8], str[8], rs[8];
    pdde_ocl_pad(x, xs);
    pdde_ocl_pad(node, os);
    pdde_ocl_strides(xs, str, 0);
    /* reduced dims only leading: [R, n] -> [n] */
    int lead = 1, seen_kept = 0;
    for (int i = 0; i < 6; i++) {
        int red = os[i] == 1 && xs[i] != 1;
        if (!red && xs[i] != 1) seen_kept = 1;
        if (red && seen_kept) lead = 0;
    }
    if (lead) return pdde_ocl_reduce_mid(d, s, x, node, 1, nx / n, n, 1.0f);
    int64_t R = 1;
    for (int i = 0; i < 8; i++) rs[i] = 1;
    for (int i = 0; i < 6; i++)
        if (os[i] == 1 && xs[i] != 1) { rs[i] = xs[i]; R *= xs[i]; }
    /* all reduced dims trailing: rows of R */
    int trail = 1, seen_red = 0;
    for (int i = 0; i < 6; i++) {
        int red = os[i] == 1 && xs[i] != 1;
        if (red) seen_red = 1;
        else if (xs[i] != 1 && seen_red) trail = 0;
    }
    if (trail) return pdde_ocl_reduce_mid(d, s, x, node, n, R, 1, 1.0f);
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_reduce_gen);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, n);
    pdde_ocl_long(&c, R);
    pdde_ocl_int8(&c, os);
    pdde_ocl_int8(&c, rs);
    pdde_ocl_int8(&c, str);
    pdde_ocl_float(&c, 1.0f);
    return pdde_ocl_launch_n(&c, s, n);
}

/* outer x inner block geometry of an axis */
static void pdde_ocl_axis(const pdde_tensor *t, int axis, int64_t *outer, int64_t *inner) {
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < axis; i++) *outer *= t->shape[i];
    for (int i = axis + 1; i < t->ndim; i++) *inner *= t->shape[i];
}

static pdde_status pdde_ocl_concat(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    int axis = node->iparams[0];
    int64_t outer, inner, pos = 0;
    pdde_ocl_axis(node, axis, &outer, &inner);
    int64_t total = node->shape[axis] * inner;
    for (int i = 0; i < node->nsrc; i++) {
        const pdde_tensor *x = node->src[i];
        int64_t w = x->shape[axis] * inner;
        pdde_status r = pdde_ocl_copy2d(d, s, PDDE_OCL_MEM(x), PDDE_OCL_OFF(x), w, PDDE_OCL_MEM(node),
                                        PDDE_OCL_OFF(node) + pos, total, outer, w);
        if (r != PDDE_OK) return r;
        pos += w;
    }
    return PDDE_OK;
}

static pdde_status pdde_ocl_slice(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int axis = node->iparams[0];
    int64_t outer, inner, start = node->iparams[1];
    pdde_ocl_axis(x, axis, &outer, &inner);
    int64_t w = node->shape[axis] * inner;
    return pdde_ocl_copy2d(d, s, PDDE_OCL_MEM(x), PDDE_OCL_OFF(x) + start * inner, x->shape[axis] * inner,
                           PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), w, outer, w);
}

/* SLICE_BACK: this node has the sliced tensor's shape; iparams as the forward slice */
static pdde_status pdde_ocl_slice_back(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *dy = node->src[0];
    int axis = node->iparams[0];
    int64_t outer, inner, start = node->iparams[1];
    pdde_ocl_axis(node, axis, &outer, &inner);
    pdde_status r = pdde_ocl_fill(d, s, PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), pdde_ocl_numel(node), 0.0f);
    if (r != PDDE_OK) return r;
    int64_t w = dy->shape[axis] * inner;
    return pdde_ocl_copy2d(d, s, PDDE_OCL_MEM(dy), PDDE_OCL_OFF(dy), w, PDDE_OCL_MEM(node),
                           PDDE_OCL_OFF(node) + start * inner, node->shape[axis] * inner, outer, w);
}

static pdde_status pdde_ocl_dropout(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int64_t n = pdde_ocl_numel(node);
    if (n == 0) return PDDE_OK;
    float p = node->fparams[0];
    double th = (double)p * 4294967296.0; /* exactly as the CPU backend computes it */
    uint32_t threshold = (uint32_t)(th > 4294967295.0 ? 4294967295.0 : th);
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_dropout);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_long(&c, n);
    pdde_ocl_uint(&c, threshold);
    pdde_ocl_float(&c, 1.0f / (1.0f - p));
    pdde_ocl_uint(&c, (uint32_t)node->iparams[0]);
    pdde_ocl_uint(&c, (uint32_t)node->iparams[1]);
    pdde_ocl_uint(&c, (uint32_t)node->iparams[2]);
    return pdde_ocl_launch_n(&c, s, n);
}

static pdde_status pdde_ocl_cast(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *x = node->src[0];
    int64_t n = pdde_ocl_numel(node);
    if (n == 0) return PDDE_OK;
    if (x->dtype == node->dtype) return pdde_ocl_copy_bytes(d, s, x, node, pdde_tensor_nbytes(node));
    pdde_ocl_call c = pdde_ocl_begin(d, PDDE_OCL_K_cast);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(x));
    pdde_ocl_long(&c, PDDE_OCL_OFF(x));
    pdde_ocl_int(&c, (int)x->dtype);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(node));
    pdde_ocl_long(&c, PDDE_OCL_OFF(node));
    pdde_ocl_int(&c, (int)node->dtype);
    pdde_ocl_long(&c, n);
    return pdde_ocl_launch_n(&c, s, n);
}

static pdde_status pdde_ocl_grad_norm_sq(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    const pdde_tensor *g = node->src[0], *prev = node->nsrc > 1 ? node->src[1] : NULL;
    float scale = node->fparams[6];
    int64_t n = pdde_ocl_numel(g);
    return pdde_ocl_reduce_rows(d, s, PDDE_OCL_MEM(g), PDDE_OCL_OFF(g), PDDE_OCL_MEM(node), PDDE_OCL_OFF(node), 1, n,
                                scale * scale, 1, prev);
}

static pdde_status pdde_ocl_update(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node, int adam) {
    const pdde_tensor *p = node->src[0], *g = node->src[1], *m = node->src[2];
    const pdde_tensor *v = adam ? node->src[3] : NULL;
    int ngn = adam ? 4 : 3;
    const pdde_tensor *gn = node->nsrc > ngn ? node->src[ngn] : NULL;
    int64_t n = pdde_ocl_numel(p);
    if (n == 0) return PDDE_OK;
    const float *fp = node->fparams;
    float scale = fp[6];
    pdde_ocl_call c = pdde_ocl_begin(d, adam ? PDDE_OCL_K_adamw : PDDE_OCL_K_sgd);
    pdde_ocl_mem(&c, PDDE_OCL_MEM(p));
    pdde_ocl_long(&c, PDDE_OCL_OFF(p));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(g));
    pdde_ocl_long(&c, PDDE_OCL_OFF(g));
    pdde_ocl_mem(&c, PDDE_OCL_MEM(m));
    pdde_ocl_long(&c, PDDE_OCL_OFF(m));
    if (adam) {
        pdde_ocl_mem(&c, PDDE_OCL_MEM(v));
        pdde_ocl_long(&c, PDDE_OCL_OFF(v));
    }
    pdde_ocl_mem(&c, gn ? PDDE_OCL_MEM(gn) : PDDE_OCL_MEM(p));
    pdde_ocl_long(&c, gn ? PDDE_OCL_OFF(gn) : 0);
    pdde_ocl_int(&c, gn != NULL);
    pdde_ocl_long(&c, n);
    pdde_ocl_float(&c, fp[0]);
    if (adam) {
        int t = node->iparams[0] > 0 ? node->iparams[0] : 1;
        pdde_ocl_float(&c, fp[1]);
        pdde_ocl_float(&c, fp[2]);
        pdde_ocl_float(&c, fp[3]);
        pdde_ocl_float(&c, fp[4]);
        pdde_ocl_float(&c, fp[5]);
        pdde_ocl_float(&c, scale);
        pdde_ocl_float(&c, 1.0f - powf(fp[1], (float)t));
        pdde_ocl_float(&c, 1.0f - powf(fp[2], (float)t));
    } else {
        pdde_ocl_float(&c, fp[1]);
        pdde_ocl_float(&c, fp[4]);
        pdde_ocl_float(&c, fp[5]);
        pdde_ocl_float(&c, scale);
    }
    pdde_status r = pdde_ocl_launch_n(&c, s, n);
    if (r == PDDE_OK && node->data) r = pdde_ocl_copy_bytes(d, s, p, node, pdde_tensor_nbytes(node));
    return r;
}


/* ZeRO-1 shards (iparams[3] = 1): the op covers elements [iparams[1], +iparams[2]) of its first
 * operands (the accumulator / parameter and gradient). Run the plain kernel on 1-d views of that range. */
static pdde_status pdde_ocl_sharded(pdde_ocl_device *d, pdde_ocl_stream *s, pdde_tensor *node) {
    int64_t first = node->iparams[1], count = node->iparams[2];
    pdde_tensor view = *node, src[2];
    int n_ranged = node->op == PDDE_OP_GRAD_NORM_SQ ? 1 : 2; /* grad_accum: acc (ranged) and a shard-sized g */
    for (int k = 0; k < n_ranged; k++) {
        src[k] = *node->src[k];
        bool whole = !(node->op == PDDE_OP_GRAD_ACCUM && k == 1);
        if (whole) src[k].offset += (size_t)first * sizeof(float);
        src[k].ndim = 1, src[k].shape[0] = count;
        view.src[k] = &src[k];
    }
    view.iparams[3] = 0;
    if (node->op == PDDE_OP_GRAD_NORM_SQ) return pdde_ocl_grad_norm_sq(d, s, &view);
    /* grad_accum and the updates write their first operand in place: the output is the same range */
    view.offset += (size_t)first * sizeof(float);
    view.ndim = 1, view.shape[0] = count;
    if (!count) return PDDE_OK;
    if (node->op == PDDE_OP_GRAD_ACCUM) return pdde_ocl_binary(d, s, &view, 0);
    return pdde_ocl_update(d, s, &view, node->op == PDDE_OP_ADAMW_UPDATE);
}

static pdde_status pdde_ocl_compute(void *dev, void *stream, pdde_tensor *node) {
    pdde_ocl_device *d = dev;
    pdde_ocl_stream *s = pdde_ocl_st(d, stream);
    pdde_status st = pdde_ocl_prepare(d);
    if (st != PDDE_OK) return st;
    /* a view the core placed inside its source's memory: nothing to compute */
    if ((node->flags & PDDE_TENSOR_VIEW) && node->nsrc > 0 && node->src[0]->data == node->data) return PDDE_OK;
    switch (node->op) {
    case PDDE_OP_MATMUL: return pdde_ocl_gemm(d, s, node);
    case PDDE_OP_ADD: return pdde_ocl_binary(d, s, node, 0);
    case PDDE_OP_SUB: return pdde_ocl_binary(d, s, node, 1);
    case PDDE_OP_MUL: return pdde_ocl_binary(d, s, node, 2);
    case PDDE_OP_GRAD_ACCUM:
        if (node->iparams[3] == 1) return pdde_ocl_sharded(d, s, node);
        return pdde_ocl_binary(d, s, node, 0);
    case PDDE_OP_SCALE: return pdde_ocl_unary(d, s, node, 0, node->fparams[0]);
    case PDDE_OP_GELU: return pdde_ocl_unary(d, s, node, 1, 0.0f);
    case PDDE_OP_RELU: return pdde_ocl_unary(d, s, node, 2, 0.0f);
    case PDDE_OP_SILU: return pdde_ocl_unary(d, s, node, 3, 0.0f);
    case PDDE_OP_GELU_BACK: return pdde_ocl_unary_back(d, s, node, 1);
    case PDDE_OP_RELU_BACK: return pdde_ocl_unary_back(d, s, node, 2);
    case PDDE_OP_SILU_BACK: return pdde_ocl_unary_back(d, s, node, 3);
    case PDDE_OP_LAYERNORM: return pdde_ocl_norm(d, s, node, 0, 0);
    case PDDE_OP_RMSNORM: return pdde_ocl_norm(d, s, node, 1, 0);
    case PDDE_OP_LAYERNORM_BACK: return pdde_ocl_norm(d, s, node, 0, 1);
    case PDDE_OP_RMSNORM_BACK: return pdde_ocl_norm(d, s, node, 1, 1);
    case PDDE_OP_LAYERNORM_BACK_GAMMA: return pdde_ocl_norm_back_gamma(d, s, node, 0);
    case PDDE_OP_RMSNORM_BACK_GAMMA: return pdde_ocl_norm_back_gamma(d, s, node, 1);
    case PDDE_OP_SOFTMAX: return pdde_ocl_softmax(d, s, node);
    case PDDE_OP_SOFTMAX_BACK: return pdde_ocl_softmax_back(d, s, node);
    case PDDE_OP_CROSS_ENTROPY: return pdde_ocl_cross_entropy(d, s, node);
    case PDDE_OP_CROSS_ENTROPY_BACK: return pdde_ocl_cross_entropy_back(d, s, node);
    case PDDE_OP_EMBEDDING: return pdde_ocl_embedding(d, s, node);
    case PDDE_OP_EMBEDDING_BACK: return pdde_ocl_embedding_back(d, s, node);
    case PDDE_OP_RESHAPE: return pdde_ocl_copy_bytes(d, s, node->src[0], node, pdde_tensor_nbytes(node));
    case PDDE_OP_PERMUTE: return pdde_ocl_permute(d, s, node);
    case PDDE_OP_CONCAT: return pdde_ocl_concat(d, s, node);
    case PDDE_OP_SLICE: return pdde_ocl_slice(d, s, node);
    case PDDE_OP_SLICE_BACK: return pdde_ocl_slice_back(d, s, node);
    case PDDE_OP_SUM: return pdde_ocl_sum(d, s, node, 0);
    case PDDE_OP_MEAN: return pdde_ocl_sum(d, s, node, 1);
    case PDDE_OP_SUM_TO: return pdde_ocl_sum_to(d, s, node);
    case PDDE_OP_EXPAND: return pdde_ocl_expand(d, s, node);
    case PDDE_OP_DROPOUT: return pdde_ocl_dropout(d, s, node);
    case PDDE_OP_DROPOUT_BACK: return pdde_ocl_dropout(d, s, node);
    case PDDE_OP_CAST: return pdde_ocl_cast(d, s, node);
    case PDDE_OP_GRAD_NORM_SQ: case PDDE_OP_SGD_UPDATE: case PDDE_OP_ADAMW_UPDATE:
        if (node->iparams[3] == 1) return pdde_ocl_sharded(d, s, node);
        if (node->op == PDDE_OP_GRAD_NORM_SQ) return pdde_ocl_grad_norm_sq(d, s, node);
        return pdde_ocl_update(d, s, node, node->op == PDDE_OP_ADAMW_UPDATE);
    default:
        return pdde_error(d->fam->ctx, PDDE_ERR_UNSUPPORTED, "opencl %s: op %s is not supported", d->props.name,
                          pdde_op_name(node->op));
    }
}

/* ------------------------------------------------------------------------------------------------
 * What this backend runs: f32 data, i32 ids and targets, casts between every dtype. */

static int pdde_ocl_all_f32(const pdde_tensor *node, int from, int to) {
    for (int i = from; i < to && i < node->nsrc; i++)
        if (node->src[i]->dtype != PDDE_F32) return 0;
    return 1;
}

static int pdde_ocl_supports_op(void *dev, const pdde_tensor *node) {
    (void)dev;
    if (!node || node->ndim > 6) return 0;
    for (int i = 0; i < node->nsrc; i++)
        if (!node->src[i] || node->src[i]->ndim > 6) return 0;
    if (pdde_ocl_numel(node) > INT32_MAX) return 0; /* kernels index rows and columns with int */
    /* vocab-parallel embedding and cross-entropy (iparams set by an SPMD session, on host memory) */
    if ((node->op == PDDE_OP_EMBEDDING || node->op == PDDE_OP_EMBEDDING_BACK || node->op == PDDE_OP_CROSS_ENTROPY ||
         node->op == PDDE_OP_CROSS_ENTROPY_BACK) && (node->iparams[0] || node->iparams[1]))
        return 0;
    switch (node->op) {
    case PDDE_OP_CAST:
        return node->nsrc == 1 && (unsigned)node->dtype < PDDE_DTYPE_COUNT &&
               (unsigned)node->src[0]->dtype < PDDE_DTYPE_COUNT;
    case PDDE_OP_EMBEDDING:
        return node->dtype == PDDE_F32 && node->nsrc == 2 && node->src[0]->dtype == PDDE_F32 &&
               node->src[1]->dtype == PDDE_I32;
    case PDDE_OP_EMBEDDING_BACK: /* [base,] ids, dy */
        if (node->dtype != PDDE_F32 || node->ndim != 2 || node->nsrc < 2 || node->nsrc > 3) return 0;
        if (node->nsrc == 3 && node->src[0]->dtype != PDDE_F32) return 0;
        return node->src[node->nsrc - 2]->dtype == PDDE_I32 && node->src[node->nsrc - 1]->dtype == PDDE_F32;
    case PDDE_OP_CROSS_ENTROPY:
        return node->dtype == PDDE_F32 && node->nsrc == 2 && node->src[0]->dtype == PDDE_F32 &&
               node->src[1]->dtype == PDDE_I32;
    case PDDE_OP_CROSS_ENTROPY_BACK:
        return node->dtype == PDDE_F32 && node->nsrc == 3 && node->src[0]->dtype == PDDE_F32 &&
               node->src[1]->dtype == PDDE_I32 && node->src[2]->dtype == PDDE_F32;
    case PDDE_OP_RESHAPE:
        return node->nsrc == 1 && node->dtype == node->src[0]->dtype;
    case PDDE_OP_MATMUL: {
        if (node->dtype != PDDE_F32 || node->nsrc != 2 || !pdde_ocl_all_f32(node, 0, 2)) return 0;
        const pdde_tensor *a = node->src[0], *b = node->src[1];
        if (node->ndim < 2 || a->ndim < 2 || b->ndim < 2) return 0;
        int64_t M = node->shape[node->ndim - 2], N = node->shape[node->ndim - 1];
        int64_t K = node->iparams[0] ? a->shape[a->ndim - 2] : a->shape[a->ndim - 1];
        if (M == 0 || N == 0 || K == 0) return 1;
        int64_t batch = pdde_ocl_numel(node) / (M * N);
        int64_t ab = pdde_ocl_numel(a) / (M * K), bb = pdde_ocl_numel(b) / (K * N);
        /* each operand: one matrix (shared) or one per batch */
        if (batch != 0 && !((ab == 1 || ab == batch) && (bb == 1 || bb == batch))) return 0;
        return 1;
    }
    case PDDE_OP_ADD: case PDDE_OP_SUB: case PDDE_OP_MUL: case PDDE_OP_SCALE: case PDDE_OP_GELU:
    case PDDE_OP_RELU: case PDDE_OP_SILU: case PDDE_OP_LAYERNORM: case PDDE_OP_RMSNORM: case PDDE_OP_SOFTMAX:
    case PDDE_OP_PERMUTE: case PDDE_OP_CONCAT: case PDDE_OP_SLICE: case PDDE_OP_SUM: case PDDE_OP_MEAN:
    case PDDE_OP_DROPOUT: case PDDE_OP_SUM_TO: case PDDE_OP_EXPAND: case PDDE_OP_GELU_BACK:
    case PDDE_OP_RELU_BACK: case PDDE_OP_SILU_BACK: case PDDE_OP_LAYERNORM_BACK:
    case PDDE_OP_LAYERNORM_BACK_GAMMA: case PDDE_OP_RMSNORM_BACK: case PDDE_OP_RMSNORM_BACK_GAMMA:
    case PDDE_OP_SOFTMAX_BACK: case PDDE_OP_SLICE_BACK: case PDDE_OP_DROPOUT_BACK: case PDDE_OP_GRAD_ACCUM:
    case PDDE_OP_GRAD_NORM_SQ: case PDDE_OP_SGD_UPDATE: case PDDE_OP_ADAMW_UPDATE:
        return node->dtype == PDDE_F32 && node->nsrc >= 1 && pdde_ocl_all_f32(node, 0, node->nsrc);
    default:
        return 0; /* PDDE_OP_NONE (leaves need no kernel), PDDE_OP_COPY (the core's), unknown ops */
    }
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
    .stream_create = pdde_ocl_stream_create,
    .stream_free = pdde_ocl_stream_free,
    .stream_sync = pdde_ocl_stream_sync,
    .compute = pdde_ocl_compute,
    .event_create = pdde_ocl_event_create,
    .event_free = pdde_ocl_event_free,
    .event_record = pdde_ocl_event_record,
    .event_sync = pdde_ocl_event_sync,
    .stream_wait_event = pdde_ocl_stream_wait_event,
};

#endif /* PDDE_OCL_NO_HEADERS */
