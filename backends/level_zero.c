/* backends/level_zero.c — the Level Zero backend: Intel GPUs through oneAPI Level Zero, opened at run time.
 *
 * libze_loader.so.1 is dlopen'ed and the ze* entry points resolved into a table in the family, so pdde
 * builds without the Level Zero headers and reports the family unavailable where no loader or driver
 * is installed. Kernels are OpenCL C (backends/gpu_kernels.cl, the OpenCL backend's) compiled to SPIR-V
 * at build time and embedded (backends/gpu_kernels_spv.h, committed); the driver builds the module when
 * a device is opened. backends/gpu_dispatch.h maps ops to them, as for the CUDA and OpenCL backends.
 *
 * Written against the Level Zero 1.x specification:
 *  - a stream is an immediate command list on a compute queue group; a barrier follows every command,
 *    since a command list may otherwise run its commands concurrently;
 *  - stream_sync appends a barrier that signals the stream's own event and waits for it on the host;
 *  - host <-> device copies go through host allocations (zeMemAllocHost), so the caller's memory
 *    need not be device-accessible: writes are staged before write() returns, reads land in the
 *    caller's memory at the stream's next synchronization;
 *  - kernel arguments are captured when a launch is appended, so one kernel object serves every
 *    launch (a device is driven from one thread at a time, as the executor does). */
#ifndef PDDE_NO_LEVEL_ZERO

#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_moe.h" /* (and gpu_dispatch.h) */
#include "gpu_kernels_spv.h"

/* The Level Zero types used, declared from the specification (ze_api.h is not needed to build). */
typedef int pze_result;
typedef struct pze_driver_st *pze_driver;
typedef struct pze_device_st *pze_device;
typedef struct pze_context_st *pze_context;
typedef struct pze_cmdlist_st *pze_cmdlist;
typedef struct pze_module_st *pze_module;
typedef struct pze_kernel_st *pze_kernel;
typedef struct pze_event_pool_st *pze_event_pool;
typedef struct pze_event_st *pze_event;
typedef struct pze_build_log_st *pze_build_log;

enum {
    PZE_RESULT_SUCCESS = 0,
    PZE_RESULT_NOT_READY = 1, /* a wait that timed out */
    PZE_RESULT_ERROR_OUT_OF_HOST_MEMORY = 0x70000002,
    PZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY = 0x70000003,
    PZE_RESULT_ERROR_MODULE_BUILD_FAILURE = 0x70000004,
    PZE_STYPE_DEVICE_PROPERTIES = 0x3,
    PZE_STYPE_DEVICE_COMPUTE_PROPERTIES = 0x4,
    PZE_STYPE_DEVICE_MEMORY_PROPERTIES = 0x7,
    PZE_STYPE_COMMAND_QUEUE_GROUP_PROPERTIES = 0x6,
    PZE_STYPE_CONTEXT_DESC = 0xd,
    PZE_STYPE_COMMAND_QUEUE_DESC = 0xe,
    PZE_STYPE_EVENT_POOL_DESC = 0x10,
    PZE_STYPE_EVENT_DESC = 0x11,
    PZE_STYPE_DEVICE_MEM_ALLOC_DESC = 0x15,
    PZE_STYPE_HOST_MEM_ALLOC_DESC = 0x16,
    PZE_STYPE_MODULE_DESC = 0x1b,
    PZE_STYPE_KERNEL_DESC = 0x1d,
    PZE_DEVICE_TYPE_GPU = 1,
    PZE_QUEUE_GROUP_FLAG_COMPUTE = 1,
    PZE_QUEUE_MODE_ASYNCHRONOUS = 2,
    PZE_EVENT_POOL_FLAG_HOST_VISIBLE = 1,
    PZE_EVENT_SCOPE_FLAG_HOST = 4,
    PZE_MODULE_FORMAT_IL_SPIRV = 0,
};

typedef struct {
    int stype;
    void *pNext;
    int type;
    uint32_t vendorId, deviceId, flags, subdeviceId, coreClockRate;
    uint64_t maxMemAllocSize;
    uint32_t maxHardwareContexts, maxCommandQueuePriority, numThreadsPerEU, physicalEUSimdWidth, numEUsPerSubslice,
        numSubslicesPerSlice, numSlices;
    uint64_t timerResolution;
    uint32_t timestampValidBits, kernelTimestampValidBits;
    uint8_t uuid[16];
    char name[256];
} pze_device_properties;

typedef struct {
    int stype;
    void *pNext;
    uint32_t maxTotalGroupSize, maxGroupSizeX, maxGroupSizeY, maxGroupSizeZ, maxGroupCountX, maxGroupCountY,
        maxGroupCountZ, maxSharedLocalMemory, numSubGroupSizes, subGroupSizes[8];
} pze_device_compute_properties;

typedef struct {
    int stype;
    void *pNext;
    uint32_t flags, maxClockRate, maxBusWidth;
    uint64_t totalSize;
    char name[256];
} pze_device_memory_properties;

typedef struct {
    int stype;
    void *pNext;
    uint32_t flags;
    size_t maxMemoryFillPatternSize;
    uint32_t numQueues;
} pze_queue_group_properties;

typedef struct { int stype; const void *pNext; uint32_t flags; } pze_context_desc;
typedef struct {
    int stype;
    const void *pNext;
    uint32_t ordinal, index, flags;
    int mode, priority;
} pze_command_queue_desc;
typedef struct { int stype; const void *pNext; uint32_t flags, ordinal; } pze_device_mem_alloc_desc;
typedef struct { int stype; const void *pNext; uint32_t flags; } pze_host_mem_alloc_desc;
typedef struct {
    int stype;
    const void *pNext;
    int format;
    size_t inputSize;
    const uint8_t *pInputModule;
    const char *pBuildFlags;
    const void *pConstants;
} pze_module_desc;
typedef struct { int stype; const void *pNext; uint32_t flags; const char *pKernelName; } pze_kernel_desc;
typedef struct { int stype; const void *pNext; uint32_t flags, count; } pze_event_pool_desc;
typedef struct { int stype; const void *pNext; uint32_t index, signal, wait; } pze_event_desc;
typedef struct { uint32_t x, y, z; } pze_group_count;

/* Where the real header is at hand, check the declarations above against it. */
#if defined(__has_include) && !defined(PDDE_NO_ZE_ABI_CHECK)
#if __has_include(<level_zero/ze_api.h>)
#include <level_zero/ze_api.h>
#define PZE_SAME(a, b) _Static_assert(sizeof(a) == sizeof(b), #a " does not match " #b)
PZE_SAME(pze_device_properties, ze_device_properties_t);
PZE_SAME(pze_device_compute_properties, ze_device_compute_properties_t);
PZE_SAME(pze_device_memory_properties, ze_device_memory_properties_t);
PZE_SAME(pze_queue_group_properties, ze_command_queue_group_properties_t);
PZE_SAME(pze_context_desc, ze_context_desc_t);
PZE_SAME(pze_command_queue_desc, ze_command_queue_desc_t);
PZE_SAME(pze_device_mem_alloc_desc, ze_device_mem_alloc_desc_t);
PZE_SAME(pze_host_mem_alloc_desc, ze_host_mem_alloc_desc_t);
PZE_SAME(pze_module_desc, ze_module_desc_t);
PZE_SAME(pze_kernel_desc, ze_kernel_desc_t);
PZE_SAME(pze_event_pool_desc, ze_event_pool_desc_t);
PZE_SAME(pze_event_desc, ze_event_desc_t);
PZE_SAME(pze_group_count, ze_group_count_t);
_Static_assert(offsetof(pze_device_properties, name) == offsetof(ze_device_properties_t, name), "name offset");
_Static_assert(offsetof(pze_device_memory_properties, totalSize) == offsetof(ze_device_memory_properties_t, totalSize),
               "totalSize offset");
_Static_assert(offsetof(pze_module_desc, pInputModule) == offsetof(ze_module_desc_t, pInputModule), "module offset");
_Static_assert((int)PZE_STYPE_DEVICE_PROPERTIES == (int)ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES, "stype DEVICE_PROPERTIES");
_Static_assert((int)PZE_STYPE_DEVICE_COMPUTE_PROPERTIES == (int)ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES, "stype DEVICE_COMPUTE_PROPERTIES");
_Static_assert((int)PZE_STYPE_DEVICE_MEMORY_PROPERTIES == (int)ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES, "stype DEVICE_MEMORY_PROPERTIES");
_Static_assert((int)PZE_STYPE_COMMAND_QUEUE_GROUP_PROPERTIES == (int)ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES, "stype COMMAND_QUEUE_GROUP_PROPERTIES");
_Static_assert((int)PZE_STYPE_CONTEXT_DESC == (int)ZE_STRUCTURE_TYPE_CONTEXT_DESC, "stype CONTEXT_DESC");
_Static_assert((int)PZE_STYPE_COMMAND_QUEUE_DESC == (int)ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC, "stype COMMAND_QUEUE_DESC");
_Static_assert((int)PZE_STYPE_EVENT_POOL_DESC == (int)ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, "stype EVENT_POOL_DESC");
_Static_assert((int)PZE_STYPE_EVENT_DESC == (int)ZE_STRUCTURE_TYPE_EVENT_DESC, "stype EVENT_DESC");
_Static_assert((int)PZE_STYPE_DEVICE_MEM_ALLOC_DESC == (int)ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC, "stype DEVICE_MEM_ALLOC_DESC");
_Static_assert((int)PZE_STYPE_HOST_MEM_ALLOC_DESC == (int)ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC, "stype HOST_MEM_ALLOC_DESC");
_Static_assert((int)PZE_STYPE_MODULE_DESC == (int)ZE_STRUCTURE_TYPE_MODULE_DESC, "stype MODULE_DESC");
_Static_assert((int)PZE_STYPE_KERNEL_DESC == (int)ZE_STRUCTURE_TYPE_KERNEL_DESC, "stype KERNEL_DESC");
_Static_assert((int)PZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY == (int)ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY, "RESULT_ERROR_OUT_OF_DEVICE_MEMORY");
_Static_assert((int)PZE_RESULT_ERROR_OUT_OF_HOST_MEMORY == (int)ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY, "RESULT_ERROR_OUT_OF_HOST_MEMORY");
_Static_assert((int)PZE_DEVICE_TYPE_GPU == (int)ZE_DEVICE_TYPE_GPU, "DEVICE_TYPE_GPU");
_Static_assert((int)PZE_QUEUE_GROUP_FLAG_COMPUTE == (int)ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE, "QUEUE_GROUP_FLAG_COMPUTE");
_Static_assert((int)PZE_QUEUE_MODE_ASYNCHRONOUS == (int)ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS, "QUEUE_MODE_ASYNCHRONOUS");
_Static_assert((int)PZE_EVENT_POOL_FLAG_HOST_VISIBLE == (int)ZE_EVENT_POOL_FLAG_HOST_VISIBLE, "EVENT_POOL_FLAG_HOST_VISIBLE");
_Static_assert((int)PZE_EVENT_SCOPE_FLAG_HOST == (int)ZE_EVENT_SCOPE_FLAG_HOST, "EVENT_SCOPE_FLAG_HOST");
_Static_assert((int)PZE_MODULE_FORMAT_IL_SPIRV == (int)ZE_MODULE_FORMAT_IL_SPIRV, "MODULE_FORMAT_IL_SPIRV");
#undef PZE_SAME
#endif
#endif

typedef struct {
    pze_result (*Init)(uint32_t);
    pze_result (*DriverGet)(uint32_t *, pze_driver *);
    pze_result (*DeviceGet)(pze_driver, uint32_t *, pze_device *);
    pze_result (*DeviceGetProperties)(pze_device, pze_device_properties *);
    pze_result (*DeviceGetComputeProperties)(pze_device, pze_device_compute_properties *);
    pze_result (*DeviceGetMemoryProperties)(pze_device, uint32_t *, pze_device_memory_properties *);
    pze_result (*DeviceGetCommandQueueGroupProperties)(pze_device, uint32_t *, pze_queue_group_properties *);
    pze_result (*ContextCreate)(pze_driver, const pze_context_desc *, pze_context *);
    pze_result (*ContextDestroy)(pze_context);
    pze_result (*CommandListCreateImmediate)(pze_context, pze_device, const pze_command_queue_desc *, pze_cmdlist *);
    pze_result (*CommandListDestroy)(pze_cmdlist);
    pze_result (*CommandListAppendBarrier)(pze_cmdlist, pze_event, uint32_t, pze_event *);
    pze_result (*CommandListAppendMemoryCopy)(pze_cmdlist, void *, const void *, size_t, pze_event, uint32_t,
                                              pze_event *);
    pze_result (*CommandListAppendMemoryFill)(pze_cmdlist, void *, const void *, size_t, size_t, pze_event, uint32_t,
                                              pze_event *);
    pze_result (*CommandListAppendLaunchKernel)(pze_cmdlist, pze_kernel, const pze_group_count *, pze_event, uint32_t,
                                                pze_event *);
    pze_result (*CommandListAppendWaitOnEvents)(pze_cmdlist, uint32_t, pze_event *);
    pze_result (*EventPoolCreate)(pze_context, const pze_event_pool_desc *, uint32_t, pze_device *, pze_event_pool *);
    pze_result (*EventPoolDestroy)(pze_event_pool);
    pze_result (*EventCreate)(pze_event_pool, const pze_event_desc *, pze_event *);
    pze_result (*EventDestroy)(pze_event);
    pze_result (*EventHostSynchronize)(pze_event, uint64_t);
    pze_result (*EventHostReset)(pze_event);
    pze_result (*MemAllocDevice)(pze_context, const pze_device_mem_alloc_desc *, size_t, size_t, pze_device, void **);
    pze_result (*MemAllocHost)(pze_context, const pze_host_mem_alloc_desc *, size_t, size_t, void **);
    pze_result (*MemFree)(pze_context, void *);
    pze_result (*ModuleCreate)(pze_context, pze_device, const pze_module_desc *, pze_module *, pze_build_log *);
    pze_result (*ModuleDestroy)(pze_module);
    pze_result (*ModuleBuildLogGetString)(pze_build_log, size_t *, char *);
    pze_result (*ModuleBuildLogDestroy)(pze_build_log);
    pze_result (*KernelCreate)(pze_module, const pze_kernel_desc *, pze_kernel *);
    pze_result (*KernelDestroy)(pze_kernel);
    pze_result (*KernelSetGroupSize)(pze_kernel, uint32_t, uint32_t, uint32_t);
    pze_result (*KernelSetArgumentValue)(pze_kernel, uint32_t, size_t, const void *);
} pze_api;

static const struct { const char *name; size_t off; } pze_syms[] = {
#define PZE_SYM(field) {"ze" #field, offsetof(pze_api, field)}
    PZE_SYM(Init), PZE_SYM(DriverGet), PZE_SYM(DeviceGet), PZE_SYM(DeviceGetProperties),
    PZE_SYM(DeviceGetComputeProperties), PZE_SYM(DeviceGetMemoryProperties),
    PZE_SYM(DeviceGetCommandQueueGroupProperties), PZE_SYM(ContextCreate), PZE_SYM(ContextDestroy),
    PZE_SYM(CommandListCreateImmediate), PZE_SYM(CommandListDestroy), PZE_SYM(CommandListAppendBarrier),
    PZE_SYM(CommandListAppendMemoryCopy), PZE_SYM(CommandListAppendMemoryFill), PZE_SYM(CommandListAppendLaunchKernel),
    PZE_SYM(CommandListAppendWaitOnEvents), PZE_SYM(EventPoolCreate), PZE_SYM(EventPoolDestroy), PZE_SYM(EventCreate),
    PZE_SYM(EventDestroy), PZE_SYM(EventHostSynchronize), PZE_SYM(EventHostReset), PZE_SYM(MemAllocDevice),
    PZE_SYM(MemAllocHost), PZE_SYM(MemFree), PZE_SYM(ModuleCreate), PZE_SYM(ModuleDestroy),
    PZE_SYM(ModuleBuildLogGetString), PZE_SYM(ModuleBuildLogDestroy), PZE_SYM(KernelCreate), PZE_SYM(KernelDestroy),
    PZE_SYM(KernelSetGroupSize), PZE_SYM(KernelSetArgumentValue),
#undef PZE_SYM
};

#define PZE_MAX_EVENTS 256

typedef struct {
    pze_driver driver;
    pze_device device;
    pze_device_properties props;
    uint64_t memory;
    uint32_t max_group;
} pze_dev_info;

typedef struct {
    pdde_context *ctx;
    void *lib;
    pze_api ze;
    int n_devices;
    pze_dev_info *info;
} pze_family;

typedef struct { void *host, *dst; size_t n; } pze_pending; /* a staging buffer, and where a read lands */

typedef struct {
    pze_cmdlist list;
    pze_event done;      /* signalled by the barrier that stream_sync appends */
    int done_index;
    void *scratch;
    size_t scratch_bytes;
    pze_pending *pend;   /* staging buffers released (and reads delivered) at the next sync */
    int n_pend, cap_pend;
} pze_stream;

typedef struct {
    pze_event ev;
    int index;
} pze_ev;

typedef struct {
    pze_family *fam;
    pze_dev_info *info;
    pze_context context;
    uint32_t ordinal;
    pze_module module;
    pze_kernel kern[PGD_K_COUNT];
    pthread_mutex_t launch_lock; /* a kernel's arguments and its launch (the kernels are the device's, shared by every stream); the event slots */
    pze_event_pool pool;
    unsigned char used[PZE_MAX_EVENTS];
    pze_stream *default_stream;
    unsigned units, max_block;
} pze_dev;

/* Every host wait on the device ends: work not done after this long is taken as a hung device and
 * reported (PDDE_ERR_TIMEOUT), rather than waited on forever. */
#define PZE_SYNC_TIMEOUT_NS 600000000000ull

static int pze_fail(pze_family *f, pze_result r, const char *what, size_t nbytes) {
    if (r == PZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)
        return pdde_error(f->ctx, PDDE_ERR_DEVICE_OOM, "level_zero: %s: out of device memory (%zu bytes requested)",
                          what, nbytes);
    if (r == PZE_RESULT_ERROR_OUT_OF_HOST_MEMORY)
        return pdde_error(f->ctx, PDDE_ERR_OOM, "level_zero: %s: out of host memory (%zu bytes requested)", what, nbytes);
    if (r == PZE_RESULT_NOT_READY)
        return pdde_error(f->ctx, PDDE_ERR_TIMEOUT, "level_zero: %s: the device has not finished after %.0f s (hung?)", what,
                          PZE_SYNC_TIMEOUT_NS / 1e9);
    return pdde_error(f->ctx, PDDE_ERR_BACKEND, "level_zero: %s failed: ze_result_t 0x%x", what, (unsigned)r);
}

#define PZE_CHECK(dev, call, what)                                          \
    do {                                                                    \
        pze_result r_ = (call);                                             \
        if (r_ != PZE_RESULT_SUCCESS) return pze_fail((dev)->fam, r_, (what), 0); \
    } while (0)

/* --------------------------------------------------------------------------------------------------
 * Family */

static pdde_status pze_init(pdde_context *ctx, void **family, int *n_devices) {
    *family = NULL;
    *n_devices = 0;
    void *lib = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no Level Zero driver (libze_loader.so.1 not found)");
    pze_family *f = calloc(1, sizeof *f);
    if (!f) return pdde_error(ctx, PDDE_ERR_OOM, "level_zero: out of host memory");
    f->ctx = ctx;
    f->lib = lib;
    for (size_t i = 0; i < sizeof pze_syms / sizeof pze_syms[0]; i++) {
        void *p = dlsym(lib, pze_syms[i].name);
        if (!p) {
            pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no Level Zero driver: the loader lacks %s", pze_syms[i].name);
            free(f);
            dlclose(lib);
            return PDDE_ERR_UNAVAILABLE;
        }
        memcpy((char *)&f->ze + pze_syms[i].off, &p, sizeof p);
    }
    /* The loader stays loaded from here on: drivers it loaded may have registered exit handlers. */
    pze_result r = f->ze.Init(0);
    uint32_t n_drivers = 0;
    if (r == PZE_RESULT_SUCCESS) r = f->ze.DriverGet(&n_drivers, NULL);
    if (r != PZE_RESULT_SUCCESS || n_drivers == 0) {
        if (r != PZE_RESULT_SUCCESS)
            pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no Level Zero driver (zeInit/zeDriverGet: ze_result_t 0x%x)", (unsigned)r);
        else
            pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no Level Zero driver");
        free(f);
        return PDDE_ERR_UNAVAILABLE;
    }
    pze_driver *drivers = calloc(n_drivers, sizeof *drivers);
    if (!drivers || f->ze.DriverGet(&n_drivers, drivers) != PZE_RESULT_SUCCESS) {
        free(drivers);
        free(f);
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no Level Zero driver (zeDriverGet failed)");
    }
    for (uint32_t di = 0; di < n_drivers; di++) {
        uint32_t nd = 0;
        if (f->ze.DeviceGet(drivers[di], &nd, NULL) != PZE_RESULT_SUCCESS || !nd) continue;
        pze_device *devs = calloc(nd, sizeof *devs);
        pze_dev_info *grown = realloc(f->info, (size_t)(f->n_devices + (int)nd) * sizeof *grown);
        if (!devs || !grown) {
            free(devs);
            if (grown) f->info = grown;
            break;
        }
        f->info = grown;
        if (f->ze.DeviceGet(drivers[di], &nd, devs) == PZE_RESULT_SUCCESS) {
            for (uint32_t k = 0; k < nd; k++) {
                pze_dev_info in;
                memset(&in, 0, sizeof in);
                in.driver = drivers[di];
                in.device = devs[k];
                in.props.stype = PZE_STYPE_DEVICE_PROPERTIES;
                if (f->ze.DeviceGetProperties(devs[k], &in.props) != PZE_RESULT_SUCCESS) continue;
                if (in.props.type != PZE_DEVICE_TYPE_GPU) continue; /* the SPIR-V kernels target GPUs */
                pze_device_compute_properties cp;
                memset(&cp, 0, sizeof cp);
                cp.stype = PZE_STYPE_DEVICE_COMPUTE_PROPERTIES;
                if (f->ze.DeviceGetComputeProperties(devs[k], &cp) == PZE_RESULT_SUCCESS) in.max_group = cp.maxTotalGroupSize;
                uint32_t nm = 0;
                if (f->ze.DeviceGetMemoryProperties(devs[k], &nm, NULL) == PZE_RESULT_SUCCESS && nm) {
                    pze_device_memory_properties *mp = calloc(nm, sizeof *mp);
                    if (mp) {
                        for (uint32_t m = 0; m < nm; m++) mp[m].stype = PZE_STYPE_DEVICE_MEMORY_PROPERTIES;
                        if (f->ze.DeviceGetMemoryProperties(devs[k], &nm, mp) == PZE_RESULT_SUCCESS)
                            for (uint32_t m = 0; m < nm; m++) in.memory += mp[m].totalSize;
                        free(mp);
                    }
                }
                f->info[f->n_devices++] = in;
            }
        }
        free(devs);
    }
    free(drivers);
    if (f->n_devices == 0) {
        free(f->info);
        free(f);
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "no Level Zero driver with a GPU device");
    }
    *family = f;
    *n_devices = f->n_devices;
    return PDDE_OK;
}

static void pze_free(void *family) {
    pze_family *f = family;
    if (!f) return;
    free(f->info);
    free(f);
}

static pdde_status pze_device_props(void *family, int index, pdde_device_props *out) {
    pze_family *f = family;
    if (index < 0 || index >= f->n_devices)
        return pdde_error(f->ctx, PDDE_ERR_INVALID_ARG, "level_zero: no device %d", index);
    const pze_dev_info *in = &f->info[index];
    const pze_device_properties *p = &in->props;
    memset(out, 0, sizeof *out);
    out->kind = PDDE_DEVICE_GPU;
    snprintf(out->name, sizeof out->name, "%.127s", p->name);
    snprintf(out->backend, sizeof out->backend, "level_zero");
    out->memory_total = in->memory;
    /* EUs, as OpenCL reports compute units on Intel GPUs */
    int eus = (int)(p->numSlices * p->numSubslicesPerSlice * p->numEUsPerSubslice);
    out->compute_units = eus;
    /* each EU lane does one FMA (2 FLOP) a clock; coreClockRate is in MHz */
    out->peak_flops_f32 = 2.0 * eus * (double)p->physicalEUSimdWidth * (double)p->coreClockRate * 1e6;
    return PDDE_OK;
}

/* --------------------------------------------------------------------------------------------------
 * Devices, streams, buffers, events */

/* (an event's slot in the device's pool is claimed and given back under launch_lock: sessions on host threads
 * of their own make and drop events on one device at once) */
static void pze_event_slot_free(pze_dev *d, int index) {
    pthread_mutex_lock(&d->launch_lock);
    d->used[index] = 0;
    pthread_mutex_unlock(&d->launch_lock);
}

static int pze_event_new(pze_dev *d, pze_event *out, int *index) {
    int i = 0;
    pthread_mutex_lock(&d->launch_lock);
    while (i < PZE_MAX_EVENTS && d->used[i]) i++;
    if (i < PZE_MAX_EVENTS) d->used[i] = 1;
    pthread_mutex_unlock(&d->launch_lock);
    if (i == PZE_MAX_EVENTS) return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "level_zero: more than %d events", PZE_MAX_EVENTS);
    pze_event_desc ed = {PZE_STYPE_EVENT_DESC, NULL, (uint32_t)i, PZE_EVENT_SCOPE_FLAG_HOST, PZE_EVENT_SCOPE_FLAG_HOST};
    pze_result r = d->fam->ze.EventCreate(d->pool, &ed, out);
    if (r != PZE_RESULT_SUCCESS) {
        pze_event_slot_free(d, i);
        return pze_fail(d->fam, r, "zeEventCreate", 0);
    }
    *index = i;
    return PDDE_OK;
}

static void pze_event_delete(pze_dev *d, pze_event ev, int index) {
    if (!ev) return;
    d->fam->ze.EventDestroy(ev);
    if (index >= 0 && index < PZE_MAX_EVENTS) pze_event_slot_free(d, index);
}

static int pze_stream_new(pze_dev *d, pze_stream **out) {
    pze_stream *s = calloc(1, sizeof *s);
    if (!s) return pdde_error(d->fam->ctx, PDDE_ERR_OOM, "level_zero: out of host memory");
    pze_command_queue_desc qd = {PZE_STYPE_COMMAND_QUEUE_DESC, NULL, d->ordinal, 0, 0, PZE_QUEUE_MODE_ASYNCHRONOUS, 0};
    pze_result r = d->fam->ze.CommandListCreateImmediate(d->context, d->info->device, &qd, &s->list);
    if (r != PZE_RESULT_SUCCESS) {
        free(s);
        return pze_fail(d->fam, r, "zeCommandListCreateImmediate", 0);
    }
    int e = pze_event_new(d, &s->done, &s->done_index);
    if (e) {
        d->fam->ze.CommandListDestroy(s->list);
        free(s);
        return e;
    }
    *out = s;
    return PDDE_OK;
}

/* Waits for everything appended to s, then delivers pending reads and frees staging buffers. */
static int pze_drain(pze_dev *d, pze_stream *s) {
    const pze_api *ze = &d->fam->ze;
    PZE_CHECK(d, ze->CommandListAppendBarrier(s->list, s->done, 0, NULL), "zeCommandListAppendBarrier");
    PZE_CHECK(d, ze->EventHostSynchronize(s->done, PZE_SYNC_TIMEOUT_NS), "zeEventHostSynchronize");
    PZE_CHECK(d, ze->EventHostReset(s->done), "zeEventHostReset");
    for (int i = 0; i < s->n_pend; i++) {
        if (s->pend[i].dst) memcpy(s->pend[i].dst, s->pend[i].host, s->pend[i].n);
        ze->MemFree(d->context, s->pend[i].host);
    }
    s->n_pend = 0;
    return PDDE_OK;
}

static void pze_stream_delete(pze_dev *d, pze_stream *s) {
    if (!s) return;
    pze_drain(d, s);
    if (s->scratch) d->fam->ze.MemFree(d->context, s->scratch);
    pze_event_delete(d, s->done, s->done_index);
    d->fam->ze.CommandListDestroy(s->list);
    free(s->pend);
    free(s);
}

static void pze_device_close(void *dev);

static int pze_build_module(pze_dev *d) {
    const pze_api *ze = &d->fam->ze;
    pze_module_desc md = {PZE_STYPE_MODULE_DESC, NULL, PZE_MODULE_FORMAT_IL_SPIRV, sizeof pdde_gpu_kernels_spv,
                          pdde_gpu_kernels_spv, "", NULL};
    pze_build_log log = NULL;
    pze_result r = ze->ModuleCreate(d->context, d->info->device, &md, &d->module, &log);
    if (r != PZE_RESULT_SUCCESS) {
        char msg[2048] = "";
        size_t n = sizeof msg;
        if (log && ze->ModuleBuildLogGetString(log, &n, msg) != PZE_RESULT_SUCCESS) msg[0] = 0;
        msg[sizeof msg - 1] = 0;
        if (log) ze->ModuleBuildLogDestroy(log);
        d->module = NULL;
        return pdde_error(d->fam->ctx, PDDE_ERR_BUILD, "level_zero: building the kernels failed (0x%x): %s", (unsigned)r, msg);
    }
    if (log) ze->ModuleBuildLogDestroy(log);
    for (int k = 0; k < PGD_K_COUNT; k++) {
        pze_kernel_desc kd = {PZE_STYPE_KERNEL_DESC, NULL, 0, pgd_kernel_names[k]};
        r = ze->KernelCreate(d->module, &kd, &d->kern[k]);
        if (r != PZE_RESULT_SUCCESS)
            return pdde_error(d->fam->ctx, PDDE_ERR_BUILD, "level_zero: kernel %s: zeKernelCreate failed (0x%x)",
                              pgd_kernel_names[k], (unsigned)r);
    }
    return PDDE_OK;
}

static pdde_status pze_device_open(void *family, int index, void **out) {
    pze_family *f = family;
    *out = NULL;
    if (index < 0 || index >= f->n_devices)
        return pdde_error(f->ctx, PDDE_ERR_INVALID_ARG, "level_zero: no device %d", index);
    pze_dev *d = calloc(1, sizeof *d);
    if (!d) return pdde_error(f->ctx, PDDE_ERR_OOM, "level_zero: out of host memory");
    d->fam = f;
    pthread_mutex_init(&d->launch_lock, NULL);
    d->info = &f->info[index];
    const pze_device_properties *p = &d->info->props;
    d->units = p->numSlices * p->numSubslicesPerSlice * p->numEUsPerSubslice;
    if (!d->units) d->units = 1;
    d->max_block = 256;
    while (d->max_block * 2 <= 1024 && d->max_block * 2 <= d->info->max_group) d->max_block *= 2;
    int e = PDDE_OK;
    if (d->info->max_group && d->info->max_group < 256)
        e = pdde_error(f->ctx, PDDE_ERR_UNSUPPORTED, "level_zero: %s allows work-groups of %u items; the kernels need 256",
                       p->name, d->info->max_group);
    /* a compute queue group */
    uint32_t ng = 0;
    if (!e && f->ze.DeviceGetCommandQueueGroupProperties(d->info->device, &ng, NULL) == PZE_RESULT_SUCCESS && ng) {
        pze_queue_group_properties *gp = calloc(ng, sizeof *gp);
        if (gp) {
            for (uint32_t i = 0; i < ng; i++) gp[i].stype = PZE_STYPE_COMMAND_QUEUE_GROUP_PROPERTIES;
            if (f->ze.DeviceGetCommandQueueGroupProperties(d->info->device, &ng, gp) == PZE_RESULT_SUCCESS)
                for (uint32_t i = 0; i < ng; i++)
                    if (gp[i].flags & PZE_QUEUE_GROUP_FLAG_COMPUTE) {
                        d->ordinal = i;
                        break;
                    }
            free(gp);
        }
    }
    if (!e) {
        pze_context_desc cd = {PZE_STYPE_CONTEXT_DESC, NULL, 0};
        pze_result r = f->ze.ContextCreate(d->info->driver, &cd, &d->context);
        if (r != PZE_RESULT_SUCCESS) {
            d->context = NULL;
            e = pze_fail(f, r, "zeContextCreate", 0);
        }
    }
    if (!e) {
        pze_event_pool_desc pd = {PZE_STYPE_EVENT_POOL_DESC, NULL, PZE_EVENT_POOL_FLAG_HOST_VISIBLE, PZE_MAX_EVENTS};
        pze_device dv = d->info->device;
        pze_result r = f->ze.EventPoolCreate(d->context, &pd, 1, &dv, &d->pool);
        if (r != PZE_RESULT_SUCCESS) {
            d->pool = NULL;
            e = pze_fail(f, r, "zeEventPoolCreate", 0);
        }
    }
    if (!e) e = pze_build_module(d);
    if (!e) e = pze_stream_new(d, &d->default_stream);
    if (e) {
        pze_device_close(d);
        return e;
    }
    *out = d;
    return PDDE_OK;
}

static void pze_device_close(void *dev) {
    pze_dev *d = dev;
    if (!d) return;
    const pze_api *ze = &d->fam->ze;
    pze_stream_delete(d, d->default_stream);
    for (int k = 0; k < PGD_K_COUNT; k++)
        if (d->kern[k]) ze->KernelDestroy(d->kern[k]);
    if (d->module) ze->ModuleDestroy(d->module);
    if (d->pool) ze->EventPoolDestroy(d->pool);
    if (d->context) ze->ContextDestroy(d->context);
    pthread_mutex_destroy(&d->launch_lock);
    free(d);
}

static pdde_status pze_buffer_alloc(void *dev, size_t nbytes, void **handle) {
    pze_dev *d = dev;
    *handle = NULL;
    pze_device_mem_alloc_desc ad = {PZE_STYPE_DEVICE_MEM_ALLOC_DESC, NULL, 0, 0};
    size_t n = nbytes ? nbytes : 4;
    if (d->info->props.maxMemAllocSize && n > d->info->props.maxMemAllocSize)
        return pdde_error(d->fam->ctx, PDDE_ERR_DEVICE_OOM,
                          "level_zero: %zu bytes requested; %s allocates at most %llu bytes at once", nbytes,
                          d->info->props.name, (unsigned long long)d->info->props.maxMemAllocSize);
    pze_result r = d->fam->ze.MemAllocDevice(d->context, &ad, n, 64, d->info->device, handle);
    if (r != PZE_RESULT_SUCCESS) {
        *handle = NULL;
        return pze_fail(d->fam, r, "zeMemAllocDevice", nbytes);
    }
    return PDDE_OK;
}

static void pze_buffer_free(void *dev, void *handle) {
    pze_dev *d = dev;
    if (handle) d->fam->ze.MemFree(d->context, handle);
}

static pze_stream *pze_st(pze_dev *d, void *stream) { return stream ? (pze_stream *)stream : d->default_stream; }

/* Appends a barrier: commands of a Level Zero command list may otherwise overlap. */
static int pze_order(pze_dev *d, pze_stream *s) {
    PZE_CHECK(d, d->fam->ze.CommandListAppendBarrier(s->list, NULL, 0, NULL), "zeCommandListAppendBarrier");
    return PDDE_OK;
}

static int pze_stage(pze_dev *d, pze_stream *s, size_t n, void *dst, void **host) {
    if (s->n_pend == s->cap_pend) {
        int cap = s->cap_pend ? s->cap_pend * 2 : 16;
        pze_pending *p = realloc(s->pend, (size_t)cap * sizeof *p);
        if (!p) return pdde_error(d->fam->ctx, PDDE_ERR_OOM, "level_zero: out of host memory");
        s->pend = p;
        s->cap_pend = cap;
    }
    pze_host_mem_alloc_desc hd = {PZE_STYPE_HOST_MEM_ALLOC_DESC, NULL, 0};
    pze_result r = d->fam->ze.MemAllocHost(d->context, &hd, n, 64, host);
    if (r != PZE_RESULT_SUCCESS) return pze_fail(d->fam, r, "zeMemAllocHost", n);
    s->pend[s->n_pend++] = (pze_pending){*host, dst, n};
    return PDDE_OK;
}

static pdde_status pze_write(void *dev, void *stream, void *handle, size_t offset, const void *src, size_t n) {
    pze_dev *d = dev;
    pze_stream *s = pze_st(d, stream);
    if (!n) return PDDE_OK;
    void *host = NULL;
    int e = pze_stage(d, s, n, NULL, &host);
    if (e) return e;
    memcpy(host, src, n);
    PZE_CHECK(d, d->fam->ze.CommandListAppendMemoryCopy(s->list, (char *)handle + offset, host, n, NULL, 0, NULL),
              "zeCommandListAppendMemoryCopy");
    return pze_order(d, s);
}

static pdde_status pze_read(void *dev, void *stream, void *handle, size_t offset, void *dst, size_t n) {
    pze_dev *d = dev;
    pze_stream *s = pze_st(d, stream);
    if (!n) return PDDE_OK;
    void *host = NULL;
    int e = pze_stage(d, s, n, dst, &host);
    if (e) return e;
    PZE_CHECK(d, d->fam->ze.CommandListAppendMemoryCopy(s->list, host, (char *)handle + offset, n, NULL, 0, NULL),
              "zeCommandListAppendMemoryCopy");
    return pze_order(d, s);
}

static pdde_status pze_stream_create(void *dev, void **stream) {
    pze_stream *s = NULL;
    *stream = NULL;
    int e = pze_stream_new(dev, &s);
    if (e) return e;
    *stream = s;
    return PDDE_OK;
}

static void pze_stream_free(void *dev, void *stream) {
    if (stream) pze_stream_delete(dev, stream);
}

static pdde_status pze_stream_sync(void *dev, void *stream) {
    pze_dev *d = dev;
    return pze_drain(d, pze_st(d, stream));
}

static pdde_status pze_event_create(void *dev, void **event) {
    pze_dev *d = dev;
    *event = NULL;
    pze_ev *ev = calloc(1, sizeof *ev);
    if (!ev) return pdde_error(d->fam->ctx, PDDE_ERR_OOM, "level_zero: out of host memory");
    int e = pze_event_new(d, &ev->ev, &ev->index);
    if (e) {
        free(ev);
        return e;
    }
    *event = ev;
    return PDDE_OK;
}

static void pze_event_free(void *dev, void *event) {
    pze_ev *ev = event;
    if (!ev) return;
    pze_event_delete(dev, ev->ev, ev->index);
    free(ev);
}

static pdde_status pze_event_record(void *dev, void *event, void *stream) {
    pze_dev *d = dev;
    pze_ev *ev = event;
    PZE_CHECK(d, d->fam->ze.EventHostReset(ev->ev), "zeEventHostReset");
    PZE_CHECK(d, d->fam->ze.CommandListAppendBarrier(pze_st(d, stream)->list, ev->ev, 0, NULL),
              "zeCommandListAppendBarrier");
    return PDDE_OK;
}

static pdde_status pze_event_sync(void *dev, void *event) {
    pze_dev *d = dev;
    PZE_CHECK(d, d->fam->ze.EventHostSynchronize(((pze_ev *)event)->ev, PZE_SYNC_TIMEOUT_NS), "zeEventHostSynchronize");
    return PDDE_OK;
}

static pdde_status pze_stream_wait_event(void *dev, void *stream, void *event) {
    pze_dev *d = dev;
    pze_event ev = ((pze_ev *)event)->ev;
    PZE_CHECK(d, d->fam->ze.CommandListAppendWaitOnEvents(pze_st(d, stream)->list, 1, &ev),
              "zeCommandListAppendWaitOnEvents");
    return PDDE_OK;
}

/* --------------------------------------------------------------------------------------------------
 * Ops (backends/gpu_dispatch.h) */

/* (the caller holds d's launch_lock: sessions on host threads of their own launch on one device at once) */
static int pze_launch_locked(pze_dev *d, pze_stream *s, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, int nargs,
                             const pgd_arg *args) {
    const pze_api *ze = &d->fam->ze;
    pze_kernel kern = d->kern[k];
    PZE_CHECK(d, ze->KernelSetGroupSize(kern, bx, by, 1), "zeKernelSetGroupSize");
    for (int i = 0; i < nargs; i++) {
        /* a device address is one pointer; a null one is passed as a null argument value, as the
         * specification asks */
        void *ptr = args[i].is_ptr ? (void *)(uintptr_t)pgd_addr(*(const pgd_ptr *)args[i].p) : NULL;
        pze_result r = args[i].is_ptr ? ze->KernelSetArgumentValue(kern, (uint32_t)i, sizeof ptr, ptr ? &ptr : NULL)
                                      : ze->KernelSetArgumentValue(kern, (uint32_t)i, args[i].size, args[i].p);
        if (r != PZE_RESULT_SUCCESS)
            return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "level_zero: %s argument %d: zeKernelSetArgumentValue failed (0x%x)",
                              pgd_kernel_names[k], i, (unsigned)r);
    }
    pze_group_count gc = {gx, gy, gz};
    pze_result r = ze->CommandListAppendLaunchKernel(s->list, kern, &gc, NULL, 0, NULL);
    if (r != PZE_RESULT_SUCCESS)
        return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "level_zero: launching %s failed (0x%x)", pgd_kernel_names[k],
                          (unsigned)r);
    return PDDE_OK;
}

static int pze_cb_launch(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, int nargs, const pgd_arg *args) {
    pze_dev *d = impl;
    pthread_mutex_lock(&d->launch_lock);
    int e = pze_launch_locked(d, stream, k, gx, gy, gz, bx, by, nargs, args);
    pthread_mutex_unlock(&d->launch_lock);
    return e ? e : pze_order(d, stream);
}

static int pze_cb_scratch(void *impl, void *stream, size_t nbytes, pgd_ptr *out) {
    pze_dev *d = impl;
    pze_stream *s = stream;
    if (s->scratch_bytes < nbytes) {
        size_t want = nbytes < 65536 ? 65536 : nbytes;
        if (s->scratch) {
            int e = pze_drain(d, s);
            if (e) return e;
            d->fam->ze.MemFree(d->context, s->scratch);
            s->scratch = NULL;
            s->scratch_bytes = 0;
        }
        int e = pze_buffer_alloc(d, want, &s->scratch);
        if (e) return e;
        s->scratch_bytes = want;
    }
    *out = (pgd_ptr){(uintptr_t)s->scratch, 0};
    return PDDE_OK;
}

static int pze_cb_fill32(void *impl, void *stream, pgd_ptr dst, uint32_t value, size_t count) {
    pze_dev *d = impl;
    pze_stream *s = stream;
    if (!count) return PDDE_OK;
    PZE_CHECK(d, d->fam->ze.CommandListAppendMemoryFill(s->list, (void *)(uintptr_t)pgd_addr(dst), &value, sizeof value,
                                                         count * sizeof value, NULL, 0, NULL),
              "zeCommandListAppendMemoryFill");
    return pze_order(d, s);
}

static int pze_cb_copy(void *impl, void *stream, pgd_ptr dst, pgd_ptr src, size_t nbytes) {
    pze_dev *d = impl;
    pze_stream *s = stream;
    PZE_CHECK(d, d->fam->ze.CommandListAppendMemoryCopy(s->list, (void *)(uintptr_t)pgd_addr(dst),
                                                         (const void *)(uintptr_t)pgd_addr(src), nbytes, NULL, 0, NULL),
              "zeCommandListAppendMemoryCopy");
    return pze_order(d, s);
}

static int pze_supports_op(void *dev, const pdde_tensor *node) {
    (void)dev;
    return pgd_supports_op(node);
}

/* The dispatcher's view of device d and stream. */
static pgd_ctx pze_dispatcher(pze_dev *d, void *stream) {
    return (pgd_ctx){
        .ctx = d->fam->ctx, .name = "level_zero", .impl = d, .stream = pze_st(d, stream),
        .units = d->units, .max_block = d->max_block,
        .launch = pze_cb_launch, .scratch = pze_cb_scratch, .fill32 = pze_cb_fill32, .copy = pze_cb_copy,
        .gemm = NULL,
        .attention_default = PGD_ATT_ROWS, .has_flash = PGD_FLASH_BF16 | PGD_FLASH_F32, .flash_rows = 64, .flash_threads = 64,
        .embedding_back = PGD_EMB_SORTED, /* (gpu_kernels.cl's, as OpenCL's default) */
    };
}

static pdde_status pze_compute(void *dev, void *stream, pdde_tensor *node) {
    pgd_ctx g = pze_dispatcher(dev, stream);
    return pgd_compute_any(&g, node);
}

static pdde_status pze_compute_group(void *dev, void *stream, pdde_tensor *const *nodes, int n) {
    pgd_ctx g = pze_dispatcher(dev, stream);
    return pgd_compute_group(&g, nodes, n);
}

const pdde_backend_iface pdde_backend_level_zero = {
    .api_version = PDDE_BACKEND_API_VERSION,
    .struct_size = sizeof(pdde_backend_iface),
    .name = "level_zero",
    .init = pze_init,
    .free = pze_free,
    .device_props = pze_device_props,
    .device_open = pze_device_open,
    .device_close = pze_device_close,
    .supports_op = pze_supports_op,
    .buffer_alloc = pze_buffer_alloc,
    .buffer_free = pze_buffer_free,
    .write = pze_write,
    .read = pze_read,
    .stream_create = pze_stream_create,
    .stream_free = pze_stream_free,
    .stream_sync = pze_stream_sync,
    .compute = pze_compute,
    .event_create = pze_event_create,
    .event_free = pze_event_free,
    .event_record = pze_event_record,
    .event_sync = pze_event_sync,
    .stream_wait_event = pze_stream_wait_event,
    .compute_group = pze_compute_group,
};

#endif /* PDDE_NO_LEVEL_ZERO */
