/* backends/cuda.c — the CUDA backend: NVIDIA GPUs through the CUDA driver API, opened at run time.
 *
 * libcuda.so.1 is dlopen'ed and every cu* entry point resolved into a table in the family, so pdde
 * builds without the CUDA toolkit and runs where no driver is installed (the family then reports
 * PDDE_ERR_UNAVAILABLE). Kernels are CUDA C (backends/cuda_kernels.cu) compiled to PTX at build time
 * and embedded (backends/cuda_kernels_ptx.h, committed): for compute_75, and for compute_80 with the
 * tensor-core attention kernels, loaded on devices of compute capability 8.0 and later; the driver JITs
 * the PTX for the device when it is opened. GEMM goes to cuBLAS (dlopen'ed too) and falls back to the tiled kernel k_gemm.
 *
 * Each device uses its primary context (the one the CUDA runtime and cuBLAS use), made current on the
 * calling thread at every entry point. Buffer handles are device pointers (CUdeviceptr) cast to void *.
 * Streams carry a small scratch buffer for multi-pass reductions and their own cublasLt workspace, so
 * concurrent streams never share either.
 *
 * Environment: PDDE_CUDA_NO_CUBLAS=1 uses the built-in GEMM; PDDE_CUDA_TF32=1 lets cuBLAS use TF32;
 * PDDE_CUDA_ATTENTION=unfused|rows|flash|flash2 picks the attention's path (backends/README.md), PDDE_FLASH2_VARIANT=k128|dqsmem|q128[,...]
 * flash2's kernel variants (gpu_dispatch.h);
 * PDDE_CUDA_MOE=1 runs the Mixture-of-Experts ops on the device (else they fall back to the CPU), PDDE_CUDA_ROPE=1 rope (k_rope;
 * likewise, until a GPU has run them);
 * PDDE_CUDA_GRAPH=1 captures a step's work on a stream once and replays it as CUDA graphs while unchanged (below);
 * cublasLt (on where it loads; PDDE_CUDA_LT=0 off) runs matmuls with an epilogue: a folded bias add or cast (PDDE_FUSE_EPILOGUE), the
 * accumulation of a weight gradient (beta 1: PDDE_FUSE_GRAD), bias + GELU and its gradient (PDDE_FUSE_GELU), a
 * weight gradient with its bias gradient (BGRADA: PDDE_FUSE_BGRAD); PDDE_CUDA_LT_TUNE=1 times cublasLt's
 * candidate algorithms for each shape on its first call and keeps the fastest (else the heuristic's first);
 * PDDE_CUDA_LT_LOWP_BIAS=1 runs a bf16 / f16 output with a bias as one cublasLtMatmul, the bias rounded to that dtype first;
 * PDDE_CUDA_LT_REDUCTION=all lets it reduce a bf16 / f16 output's split-K partial sums in that dtype (both off until measured: below); PDDE_CUDA_LT_WORKSPACE=MiB sizes its workspace (each stream's);
 * PDDE_CUDA_GEMMEX_LOWP=1 writes a matmul's bf16 / f16 output from cublasGemmStridedBatchedEx (below);
 * PDDE_CUDA_GEMM_SINGLE=1 runs those of batch 1 through cublasGemmEx instead.
 * PDDE_CUDA_COLSUM2=0 and PDDE_CUDA_ADAMW_CHUNKS=0 leave the column sums and AdamW kernels of cuda_mem.cuh (gpu_dispatch.h);
 * PDDE_CUDA_CE1=1 takes its cross-entropy that stages each row in shared memory (k_ce_staged: a row of up to the
 * device's opt-in shared memory, 227 KiB on sm_90); PDDE_CUDA_ADAMW_VEC=1 its AdamW by k_adamw_vec (and ADAMW_CHUNKS's
 * grouping); PDDE_CUDA_GELU2=1 bias_gelu and its backward by k_bias_gelu2 (the three off until measured).
 * PDDE_CUDA_LN2=1 takes layernorm's warp-per-row kernels of cuda_norm.cuh (forward, dx, dgamma; gpu_dispatch.h; off until measured).
 */
#ifndef PDDE_NO_CUDA

#include "backend_impl.h" /* first: it sets _GNU_SOURCE; the environment readers */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_kernels_ptx.h"
#include "gemm_plan.h"
#include "gpu_graph.h"
#include "gpu_moe.h" /* (and gpu_dispatch.h) */

/* The few driver API types and constants used (cuda.h is not needed to build). */
typedef int pcu_result;
typedef int pcu_device_t;
typedef unsigned long long pcu_ptr;
typedef struct pcu_ctx_st *pcu_ctx;
typedef struct pcu_mod_st *pcu_mod;
typedef struct pcu_fn_st *pcu_fn;
typedef struct pcu_stream_st *pcu_cstream;
typedef struct pcu_event_st *pcu_cevent;
typedef struct pcu_graph_st *pcu_graph;
typedef struct pcu_graph_exec_st *pcu_graph_exec;
typedef struct pcu_graph_node_st *pcu_graph_node;

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
    PCU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    PCU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    PCU_STATIC_SHARED_MAX = 48 * 1024, /* (dynamic shared memory past this needs the attribute above set) */
    PCU_JIT_INFO_LOG_BUFFER = 3,
    PCU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
    PCU_JIT_ERROR_LOG_BUFFER = 5,
    PCU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
    PCU_STREAM_NON_BLOCKING = 1,
    PCU_EVENT_DISABLE_TIMING = 2,
    PCU_STREAM_CAPTURE_MODE_RELAXED = 2, /* (CUstreamCaptureMode: the scratch and cublasLt may allocate while capturing) */
};

/* CUDA graphs (optional: PDDE_CUDA_GRAPH=1), resolved apart so that a driver without them still loads. */
typedef struct {
    int ok;
    pcu_result (*BeginCapture)(pcu_cstream, int);
    pcu_result (*EndCapture)(pcu_cstream, pcu_graph *);
    pcu_result (*Instantiate)(pcu_graph_exec *, pcu_graph, unsigned long long);
    pcu_result (*Launch)(pcu_graph_exec, pcu_cstream);
    pcu_result (*Destroy)(pcu_graph);
    pcu_result (*ExecDestroy)(pcu_graph_exec);
    /* (optional: the per-step arguments of a kept graph's kernels, patched before a replay) */
    pcu_result (*GetCaptureInfo)(pcu_cstream, int *, unsigned long long *, pcu_graph *, const pcu_graph_node **, size_t *);
    pcu_result (*KernelNodeSetParams)(pcu_graph_exec, pcu_graph_node, const void *); /* (CUDA_KERNEL_NODE_PARAMS_v1 *) */
} pcu_graph_api;
/* CUDA_KERNEL_NODE_PARAMS_v1 */
typedef struct {
    pcu_fn func;
    unsigned grid[3], block[3], shared_bytes;
    void **params, **extra;
} pcu_kernel_node_params;

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
    pcu_result (*CtxGetCurrent)(pcu_ctx *);
    pcu_result (*MemGetInfo)(size_t *, size_t *);
    pcu_result (*MemAlloc)(pcu_ptr *, size_t);
    pcu_result (*MemFree)(pcu_ptr);
    pcu_result (*MemHostAlloc)(void **, size_t, unsigned);
    pcu_result (*MemFreeHost)(void *);
    pcu_result (*MemcpyHtoDAsync)(pcu_ptr, const void *, size_t, pcu_cstream);
    pcu_result (*MemcpyDtoHAsync)(void *, pcu_ptr, size_t, pcu_cstream);
    pcu_result (*MemcpyDtoDAsync)(pcu_ptr, pcu_ptr, size_t, pcu_cstream);
    pcu_result (*MemsetD32Async)(pcu_ptr, unsigned, size_t, pcu_cstream);
    pcu_result (*ModuleLoadDataEx)(pcu_mod *, const void *, unsigned, int *, void **);
    pcu_result (*ModuleUnload)(pcu_mod);
    pcu_result (*ModuleGetFunction)(pcu_fn *, pcu_mod, const char *);
    pcu_result (*FuncSetAttribute)(pcu_fn, int, int);
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
    pcu_result (*EventElapsedTime)(float *, pcu_cevent, pcu_cevent);
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
    PCU_SYM(CtxGetCurrent, "cuCtxGetCurrent"),
    PCU_SYM(MemGetInfo, "cuMemGetInfo_v2"),
    PCU_SYM(MemAlloc, "cuMemAlloc_v2"),
    PCU_SYM(MemFree, "cuMemFree_v2"),
    PCU_SYM(MemHostAlloc, "cuMemHostAlloc"),
    PCU_SYM(MemFreeHost, "cuMemFreeHost"),
    PCU_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    PCU_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    PCU_SYM(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    PCU_SYM(MemsetD32Async, "cuMemsetD32Async"),
    PCU_SYM(ModuleLoadDataEx, "cuModuleLoadDataEx"),
    PCU_SYM(ModuleUnload, "cuModuleUnload"),
    PCU_SYM(ModuleGetFunction, "cuModuleGetFunction"),
    PCU_SYM(FuncSetAttribute, "cuFuncSetAttribute"),
    PCU_SYM(LaunchKernel, "cuLaunchKernel"),
    PCU_SYM(StreamCreate, "cuStreamCreate"),
    PCU_SYM(StreamDestroy, "cuStreamDestroy_v2"),
    PCU_SYM(StreamSynchronize, "cuStreamSynchronize"),
    PCU_SYM(StreamWaitEvent, "cuStreamWaitEvent"),
    PCU_SYM(EventCreate, "cuEventCreate"),
    PCU_SYM(EventDestroy, "cuEventDestroy_v2"),
    PCU_SYM(EventRecord, "cuEventRecord"),
    PCU_SYM(EventSynchronize, "cuEventSynchronize"),
    PCU_SYM(EventElapsedTime, "cuEventElapsedTime"),
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
    /* optional (mixed precision: bf16/f16 in, f32 compute and out, on tensor cores) */
    int (*GemmStridedBatchedEx)(pcublas_handle, int, int, int, int, int, const void *, const void *, int, int, long long,
                                const void *, int, int, long long, const void *, void *, int, int, long long, int, int, int);
    /* optional (PDDE_CUDA_GEMM_SINGLE=1: a GEMM of batch 1 through the non-batched entry point) */
    int (*GemmEx)(pcublas_handle, int, int, int, int, int, const void *, const void *, int, int, const void *, int, int, const void *,
                  void *, int, int, int, int);
} pcublas_api;

/* cuBLAS's enum values (library_types.h, cublas_api.h): data types, the compute type, the algorithm */
enum { PCUBLAS_R_32F = 0, PCUBLAS_R_16F = 2, PCUBLAS_R_16BF = 14, PCUBLAS_COMPUTE_32F = 68, PCUBLAS_GEMM_DEFAULT = -1 };

/* cublasLt (optional, PDDE_CUDA_LT=1): GEMMs with a bias epilogue and a bf16 / f16 output (cublasLt.h's
 * types and the entry points used; the descriptors are opaque pointers, the algorithm and heuristic
 * result are laid out as in cublasLt.h). */
typedef struct pclt_handle_st *pclt_handle;
typedef struct pclt_desc_st *pclt_desc;
typedef struct pclt_layout_st *pclt_layout;
typedef struct pclt_pref_st *pclt_pref;
typedef struct { uint64_t data[8]; } pclt_algo;
typedef struct { pclt_algo algo; size_t workspace; int state; float waves; int reserved[4]; } pclt_heuristic;
typedef struct {
    void *lib;
    int (*Create)(pclt_handle *);
    int (*Destroy)(pclt_handle);
    int (*DescCreate)(pclt_desc *, int compute, int scale);
    int (*DescDestroy)(pclt_desc);
    int (*DescSet)(pclt_desc, int attr, const void *buf, size_t n);
    int (*LayoutCreate)(pclt_layout *, int type, uint64_t rows, uint64_t cols, int64_t ld);
    int (*LayoutDestroy)(pclt_layout);
    int (*LayoutSet)(pclt_layout, int attr, const void *buf, size_t n);
    int (*PrefCreate)(pclt_pref *);
    int (*PrefDestroy)(pclt_pref);
    int (*PrefSet)(pclt_pref, int attr, const void *buf, size_t n);
    int (*Heuristic)(pclt_handle, pclt_desc, pclt_layout, pclt_layout, pclt_layout, pclt_layout, pclt_pref, int, pclt_heuristic *, int *);
    int (*Matmul)(pclt_handle, pclt_desc, const void *, const void *, pclt_layout, const void *, pclt_layout, const void *, const void *,
                  pclt_layout, void *, pclt_layout, const pclt_algo *, void *, size_t, pcu_cstream);
} pclt_api;
enum { /* cublasLt.h / cublas_api.h values */
    PCLT_COMPUTE_32F_FAST_TF32 = 77, PCLT_DESC_TRANSA = 3, PCLT_DESC_TRANSB = 4, PCLT_DESC_EPILOGUE = 7, PCLT_DESC_BIAS_POINTER = 8,
    PCLT_DESC_EPILOGUE_AUX_POINTER = 11, PCLT_DESC_EPILOGUE_AUX_LD = 12,
    PCLT_DESC_BIAS_DATA_TYPE = 26, PCLT_EPILOGUE_DEFAULT = 1, PCLT_EPILOGUE_BIAS = 4, PCLT_LAYOUT_BATCH_COUNT = 5,
    PCLT_EPILOGUE_GELU_AUX_BIAS = 164, PCLT_EPILOGUE_DGELU = 192, PCLT_EPILOGUE_BGRADA = 256, /* (cublasLtEpilogue_t) */
    PCLT_LAYOUT_STRIDED_BATCH_OFFSET = 6, PCLT_PREF_MAX_WORKSPACE_BYTES = 1, PCLT_PREF_MIN_ALIGNMENT_A = 5,
    PCLT_PREF_MIN_ALIGNMENT_B = 6, PCLT_PREF_MIN_ALIGNMENT_C = 7, PCLT_PREF_MIN_ALIGNMENT_D = 8, PCLT_PREF_REDUCTION_SCHEME_MASK = 3,
    PCLT_REDUCTION_COMPUTE_TYPE = 2, PCLT_REDUCTION_ALL = 7, /* (cublasLtReductionScheme_t: NONE 0 is always allowed) */
};
#define PCLT_WORKSPACE ((size_t)32 << 20) /* what cuBLAS itself sets aside on Hopper (PDDE_CUDA_LT_WORKSPACE=MiB: another size) */
#define PCLT_CANDIDATES 8                  /* algorithms PDDE_CUDA_LT_TUNE=1 asks the heuristic for and times */
/* One GEMM shape's descriptors and algorithm, made on its first call and kept; ok 0: cublasLt has no
 * algorithm for it (or failed on it) and the generic path runs it. */
typedef struct {
    pclt_desc desc;
    pclt_layout la, lb, lc;
    pclt_algo algo;
    size_t workspace;
    int ok;
    int n_cand, tuned; /* (PDDE_CUDA_LT_TUNE: the heuristic's candidates, timed on the first call) */
    int heuristic_status; /* what cublasLtMatmulAlgoGetHeuristic returned (or an earlier call's failure): the note of a plan without one */
    pclt_algo cand[PCLT_CANDIDATES];
    size_t cand_ws[PCLT_CANDIDATES];
} pclt_plan;

typedef struct {
    char name[128];
    uint64_t memory;
    int sm_count, cc_major, cc_minor, clock_khz, mem_clock_khz, bus_bits;
    int shared_optin; /* the most shared memory a block may take, static and dynamic (0: not known) */
} pcu_dev_info;

typedef struct {
    pdde_context *ctx;
    void *lib;
    pcu_api cu;
    pcublas_api blas; /* blas.lib NULL: no cuBLAS */
    pclt_api lt;      /* lt.lib NULL: no cublasLt, or PDDE_CUDA_LT=0 */
    pcu_graph_api graph;
    int driver_version;
    int n_devices;
    pcu_dev_info *info;
} pcu_family;

/* PDDE_CUDA_GRAPH: a kernel node of a kept graph whose arguments change each step (kernel k) */
typedef struct { int k; pcu_graph_node node; } pcu_patch;
/* A kept graph: its executable, the captured graph (its nodes are the patches' handles), the patches in order */
typedef struct {
    pcu_graph_exec exec;
    pcu_graph graph;
    pcu_patch *patch;
    int n_patch, cap_patch;
} pcu_piece;
/* An operation on a stream: a node, a group of nodes (compute_group), a device copy */
enum { PCU_OP_NODE, PCU_OP_GROUP, PCU_OP_COPY };
typedef struct { int32_t ip[8]; float fp[8]; } pcu_params;
typedef struct {
    int kind, n;
    uint64_t key;
    pdde_tensor *node;
    pdde_tensor **nodes; /* (GROUP; kept: the stream's own copy of the array) */
    pcu_params *params;  /* (kept: its nodes' op parameters when it came: the executor sets the next micro-batch's on them) */
    int cap;             /* (kept: the capacity of nodes and params, reused) */
    pcu_ptr dst, src;
    size_t nbytes;
} pcu_op;

typedef struct {
    pcu_cstream s;
    pcu_ptr scratch;
    size_t scratch_bytes;
    /* cublasLt's workspace for the GEMMs on this stream (pclt_workspace): made on the first, freed with the stream;
     * every stream has its own, as its scratch, so that GEMMs on two streams never write one workspace at once */
    pcu_ptr lt_workspace;
    size_t lt_workspace_bytes; /* (0: none, lt_workspace_want 0 or its allocation failed: algorithms without one) */
    int lt_workspace_tried;
    /* PDDE_CUDA_GRAPH (gpu_graph.h): the decisions, a kept graph per slot, the operations a replay deferred */
    pgd_graph_tracker gt;
    pcu_piece piece[PGD_GRAPH_SLOTS];
    pcu_op *def;
    int n_def, cap_def;
    int rec_patch;    /* CAPTURE: the launches record their kernel nodes (a per-step operation) */
    int patching;     /* REPLAY: the launches set the kept graph's kernel arguments instead of launching */
    int patch_pos;    /* the next patch of the open replay */
    int patch_failed; /* a launch could not be recorded or patched: the graph is not used again */
    int torn;         /* CAPTURE: closed inside an operation (a scratch grew): the graph holds part of it */
    /* the dispatcher's switches (pcu_switches_read), read once when a session's stream is made (fixed), so that no
     * operation reads the environment; the default stream reads them at each operation */
    int fixed;
    unsigned mem_kernels; /* PGD_MEM_* (PDDE_CUDA_COLSUM2, PDDE_CUDA_ADAMW_CHUNKS, PDDE_CUDA_CE1, PDDE_CUDA_ADAMW_VEC, PDDE_CUDA_GELU2, PDDE_CUDA_LN2) */
    int gemmex_lowp;      /* PDDE_CUDA_GEMMEX_LOWP=1 */
    int lt_lowp_bias;     /* PDDE_CUDA_LT_LOWP_BIAS=1 (pclt_cb_gemm_epi) */
    int gemm_single;      /* PDDE_CUDA_GEMM_SINGLE=1 */
    int embedding_back;   /* PGD_EMB_* (PDDE_CUDA_EMBEDDING_BACK=sorted; atomic until a GPU run measures sorted) */
    int embedding_sort;   /* PGD_EMB_SORT_* (PDDE_CUDA_EMBEDDING_SORT=network|radix; by the ids' count by default) */
    unsigned flash2_variant; /* PGD_FLASH2_* (PDDE_FLASH2_VARIANT=k128|dqsmem|q128[,...]; none by default until measured) */
} pcu_stream;

typedef struct {
    pcu_family *fam;
    int index;
    pcu_device_t cu_dev;
    pcu_ctx cu_ctx;
    pcu_mod mod;
    pcu_fn fn[PGD_K_CUDA_COUNT];
    atomic_int fn_shared[PGD_K_CUDA_COUNT]; /* the dynamic shared memory each kernel was allowed (the attribute; 0: the default 48 KiB) */
    pcublas_handle blas;
    pcu_cstream blas_stream; /* the stream last given to cublasSetStream (NULL: none yet) */
    pthread_mutex_t gemm_lock; /* held by a GEMM call: cuBLAS's handle and cublasLt's plans are the device's (pcu_gemm_locked) */
    pcu_stream *default_stream;
    int sm_count;
    int has_flash; /* the module is the sm_80 one, with the tensor-core attention kernels */
    pclt_handle lt; /* cublasLt (NULL: none) and its plans (each stream has its own workspace: pcu_stream) */
    pclt_plan *lt_plans; /* [PGD_GEMM_PLANS], slots of lt_cache (backends/gemm_plan.h) */
    pgd_gemm_cache *lt_cache;
    long long lt_calls;
    int lt_reduction_all; /* PDDE_CUDA_LT_REDUCTION=all: split-K reductions in the output's dtype allowed (read at open) */
    size_t lt_workspace_want; /* each stream's: PCLT_WORKSPACE, or PDDE_CUDA_LT_WORKSPACE MiB (read at open; 0: none) */
    int graph_on; /* PDDE_CUDA_GRAPH=1 and the driver has graphs (0 again once refused) */
    int zero_on;  /* PDDE_CUDA_ZERO=1: the zero slot memsets on the device (else the core writes zeros) */
    long long graph_replays, graph_captures, graph_discards, graph_fallbacks, graph_patches;
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

/* Makes d's context current on this thread where it is not already (the thread's current context is
 * read each time, not remembered: the program or a library may have set another in between). */
static int pcu_bind(pcu_dev *d) {
    pcu_ctx cur = NULL;
    if (d->fam->cu.CtxGetCurrent(&cur) == PCU_SUCCESS && cur == d->cu_ctx) return PDDE_OK;
    pcu_result r = d->fam->cu.CtxSetCurrent(d->cu_ctx);
    return r == PCU_SUCCESS ? PDDE_OK : pcu_fail(d->fam, r, "cuCtxSetCurrent", 0);
}

/* --------------------------------------------------------------------------------------------------
 * CUDA graphs (PDDE_CUDA_GRAPH=1; off by default until a GPU run has measured it). What the executor
 * enqueues on a stream between host-visible operations (a read or write, an event, a synchronisation, the
 * native stream handed out, a scratch that must grow) is a segment; gpu_graph.h decides, from the keys of
 * its operations, whether it runs plain, is captured (relaxed mode) or is replayed from the graph kept for
 * it, and when a replay must fall back. A replay defers the operations while their keys match and launches
 * the kept graph at the segment's end: no dispatch, no capture, one launch. The kernel arguments that change
 * each step (learning rate, step and AdamW's bias corrections, gradient scale, dropout counter: the per-step
 * op parameters) are patched into the kept graph as the operation arrives: its dispatch runs with the launches
 * turned into cuGraphExecKernelNodeSetParams on the kernel nodes recorded when it was captured
 * (cuStreamGetCaptureInfo_v2 after each launch). A driver without graphs, or a capture that does not begin,
 * is said once on stderr and the steps run without; a capture that fails at its end runs its operations as
 * without graphs (they are kept, with their op parameters, until it ends); a segment whose per-step kernels
 * cannot be patched is not kept. */

static void pcu_graph_refuse(pcu_dev *d, const char *why, pcu_result r) {
    static atomic_int said;
    const char *name = NULL;
    if (d->fam->cu.GetErrorName) d->fam->cu.GetErrorName(r, &name);
    d->graph_on = 0;
    if (!atomic_exchange(&said, 1))
        pdde_log(PDDE_LOG_WARN, "pdde: cuda: PDDE_CUDA_GRAPH=1 but %s%s%s%s: steps run without graph capture\n", why, r ? " (" : "",
                r ? (name ? name : "?") : "", r ? ")" : "");
}

static void pcu_piece_drop(pcu_dev *d, pcu_piece *p) {
    if (p->exec) d->fam->graph.ExecDestroy(p->exec); /* (a launch in flight completes first: the driver frees it then) */
    if (p->graph) d->fam->graph.Destroy(p->graph);
    p->exec = NULL, p->graph = NULL, p->n_patch = 0;
}

static void pcu_graph_free(pcu_dev *d, pcu_stream *s) {
    if (s->gt.mode == PGD_GRAPH_CAPTURE) {
        pcu_graph gr = NULL;
        if (d->fam->graph.EndCapture(s->s, &gr) == PCU_SUCCESS && gr) d->fam->graph.Destroy(gr);
    }
    for (int i = 0; i < PGD_GRAPH_SLOTS; i++) pcu_piece_drop(d, &s->piece[i]), free(s->piece[i].patch);
    for (int i = 0; i < s->cap_def; i++) free(s->def[i].nodes), free(s->def[i].params);
    free(s->def);
    pgd_graph_tracker_free(&s->gt);
}

static int pcu_graph_flush(pcu_dev *d, pcu_stream *s);

/* --------------------------------------------------------------------------------------------------
 * Family */

static void pcu_load_cublas(pcu_family *f) {
    static const char *const names[] = {
        "libcublas.so.13", "libcublas.so.12", "libcublas.so",
        "/usr/local/cuda/lib64/libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.12",
        "/usr/local/cuda/lib64/libcublas.so",
    };
    if (pdde_env_bool("PDDE_CUDA_NO_CUBLAS", 0)) return;
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
    *(void **)&b.GemmStridedBatchedEx = dlsym(lib, "cublasGemmStridedBatchedEx");
    *(void **)&b.GemmEx = dlsym(lib, "cublasGemmEx");
    if (!b.Create || !b.Destroy || !b.SetStream || !b.SgemmStridedBatched) {
        dlclose(lib);
        return;
    }
    f->blas = b;
}

/* --------------------------------------------------------------------------------------------------
 * cublasLt: matmuls with an epilogue (on by default where libcublasLt loads: a GPU run measured lowering's
 * fused matmuls faster on it; PDDE_CUDA_LT=0 turns it off). A matmul node with a bias source and/or a
 * bf16 / f16 output (lowering's bias fusion) is one cublasLtMatmul: the bias added in f32 in the epilogue
 * (CUBLASLT_EPILOGUE_BIAS), the sum rounded once on the store. cuBLASLt's bias is of D's dtype
 * (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE names another for FP8 and integer kernels only: an f32 bias with a bf16 D
 * has no algorithm, heuristic status 7), and pdde's bias is f32, so by default a bf16 / f16 output with a bias is
 * declined here and pgd_matmul_epi asks again for the f32 sum (D f32 in its scratch, then its cast: the bits of
 * the unfused bias add and cast). PDDE_CUDA_LT_LOWP_BIAS=1 (off until measured) runs it as one cublasLtMatmul with
 * a bias of D's dtype, as torch's F.linear under autocast: the bias rounded to D's dtype first (k_cast into the
 * stream's scratch: pclt_bias_place), then added in f32 in the epilogue, so an element differs from the default's
 * where that rounding moves the sum across a rounding boundary of D (tests/test_backend_ops.c, T_LOWP_BIAS: the
 * error bound); where cublasLt declines that too, the f32 sum and cast as without it (said once a shape). Under a
 * bf16 / f16 D the heuristic is offered no split-K reduction that adds
 * partial sums in D's dtype (INPLACE, OUTPUT_TYPE: the sum would be rounded more than once; PDDE_CUDA_LT_REDUCTION=all
 * offers them, to measure). A shape cublasLt declines takes the generic path (the GEMM, the bias kernel, the
 * cast: pgd_matmul_epi), said on stderr once a shape (pclt_note_none). */

static void pclt_load(pcu_family *f) {
    static const char *const names[] = {
        "libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so",
        "/usr/local/cuda/lib64/libcublasLt.so.13", "/usr/local/cuda/lib64/libcublasLt.so.12",
    };
    int asked = pdde_env_bool("PDDE_CUDA_LT", -1);
    if (asked == 0) return;
    void *lib = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !lib; i++) lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        if (asked == 1) pdde_log(PDDE_LOG_WARN, "pdde: cuda: PDDE_CUDA_LT=1 but no libcublasLt was found: matmul epilogues run as separate kernels\n");
        return;
    }
    pclt_api a = {.lib = lib};
    static const struct { const char *name; size_t off; } syms[] = {
#define PCLT_SYM(field, sym) {sym, offsetof(pclt_api, field)}
        PCLT_SYM(Create, "cublasLtCreate"), PCLT_SYM(Destroy, "cublasLtDestroy"),
        PCLT_SYM(DescCreate, "cublasLtMatmulDescCreate"), PCLT_SYM(DescDestroy, "cublasLtMatmulDescDestroy"),
        PCLT_SYM(DescSet, "cublasLtMatmulDescSetAttribute"), PCLT_SYM(LayoutCreate, "cublasLtMatrixLayoutCreate"),
        PCLT_SYM(LayoutDestroy, "cublasLtMatrixLayoutDestroy"), PCLT_SYM(LayoutSet, "cublasLtMatrixLayoutSetAttribute"),
        PCLT_SYM(PrefCreate, "cublasLtMatmulPreferenceCreate"), PCLT_SYM(PrefDestroy, "cublasLtMatmulPreferenceDestroy"),
        PCLT_SYM(PrefSet, "cublasLtMatmulPreferenceSetAttribute"), PCLT_SYM(Heuristic, "cublasLtMatmulAlgoGetHeuristic"),
        PCLT_SYM(Matmul, "cublasLtMatmul"),
#undef PCLT_SYM
    };
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        void *p = dlsym(lib, syms[i].name);
        if (!p) {
            pdde_log(PDDE_LOG_WARN, "pdde: cuda: libcublasLt lacks %s: matmul epilogues run as separate kernels\n", syms[i].name);
            dlclose(lib);
            return;
        }
        memcpy((char *)&a + syms[i].off, &p, sizeof p);
    }
    f->lt = a;
}

static void pclt_plan_free(const pclt_api *a, pclt_plan *p) {
    if (p->desc) a->DescDestroy(p->desc);
    if (p->la) a->LayoutDestroy(p->la);
    if (p->lb) a->LayoutDestroy(p->lb);
    if (p->lc) a->LayoutDestroy(p->lc);
    memset(p, 0, sizeof *p);
}

static void pclt_device_close(pcu_dev *d) {
    const pclt_api *a = &d->fam->lt;
    if (d->lt_cache && d->lt_cache->replaced)
        pdde_log(PDDE_LOG_INFO, "pdde: cuda: cublasLt: %lld plans made for %lld matmuls, %lld in place of others (more problems than %d)\n",
                d->lt_cache->made, d->lt_calls, d->lt_cache->replaced, PGD_GEMM_PLANS);
    for (int i = 0; d->lt_cache && i < d->lt_cache->n; i++) pclt_plan_free(a, &d->lt_plans[i]);
    free(d->lt_plans), free(d->lt_cache);
    if (d->lt) a->Destroy(d->lt);
    d->lt = NULL, d->lt_plans = NULL, d->lt_cache = NULL;
}

/* the largest power of 2 up to 256 that divides addr (cublasLt picks kernels by the operands' alignment) */
static uint32_t pclt_align(uint64_t addr) { return pgd_gemm_align(addr); }

static int pclt_tune_on(void) {
    return pdde_env_bool("PDDE_CUDA_LT_TUNE", 0);
}

static int pclt_type(pdde_dtype dt) { return dt == PDDE_BF16 ? PCUBLAS_R_16BF : dt == PDDE_F16 ? PCUBLAS_R_16F : PCUBLAS_R_32F; }

/* Makes plan p for the key: descriptors, layouts and the heuristic's first algorithm (p->ok 0: none). */
/* epi: the epilogue (0: a bias one where there is a bias, else none); bias_dt: the bias's (or bias gradient's) dtype;
 * aux: the epilogue's auxiliary matrix (GELU_AUX_BIAS, DGELU: X of D's layout, leading dimension N) */
static void pclt_plan_make(pcu_dev *d, const pcu_stream *s, pclt_plan *p, pdde_dtype dt, pdde_dtype ddt, int ta, int tb, int64_t M, int64_t N, int64_t K,
                           int64_t sA, int64_t sB, int64_t sD, int64_t batch, void *bias, pdde_dtype bias_dt, const uint32_t align[4], uint32_t epi,
                           void *aux) {
    const pclt_api *a = &d->fam->lt;
    int compute = dt == PDDE_F32 && pdde_env_bool("PDDE_CUDA_TF32", 0) ? PCLT_COMPUTE_32F_FAST_TF32 : PCUBLAS_COMPUTE_32F;
    int32_t opa = tb, opb = ta, bias_type = pclt_type(bias_dt); /* (column-major: D^T = op(B)^T op(A)^T, so Lt's A is our B) */
    if (!epi) epi = bias ? PCLT_EPILOGUE_BIAS : PCLT_EPILOGUE_DEFAULT;
    int64_t aux_ld = N;
    uint64_t ws = s->lt_workspace_bytes; /* (a stream with less, none: the call sees the algorithm's need and declines) */
    int st = a->DescCreate(&p->desc, compute, PCUBLAS_R_32F);
    st = st ? st : a->DescSet(p->desc, PCLT_DESC_TRANSA, &opa, sizeof opa);
    st = st ? st : a->DescSet(p->desc, PCLT_DESC_TRANSB, &opb, sizeof opb);
    st = st ? st : a->DescSet(p->desc, PCLT_DESC_EPILOGUE, &epi, sizeof epi);
    if (bias) st = st ? st : a->DescSet(p->desc, PCLT_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
    if (bias) st = st ? st : a->DescSet(p->desc, PCLT_DESC_BIAS_POINTER, &bias, sizeof bias); /* (the heuristic reads its alignment) */
    if (aux) st = st ? st : a->DescSet(p->desc, PCLT_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
    if (aux) st = st ? st : a->DescSet(p->desc, PCLT_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
    st = st ? st : a->LayoutCreate(&p->la, pclt_type(dt), (uint64_t)(tb ? K : N), (uint64_t)(tb ? N : K), tb ? K : N);
    st = st ? st : a->LayoutCreate(&p->lb, pclt_type(dt), (uint64_t)(ta ? M : K), (uint64_t)(ta ? K : M), ta ? M : K);
    st = st ? st : a->LayoutCreate(&p->lc, pclt_type(ddt), (uint64_t)N, (uint64_t)M, N);
    if (batch > 1) {
        int32_t bc = (int32_t)batch;
        pclt_layout l[3] = {p->la, p->lb, p->lc};
        int64_t stride[3] = {sB, sA, sD};
        for (int i = 0; i < 3 && !st; i++) {
            st = a->LayoutSet(l[i], PCLT_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
            st = st ? st : a->LayoutSet(l[i], PCLT_LAYOUT_STRIDED_BATCH_OFFSET, &stride[i], sizeof stride[i]);
        }
    }
    pclt_pref pref = NULL;
    st = st ? st : a->PrefCreate(&pref);
    st = st ? st : a->PrefSet(pref, PCLT_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    static const int which[4] = {PCLT_PREF_MIN_ALIGNMENT_A, PCLT_PREF_MIN_ALIGNMENT_B, PCLT_PREF_MIN_ALIGNMENT_C, PCLT_PREF_MIN_ALIGNMENT_D};
    for (int i = 0; i < 4 && !st; i++) st = a->PrefSet(pref, which[i], &align[i < 3 ? i : 2], sizeof align[0]);
    uint32_t reduction = ddt != PDDE_F32 && !d->lt_reduction_all ? PCLT_REDUCTION_COMPUTE_TYPE : PCLT_REDUCTION_ALL;
    st = st ? st : a->PrefSet(pref, PCLT_PREF_REDUCTION_SCHEME_MASK, &reduction, sizeof reduction);
    pclt_heuristic h[PCLT_CANDIDATES];
    int found = 0;
    memset(h, 0, sizeof h);
    st = st ? st : a->Heuristic(d->lt, p->desc, p->la, p->lb, p->lc, p->lc, pref, pclt_tune_on() ? PCLT_CANDIDATES : 1, h, &found);
    if (pref) a->PrefDestroy(pref);
    p->heuristic_status = st;
    p->n_cand = 0;
    for (int i = 0; !st && i < found && i < PCLT_CANDIDATES; i++)
        if (h[i].state == 0) p->cand[p->n_cand] = h[i].algo, p->cand_ws[p->n_cand++] = h[i].workspace;
    p->ok = p->n_cand > 0;
    p->tuned = p->n_cand < 2; /* (nothing to choose from) */
    if (p->ok) p->algo = p->cand[0], p->workspace = p->cand_ws[0];
}

/* A plan cublasLt has no algorithm for, on stderr once a shape (plans are made once a problem; at most
 * PCLT_NOTES lines a process): the problem, its epilogue, the alignments the heuristic was given (pdde's A and B,
 * D, the bias) and its status, and what runs instead. */
#define PCLT_NOTES 16
static void pclt_note_none(const pclt_plan *p, const char *epilogue, pdde_dtype dt, pdde_dtype ddt, int ta, int tb, int64_t M, int64_t N,
                           int64_t K, int64_t batch, const uint32_t align[4], int has_bias, const char *instead) {
    static atomic_int notes;
    if (atomic_fetch_add(&notes, 1) >= PCLT_NOTES) return;
    pdde_log(PDDE_LOG_WARN, "pdde: cuda: cublasLt has no algorithm for the %lldx%lldx%lld %s -> %s matmul (ta %d tb %d batch %lld, %s epilogue%s; "
                    "aligned A %u B %u D %u bias %u bytes; heuristic status %d): %s\n", (long long)M, (long long)N, (long long)K,
            pdde_dtype_name(dt), pdde_dtype_name(ddt), ta, tb, (long long)batch, epilogue, has_bias ? " with a bias" : "", align[1], align[0],
            align[2], has_bias ? align[3] : 0, p->heuristic_status, instead);
}

/* The operands of one cublasLtMatmul of a plan (the bias and aux pointers are in its descriptor) */
typedef struct { const void *A, *B, *C; void *D; float beta; } pclt_call;

/* (on stream s, with s's own workspace: no other stream's GEMM writes it meanwhile) */
static int pclt_run(pcu_dev *d, pclt_plan *p, const pclt_call *c, const pclt_algo *algo, const pcu_stream *s) {
    const pclt_api *a = &d->fam->lt;
    float one = 1.0f;
    return a->Matmul(d->lt, p->desc, &one, c->A, p->la, c->B, p->lb, &c->beta, c->C, p->lc, c->D, p->lc, algo,
                     s->lt_workspace ? (void *)(uintptr_t)s->lt_workspace : NULL, s->lt_workspace ? s->lt_workspace_bytes : 0, s->s);
}

/* PDDE_CUDA_LT_TUNE=1: on a plan's first call, each candidate the heuristic gave runs once to warm and
 * PCLT_TUNE_RUNS times between events on the call's stream; the fastest becomes the plan's algorithm. The
 * runs write the call's own outputs, which the call then writes again (a call whose output is also its
 * input, beta 1 in place, writes scratch instead: d_bytes of it). Not while a CUDA graph captures the
 * stream (the events would be captured): then the heuristic's first runs, and the next plain call tunes. With
 * the switch, one line a plan on stderr gives the times. */
#define PCLT_TUNE_RUNS 3
static void pclt_tune(pcu_dev *d, pclt_plan *p, pcu_stream *s, pclt_call c, size_t d_bytes, int64_t M, int64_t N, int64_t K, const char *what) {
    if (p->tuned || s->gt.mode == PGD_GRAPH_CAPTURE || s->patching) return;
    p->tuned = 1;
    const pcu_api *cu = &d->fam->cu;
    pcu_ptr scratch = 0;
    if (d_bytes) {
        if (cu->MemAlloc(&scratch, d_bytes) != PCU_SUCCESS) return;
        c.D = (void *)(uintptr_t)scratch;
    }
    pcu_cevent e0 = NULL, e1 = NULL;
    float ms[PCLT_CANDIDATES];
    int best = -1;
    if (cu->EventCreate(&e0, 0) == PCU_SUCCESS && cu->EventCreate(&e1, 0) == PCU_SUCCESS) {
        for (int i = 0; i < p->n_cand; i++) {
            ms[i] = -1.0f;
            if (p->cand_ws[i] > s->lt_workspace_bytes || pclt_run(d, p, &c, &p->cand[i], s) != 0) continue;
            int st = cu->EventRecord(e0, s->s) != PCU_SUCCESS;
            for (int r = 0; r < PCLT_TUNE_RUNS && !st; r++) st = pclt_run(d, p, &c, &p->cand[i], s);
            st = st || cu->EventRecord(e1, s->s) != PCU_SUCCESS || cu->EventSynchronize(e1) != PCU_SUCCESS ||
                 cu->EventElapsedTime(&ms[i], e0, e1) != PCU_SUCCESS;
            if (st) ms[i] = -1.0f;
            else if (best < 0 || ms[i] < ms[best]) best = i;
        }
    }
    if (e0) cu->EventDestroy(e0);
    if (e1) cu->EventDestroy(e1);
    if (scratch) cu->StreamSynchronize(s->s), cu->MemFree(scratch);
    if (best < 0) return;
    p->algo = p->cand[best], p->workspace = p->cand_ws[best];
    pdde_log(PDDE_LOG_INFO, "pdde: cuda: cublasLt %s %lldx%lldx%lld: %d candidates, fastest #%d %.4f ms, first %.4f ms\n", what, (long long)M,
            (long long)N, (long long)K, p->n_cand, best, ms[best] / PCLT_TUNE_RUNS, ms[0] >= 0 ? ms[0] / PCLT_TUNE_RUNS : -1.0f);
}

/* Stream s's cublasLt workspace, allocated on its first cublasLt call (a failed allocation: none for that stream, its
 * GEMMs take algorithms that need none or the generic path; said once a process) */
static void pclt_workspace(pcu_dev *d, pcu_stream *s) {
    if (s->lt_workspace_tried) return;
    s->lt_workspace_tried = 1;
    s->lt_workspace = 0, s->lt_workspace_bytes = 0;
    if (!d->lt_workspace_want) return;
    pcu_result r = d->fam->cu.MemAlloc(&s->lt_workspace, d->lt_workspace_want);
    if (r == PCU_SUCCESS) {
        s->lt_workspace_bytes = d->lt_workspace_want;
        return;
    }
    s->lt_workspace = 0;
    static atomic_int said;
    const char *name = NULL;
    if (d->fam->cu.GetErrorName) d->fam->cu.GetErrorName(r, &name);
    if (!atomic_exchange(&said, 1))
        pdde_log(PDDE_LOG_WARN, "pdde: cuda: cublasLt's workspace of %zu MiB for a stream could not be allocated (%s): that stream's fused matmuls "
                        "take algorithms without one, or separate kernels\n", d->lt_workspace_want >> 20, name ? name : "?");
}

/* The plan of problem q, or a slot for it (*fresh 1: to be made; the plan it replaces freed); NULL on no memory */
static pclt_plan *pclt_plan_get(pcu_dev *d, const pgd_gemm_problem *q, int *fresh) {
    *fresh = 0;
    if (!d->lt_plans && !(d->lt_plans = calloc(PGD_GEMM_PLANS, sizeof *d->lt_plans))) return NULL;
    if (!d->lt_cache && !(d->lt_cache = calloc(1, sizeof *d->lt_cache))) return NULL;
    pgd_gemm_key k = pgd_gemm_key_of(q);
    int replace, i = pgd_gemm_cache_slot(d->lt_cache, &k, fresh, &replace);
    if (replace) pclt_plan_free(&d->fam->lt, &d->lt_plans[i]);
    d->lt_calls++;
    return &d->lt_plans[i];
}

static int pcu_cb_scratch(void *impl, void *stream, size_t nbytes, pgd_ptr *out);
static int pcu_cb_launch(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, int nargs,
                         const pgd_arg *args);

/* PDDE_CUDA_LT_LOWP_BIAS: cublasLt reads a bias of D's dtype, so the f32 bias [n] is rounded to ddt into a copy at the
 * start of stream s's scratch (pclt_bias_place: its address, which the heuristic is given for its alignment, then
 * pclt_bias_round once the plan has an algorithm: k_cast, to nearest even as a cast node rounds). The dispatcher holds
 * none of its scratch when it offers a bf16 / f16 output with a bias (gpu_dispatch.h asks for its own only after a
 * decline), and the copy is dead once the matmul after it on the stream has read it. Both return 0 or the error. */
static int pclt_bias_place(pcu_dev *d, pcu_stream *s, int64_t n, pdde_dtype ddt, pgd_ptr *copy) {
    return pcu_cb_scratch(d, s, (size_t)n * pdde_dtype_size(ddt), copy);
}
static int pclt_bias_round(pcu_dev *d, pcu_stream *s, pgd_ptr bias, pgd_ptr copy, int64_t n, pdde_dtype ddt) {
    int32_t sdt = (int32_t)PDDE_F32, cdt = (int32_t)ddt;
    return pcu_cb_launch(d, s, PGD_K_CAST, (unsigned)((n + 255) / 256), 1, 1, 256, 1,
                         PGD_ARGS(PGD_P(bias), PGD_P(copy), PGD_A(n), PGD_A(sdt), PGD_A(cdt)));
}

static int pclt_cb_gemm_epi(void *impl, void *stream, pdde_dtype dt, pdde_dtype ddt, int ta, int tb, int64_t M, int64_t N, int64_t K,
                            pgd_ptr pa, int64_t sA, pgd_ptr pb, int64_t sB, pgd_ptr pd, int64_t sD, int64_t batch, pgd_ptr bias, pgd_ptr pc,
                            float beta) {
    pcu_dev *d = impl;
    pcu_stream *s = stream;
    const pclt_api *a = &d->fam->lt;
    if (!d->lt || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX || (batch > 1 && (!sA || !sB))) return 1;
    if (beta != 0.0f && ddt != PDDE_F32) return 1;
    int lowp_bias = bias.base && ddt != PDDE_F32; /* (cublasLt's bias is of D's dtype: its rounded copy, else the caller asks again for an f32 D) */
    if (lowp_bias && !s->lt_lowp_bias) return 1;
    pgd_ptr bias_copy = pgd_null;
    int e = lowp_bias ? pclt_bias_place(d, s, N, ddt, &bias_copy) : 0;
    if (e) return e;
    pclt_workspace(d, s);
    uint64_t ab = pgd_addr(pb), aa = pgd_addr(pa), ad = pgd_addr(pd), abias = pgd_addr(lowp_bias ? bias_copy : bias), ac = pc.base ? pgd_addr(pc) : ad;
    uint32_t align[4] = {pclt_align(ab), pclt_align(aa), pclt_align(ad) < pclt_align(ac) ? pclt_align(ad) : pclt_align(ac), abias ? pclt_align(abias) : 256};
    pgd_gemm_problem q = {dt, ddt, ta, tb, M, N, K, sA, sB, sD, batch, 0, abias != 0, beta != 0.0f, 1, aa, ab, ad, pc.base ? ac : 0, abias};
    int fresh;
    pclt_plan *p = pclt_plan_get(d, &q, &fresh);
    if (!p) return 1;
    if (fresh) {
        pclt_plan_make(d, s, p, dt, ddt, ta, tb, M, N, K, sA, sB, sD, batch, (void *)(uintptr_t)abias, lowp_bias ? ddt : PDDE_F32, align, 0, NULL);
        if (!p->ok)
            pclt_note_none(p, abias ? (lowp_bias ? "BIAS (the bias rounded to D's dtype)" : "BIAS") : beta != 0.0f ? "beta 1" : "no", dt, ddt, ta, tb,
                           M, N, K, batch, align, abias != 0, ddt != PDDE_F32 ? "the f32 sum is asked for, then cast" : "its epilogue runs as separate kernels");
    }
    if (!p->ok || p->workspace > s->lt_workspace_bytes) return 1; /* (made on a stream with more workspace than this one) */
    if (lowp_bias && (e = pclt_bias_round(d, s, bias, bias_copy, N, ddt)) != 0) return e;
    if (abias) {
        void *bp = (void *)(uintptr_t)abias;
        if (a->DescSet(p->desc, PCLT_DESC_BIAS_POINTER, &bp, sizeof bp) != 0) return 1;
    }
    pclt_call c = {(const void *)(uintptr_t)ab, (const void *)(uintptr_t)aa, (const void *)(uintptr_t)ac, (void *)(uintptr_t)ad, beta};
    if (!p->tuned) /* (beta 1 with C the output: the candidates write scratch) */
        pclt_tune(d, p, s, c, beta != 0.0f && ac == ad ? (size_t)(sD * (batch - 1) + M * N) * pdde_dtype_size(ddt) : 0, M, N, K,
                  abias ? "bias" : beta != 0.0f ? "beta 1" : pdde_dtype_name(ddt));
    int st = pclt_run(d, p, &c, &p->algo, s);
    if (st != 0) {
        p->ok = 0; /* (the generic path from now on, for this shape) */
        pdde_log(PDDE_LOG_WARN, "pdde: cuda: cublasLtMatmul failed (status %d) on a %lldx%lldx%lld matmul: its epilogue runs as separate kernels\n", st,
                (long long)M, (long long)N, (long long)K);
        return 1;
    }
    return PDDE_OK;
}

/* PDDE_FUSE_BGRAD's matmuls on cublasLt (gpu_dispatch.h's gemm_bgrad): D [M, N] = op(A) B, f32, and BGRADA: the
 * bias gradient [N] (f32) from Lt's A (our B, [K, N]) summed over K, written to bgrad. Where cublasLt has no
 * algorithm for it, or fails, the column sums and the GEMM run apart (said once on stderr). */
static int pclt_cb_gemm_bgrad(void *impl, void *stream, pdde_dtype dt, int ta, int64_t M, int64_t N, int64_t K, pgd_ptr pa, pgd_ptr pb,
                              pgd_ptr pd, pgd_ptr pg) {
    pcu_dev *d = impl;
    if (((pcu_stream *)stream)->patching) return ((pcu_stream *)stream)->patch_failed = 1, PDDE_OK;
    const pclt_api *a = &d->fam->lt;
    if (!d->lt || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX) return 1;
    pcu_stream *s = stream;
    pclt_workspace(d, s);
    uint64_t ab = pgd_addr(pb), aa = pgd_addr(pa), ad = pgd_addr(pd), ag = pgd_addr(pg);
    uint32_t align[4] = {pclt_align(ab), pclt_align(aa), pclt_align(ad), pclt_align(ag)};
    pgd_gemm_problem q = {dt, PDDE_F32, ta, 0, M, N, K, 0, 0, 0, 1, PCLT_EPILOGUE_BGRADA, 1, 0, 3, aa, ab, ad, 0, ag};
    int fresh;
    pclt_plan *p = pclt_plan_get(d, &q, &fresh);
    if (!p) return 1;
    if (fresh) {
        pclt_plan_make(d, s, p, dt, PDDE_F32, ta, 0, M, N, K, 0, 0, 0, 1, (void *)(uintptr_t)ag, PDDE_F32, align, PCLT_EPILOGUE_BGRADA, NULL);
        if (!p->ok) pclt_note_none(p, "BGRADA", dt, PDDE_F32, ta, 0, M, N, K, 1, align, 1, "its bias gradient runs as a separate kernel");
    }
    if (!p->ok || p->workspace > s->lt_workspace_bytes) return 1; /* (made on a stream with more workspace than this one) */
    void *gp = (void *)(uintptr_t)ag;
    if (a->DescSet(p->desc, PCLT_DESC_BIAS_POINTER, &gp, sizeof gp) != 0) return 1;
    pclt_call c = {(const void *)(uintptr_t)ab, (const void *)(uintptr_t)aa, (const void *)(uintptr_t)ad, (void *)(uintptr_t)ad, 0.0f};
    if (!p->tuned) pclt_tune(d, p, s, c, 0, M, N, K, "bgrad");
    int st = pclt_run(d, p, &c, &p->algo, s);
    if (st != 0) {
        p->ok = 0;
        pdde_log(PDDE_LOG_WARN, "pdde: cuda: cublasLtMatmul (BGRADA) failed (status %d) on a %lldx%lldx%lld matmul: its bias gradient runs as a "
                        "separate kernel\n", st, (long long)M, (long long)N, (long long)K);
        return 1;
    }
    return PDDE_OK;
}

/* PDDE_FUSE_GELU's matmuls on cublasLt (gpu_dispatch.h's gemm_act): GELU_AUX_BIAS (D = gelu(X), X = A op(B) +
 * bias kept in aux) and DGELU (D = A op(B) * gelu'(aux)). cublasLt keeps aux in D's dtype, so a node whose X
 * is of another dtype than D, or whose N is not a multiple of 8 (aux's leading dimension), takes the kernels,
 * and so does a GELU_AUX_BIAS with a bf16 / f16 D (its f32 bias: cublasLt's bias is of D's dtype) unless
 * PDDE_CUDA_LT_LOWP_BIAS=1 rounds the bias to D's dtype (as pclt_cb_gemm_epi). Its GELU is
 * the tanh form, as pdde's; DGELU's product is summed in cublasLt's order and its gelu' evaluated its way, so
 * a bf16 D differs from the kernels' where the f32 value lies next to a bf16 rounding boundary. */
static int pclt_cb_gemm_act(void *impl, void *stream, int act, pdde_dtype dt, pdde_dtype ddt, int tb, int64_t M, int64_t N, int64_t K,
                            pgd_ptr pa, pgd_ptr pb, pgd_ptr pd, pgd_ptr bias, pgd_ptr aux, pdde_dtype xdt) {
    pcu_dev *d = impl;
    pcu_stream *s = stream;
    if (s->patching) return s->patch_failed = 1, PDDE_OK;
    const pclt_api *a = &d->fam->lt;
    if (!d->lt || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || xdt != ddt || N % 8) return 1;
    int lowp_bias = bias.base && ddt != PDDE_F32; /* (a bias of D's dtype only, as pclt_cb_gemm_epi: its rounded copy, else the kernels) */
    if ((lowp_bias && !s->lt_lowp_bias) || pclt_align(pgd_addr(aux)) < 16) return 1;
    pgd_ptr bias_copy = pgd_null;
    int e = lowp_bias ? pclt_bias_place(d, s, N, ddt, &bias_copy) : 0;
    if (e) return e;
    pclt_workspace(d, s);
    uint64_t ab = pgd_addr(pb), aa = pgd_addr(pa), ad = pgd_addr(pd), abias = bias.base ? pgd_addr(lowp_bias ? bias_copy : bias) : 0, aaux = pgd_addr(aux);
    uint32_t align[4] = {pclt_align(ab), pclt_align(aa), pclt_align(ad), abias ? pclt_align(abias) : 256};
    uint32_t epi = act == PDDE_MATMUL_GELU ? PCLT_EPILOGUE_GELU_AUX_BIAS : PCLT_EPILOGUE_DGELU;
    pgd_gemm_problem q = {dt, ddt, 0, tb, M, N, K, 0, 0, 0, 1, (int)epi, abias != 0, 0, 2, aa, ab, ad, 0, abias};
    int fresh;
    pclt_plan *p = pclt_plan_get(d, &q, &fresh);
    if (!p) return 1;
    if (fresh) { /* (not tuned: GELU_AUX_BIAS writes aux too) */
        pclt_plan_make(d, s, p, dt, ddt, 0, tb, M, N, K, 0, 0, 0, 1, (void *)(uintptr_t)abias, lowp_bias ? ddt : PDDE_F32, align, epi,
                       (void *)(uintptr_t)aaux);
        if (!p->ok)
            pclt_note_none(p, act != PDDE_MATMUL_GELU ? "DGELU" : lowp_bias ? "GELU_AUX_BIAS (the bias rounded to D's dtype)" : "GELU_AUX_BIAS", dt,
                           ddt, 0, tb, M, N, K, 1, align, abias != 0, "its epilogue runs as separate kernels");
    }
    if (!p->ok || p->workspace > s->lt_workspace_bytes) return 1; /* (made on a stream with more workspace than this one) */
    if (lowp_bias && (e = pclt_bias_round(d, s, bias, bias_copy, N, ddt)) != 0) return e;
    void *bp = (void *)(uintptr_t)abias, *xp = (void *)(uintptr_t)aaux;
    if ((abias && a->DescSet(p->desc, PCLT_DESC_BIAS_POINTER, &bp, sizeof bp) != 0) ||
        a->DescSet(p->desc, PCLT_DESC_EPILOGUE_AUX_POINTER, &xp, sizeof xp) != 0)
        return 1;
    void *dp = (void *)(uintptr_t)ad;
    pclt_call c = {(const void *)(uintptr_t)ab, (const void *)(uintptr_t)aa, dp, dp, 0.0f};
    int st = pclt_run(d, p, &c, &p->algo, s);
    if (st != 0) {
        p->ok = 0;
        pdde_log(PDDE_LOG_WARN, "pdde: cuda: cublasLtMatmul (%s) failed (status %d) on a %lldx%lldx%lld matmul: its epilogue runs as separate kernels\n",
                act == PDDE_MATMUL_GELU ? "GELU_AUX_BIAS" : "DGELU", st, (long long)M, (long long)N, (long long)K);
        return 1;
    }
    return PDDE_OK;
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
    static const struct { const char *name; size_t off; } graph_syms[] = {
#define PCU_GSYM(field, sym) {sym, offsetof(pcu_graph_api, field)}
        PCU_GSYM(BeginCapture, "cuStreamBeginCapture_v2"), PCU_GSYM(EndCapture, "cuStreamEndCapture"),
        PCU_GSYM(Instantiate, "cuGraphInstantiateWithFlags"),
        PCU_GSYM(Launch, "cuGraphLaunch"), PCU_GSYM(Destroy, "cuGraphDestroy"), PCU_GSYM(ExecDestroy, "cuGraphExecDestroy"),
#undef PCU_GSYM
    };
    f->graph.ok = 1;
    for (size_t i = 0; i < sizeof graph_syms / sizeof graph_syms[0]; i++) {
        void *p = dlsym(lib, graph_syms[i].name);
        if (!p) f->graph.ok = 0;
        else memcpy((char *)&f->graph + graph_syms[i].off, &p, sizeof p);
    }
    *(void **)&f->graph.GetCaptureInfo = dlsym(lib, "cuStreamGetCaptureInfo_v2");
    *(void **)&f->graph.KernelNodeSetParams = dlsym(lib, "cuGraphExecKernelNodeSetParams");
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
        f->cu.DeviceGetAttribute(&in->shared_optin, PCU_ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dv);
    }
    f->n_devices = count;
    pcu_load_cublas(f);
    pclt_load(f);
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

/* The dispatcher's environment switches into s (each is described where it is used). */
static void pcu_switches_read(pcu_stream *s) {
    s->mem_kernels = pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS);
    s->gemmex_lowp = pdde_env_bool("PDDE_CUDA_GEMMEX_LOWP", 0);
    s->lt_lowp_bias = pdde_env_bool("PDDE_CUDA_LT_LOWP_BIAS", 0);
    s->gemm_single = pdde_env_bool("PDDE_CUDA_GEMM_SINGLE", 0);
    s->embedding_back = pgd_embedding_back_env("PDDE_CUDA_", PGD_EMB_ATOMIC);
    s->embedding_sort = pgd_embedding_sort_env("PDDE_CUDA_");
    s->flash2_variant = pgd_flash2_variant_env();
}

static void pcu_stream_delete(pcu_dev *d, pcu_stream *s) {
    if (!s) return;
    pcu_graph_flush(d, s);
    d->fam->cu.StreamSynchronize(s->s);
    if (d->blas_stream == s->s) d->blas_stream = NULL; /* (a stream made later may get the same handle) */
    pcu_graph_free(d, s);
    if (s->scratch) d->fam->cu.MemFree(s->scratch);
    if (s->lt_workspace) d->fam->cu.MemFree(s->lt_workspace);
    d->fam->cu.StreamDestroy(s->s);
    free(s);
}

static void pcu_device_close(void *dev);

/* An embedded PTX text as one string (it is stored in pieces; see the generated header). */
static char *pcu_ptx_text(const char *const *parts) {
    size_t n = 0;
    for (int i = 0; parts[i]; i++) n += strlen(parts[i]);
    char *ptx = malloc(n + 1), *p = ptx;
    if (!ptx) return NULL;
    for (int i = 0; parts[i]; i++) {
        size_t l = strlen(parts[i]);
        memcpy(p, parts[i], l);
        p += l;
    }
    *p = 0;
    return ptx;
}

/* Loads one PTX text into d->mod; the driver's code and error log on failure (no error recorded). */
static pcu_result pcu_load_ptx(pcu_dev *d, const char *const *parts, char *elog, size_t elog_size) {
    pcu_family *f = d->fam;
    int opts[2] = {PCU_JIT_ERROR_LOG_BUFFER, PCU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[2] = {elog, (void *)(uintptr_t)elog_size};
    char *ptx = pcu_ptx_text(parts);
    if (!ptx) return PCU_ERROR_OUT_OF_MEMORY;
    elog[0] = 0;
    pcu_result r = f->cu.ModuleLoadDataEx(&d->mod, ptx, 2, opts, vals);
    if (r == PCU_ERROR_UNSUPPORTED_PTX_VERSION) {
        /* A driver older than the nvcc that wrote the PTX: the kernels use no recent PTX feature, so
         * declaring an older ISA version lets such drivers JIT them. */
        char *v = strstr(ptx, ".version ");
        if (v) memcpy(v, ".version 7.0", 12);
        elog[0] = 0;
        r = f->cu.ModuleLoadDataEx(&d->mod, ptx, 2, opts, vals);
    }
    free(ptx);
    return r;
}

/* The kernels: on compute capability 8.0 and later the PTX with the tensor-core attention kernels,
 * else (or where that one does not load) the compute_75 PTX, whose attention takes the other paths;
 * either fallback is said once on stderr. */
static pdde_status pcu_load_module(pcu_dev *d) {
    pcu_family *f = d->fam;
    const pcu_dev_info *in = &f->info[d->index];
    char elog[4096] = "";
    pcu_result r = PCU_ERROR_NO_DEVICE;
    d->has_flash = 0;
    if (in->cc_major >= 8) {
        r = pcu_load_ptx(d, pdde_cuda_ptx_mma_parts, elog, sizeof elog);
        if (r == PCU_SUCCESS) d->has_flash = 1;
        else {
            static atomic_int said;
            const char *name = NULL;
            f->cu.GetErrorName(r, &name);
            if (!atomic_exchange(&said, 1))
                pdde_log(PDDE_LOG_WARN, "pdde: cuda: the compute_80 kernels did not load on %s (%s, %d): the compute_75 ones run, "
                                "without the tiled attention: %.300s\n", in->name, name ? name : "?", r, elog);
        }
    } else {
        static atomic_int said;
        if (!atomic_exchange(&said, 1))
            pdde_log(PDDE_LOG_WARN, "pdde: cuda: %s (compute capability %d.%d) has no bf16 tensor cores: the tiled attention does "
                            "not run there\n", in->name, in->cc_major, in->cc_minor);
    }
    if (r != PCU_SUCCESS) r = pcu_load_ptx(d, pdde_cuda_ptx_parts, elog, sizeof elog);
    if (r != PCU_SUCCESS) {
        const char *name = NULL;
        f->cu.GetErrorName(r, &name);
        return pdde_error(f->ctx, PDDE_ERR_BUILD, "cuda: loading the kernels failed: %s (%d) (driver %d): %s",
                          name ? name : "?", r, f->driver_version, elog);
    }
    for (int k = 0; k < PGD_K_CUDA_COUNT; k++) {
        r = f->cu.ModuleGetFunction(&d->fn[k], d->mod, pgd_kernel_name(k));
        if (r != PCU_SUCCESS)
            return pdde_error(f->ctx, PDDE_ERR_BUILD, "cuda: kernel %s missing from the module", pgd_kernel_name(k));
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
    pthread_mutex_init(&d->gemm_lock, NULL);
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
    if (f->lt.lib && f->lt.Create(&d->lt) != 0) d->lt = NULL; /* (the generic epilogue runs) */
    static const char *const reductions[] = {"default", "all"};
    d->lt_reduction_all = pdde_env_choice("PDDE_CUDA_LT_REDUCTION", reductions, 2, 0) == 1;
    long lw_mib; /* (MiB, 0 to 1024: torch's cublasLt took 1 MiB by default in some versions) */
    pdde_env_int("PDDE_CUDA_LT_WORKSPACE", (long)(PCLT_WORKSPACE >> 20), 0, 1024, &lw_mib);
    d->lt_workspace_want = (size_t)lw_mib << 20;
    d->zero_on = pdde_env_bool("PDDE_CUDA_ZERO", 0);
    int graph_asked = pdde_env_bool("PDDE_CUDA_GRAPH", 0);
    d->graph_on = graph_asked && f->graph.ok;
    if (graph_asked && !f->graph.ok)
        pcu_graph_refuse(d, "the driver lacks the graph entry points (cuStreamBeginCapture_v2, cuGraphInstantiateWithFlags)", 0);
    if (f->blas.lib) {
        if (f->blas.Create(&d->blas) != 0) d->blas = NULL; /* falls back to k_gemm */
        else {
            /* (no split-K sums in a bf16 / f16 output's dtype, as cublasLt's plans: the f32 sum is rounded once) */
            int mode = (pdde_env_bool("PDDE_CUDA_TF32", 0) ? 3 /* TF32 tensor op */ : 0) | 16 /* DISALLOW_REDUCED_PRECISION_REDUCTION */;
            if (f->blas.SetMathMode) f->blas.SetMathMode(d->blas, mode);
        }
    }
    *out = d;
    return PDDE_OK;
}

static void pcu_device_close(void *dev) {
    pcu_dev *d = dev;
    if (!d) return;
    pcu_family *f = d->fam;
    if (d->graph_captures)
        pdde_log(PDDE_LOG_INFO, "pdde: cuda: PDDE_CUDA_GRAPH=1 on %s: %lld segments captured (%lld not kept), %lld replayed (%lld kernels patched), "
                        "%lld fell back\n", f->info[d->index].name, d->graph_captures, d->graph_discards, d->graph_replays, d->graph_patches,
                d->graph_fallbacks);
    if (d->cu_ctx) {
        f->cu.CtxSetCurrent(d->cu_ctx);
        pcu_stream_delete(d, d->default_stream); /* (first: a segment still open launches what reads cuBLAS's workspaces) */
        if (d->blas) f->blas.Destroy(d->blas);
        pclt_device_close(d);
        if (d->mod) f->cu.ModuleUnload(d->mod);
        f->cu.DevicePrimaryCtxRelease(d->cu_dev);
    }
    pthread_mutex_destroy(&d->gemm_lock);
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

/* Page-locked host memory (portable: any context may copy from it), for staging collectives: the
 * driver copies it by DMA, without a bounce through its own pinned buffer. */
static pdde_status pcu_host_alloc(void *dev, size_t nbytes, void **ptr) {
    pcu_dev *d = dev;
    *ptr = NULL;
    int st = pcu_bind(d);
    if (st) return st;
    pcu_result r = d->fam->cu.MemHostAlloc(ptr, nbytes ? nbytes : 4, 1 /* CU_MEMHOSTALLOC_PORTABLE */);
    if (r != PCU_SUCCESS) return *ptr = NULL, pcu_fail(d->fam, r, "cuMemHostAlloc", nbytes);
    return PDDE_OK;
}

static void pcu_host_free(void *dev, void *ptr) {
    pcu_dev *d = dev;
    if (ptr && !pcu_bind(d)) d->fam->cu.MemFreeHost(ptr);
}

static pcu_stream *pcu_st(pcu_dev *d, void *stream) { return stream ? (pcu_stream *)stream : d->default_stream; }

static pdde_status pcu_write(void *dev, void *stream, void *handle, size_t offset, const void *src, size_t n) {
    pcu_dev *d = dev;
    if (!n) return PDDE_OK;
    int st = pcu_bind(d);
    if (!st) st = pcu_graph_flush(d, pcu_st(d, stream));
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.MemcpyHtoDAsync((pcu_ptr)(uintptr_t)handle + offset, src, n, pcu_st(d, stream)->s),
              "cuMemcpyHtoDAsync");
    return PDDE_OK;
}

/* (PDDE_CUDA_ZERO=1; words by cuMemsetD32Async, a head or tail of fewer than 4 bytes copied from static zeros) */
static pdde_status pcu_zero(void *dev, void *stream, void *handle, size_t offset, size_t n) {
    static const uint32_t zeros = 0;
    pcu_dev *d = dev;
    if (!d->zero_on) return PDDE_ERR_UNSUPPORTED; /* (until a GPU run has checked it) */
    if (!n) return PDDE_OK;
    int st = pcu_bind(d);
    if (!st) st = pcu_graph_flush(d, pcu_st(d, stream));
    if (st) return st;
    pcu_ptr p = (pcu_ptr)(uintptr_t)handle + offset;
    size_t head = (4 - (size_t)(p % 4)) % 4;
    if (head > n) head = n;
    if (head) PCU_CHECK(d, d->fam->cu.MemcpyHtoDAsync(p, &zeros, head, pcu_st(d, stream)->s), "cuMemcpyHtoDAsync");
    p += head, n -= head;
    if (n / 4) PCU_CHECK(d, d->fam->cu.MemsetD32Async(p, 0, n / 4, pcu_st(d, stream)->s), "cuMemsetD32Async");
    if (n % 4) PCU_CHECK(d, d->fam->cu.MemcpyHtoDAsync(p + n / 4 * 4, &zeros, n % 4, pcu_st(d, stream)->s), "cuMemcpyHtoDAsync");
    return PDDE_OK;
}

static int pcu_graph_run(pcu_dev *d, pcu_stream *s, pcu_op *op);

static pdde_status pcu_copy(void *dev, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset, size_t n) {
    pcu_dev *d = dev;
    if (!n) return PDDE_OK;
    int st = pcu_bind(d);
    if (st) return st;
    pcu_op op = {.kind = PCU_OP_COPY, .dst = (pcu_ptr)(uintptr_t)dst + dst_offset, .src = (pcu_ptr)(uintptr_t)src + src_offset, .nbytes = n};
    return pcu_graph_run(d, pcu_st(d, stream), &op);
}

/* (the native slot) */
static pdde_status pcu_native(void *dev, void *stream, void **native_stream, int *runtime_index) {
    pcu_dev *d = dev;
    int st = pcu_bind(d);
    if (!st) st = pcu_graph_flush(d, pcu_st(d, stream)); /* (others enqueue on it: not in a capture of ours) */
    if (st) return st;
    if (native_stream) *native_stream = pcu_st(d, stream)->s;
    if (runtime_index) *runtime_index = d->index;
    return PDDE_OK;
}

static pdde_status pcu_read(void *dev, void *stream, void *handle, size_t offset, void *dst, size_t n) {
    pcu_dev *d = dev;
    if (!n) return PDDE_OK;
    int st = pcu_bind(d);
    if (!st) st = pcu_graph_flush(d, pcu_st(d, stream));
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
    pcu_stream *s = NULL;
    st = pcu_stream_new(d, &s);
    if (st) return st;
    pcu_switches_read(s), s->fixed = 1;
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
    pcu_stream *s = pcu_st(d, stream);
    if (!st) st = pcu_graph_flush(d, s);
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.StreamSynchronize(s->s), "cuStreamSynchronize");
    return PDDE_OK;
}

static pdde_status pcu_event_open(pcu_dev *d, unsigned flags, void **event) {
    *event = NULL;
    int st = pcu_bind(d);
    if (st) return st;
    pcu_cevent e;
    PCU_CHECK(d, d->fam->cu.EventCreate(&e, flags), "cuEventCreate");
    *event = e;
    return PDDE_OK;
}

static pdde_status pcu_event_create(void *dev, void **event) { return pcu_event_open(dev, PCU_EVENT_DISABLE_TIMING, event); }
static pdde_status pcu_event_create_timed(void *dev, void **event) { return pcu_event_open(dev, 0, event); }

static pdde_status pcu_event_elapsed(void *dev, void *e0, void *e1, double *ms) {
    pcu_dev *d = dev;
    int st = pcu_bind(d);
    if (st) return st;
    float f = 0;
    PCU_CHECK(d, d->fam->cu.EventElapsedTime(&f, e0, e1), "cuEventElapsedTime");
    *ms = f;
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
    if (!st) st = pcu_graph_flush(d, pcu_st(d, stream));
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
    if (!st) st = pcu_graph_flush(d, pcu_st(d, stream));
    if (st) return st;
    PCU_CHECK(d, d->fam->cu.StreamWaitEvent(pcu_st(d, stream)->s, event, 0), "cuStreamWaitEvent");
    return PDDE_OK;
}

/* --------------------------------------------------------------------------------------------------
 * Ops: backends/gpu_dispatch.h maps each op to kernels; these callbacks run them on a CUDA stream. */

/* REPLAY of a per-step operation: launch k's arguments set on the kept graph's next recorded kernel node
 * (of the same kernel), nothing enqueued; a mismatch marks the patch failed (the replay falls back). */
static int pcu_graph_patch(pcu_dev *d, pcu_stream *s, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned shared,
                           void **params) {
    pcu_piece *p = &s->piece[s->gt.cur];
    if (s->patch_pos >= p->n_patch || p->patch[s->patch_pos].k != k || !d->fam->graph.KernelNodeSetParams) return s->patch_failed = 1, PDDE_OK;
    pcu_kernel_node_params kp = {d->fn[k], {gx, gy, gz}, {bx, by, 1}, shared, params, NULL};
    if (d->fam->graph.KernelNodeSetParams(p->exec, p->patch[s->patch_pos++].node, &kp) != PCU_SUCCESS) s->patch_failed = 1;
    else d->graph_patches++;
    return PDDE_OK;
}

/* CAPTURE of a per-step operation: the kernel node its launch k just added (the stream's one dependency) */
static void pcu_graph_record(pcu_dev *d, pcu_stream *s, int k) {
    pcu_piece *p = &s->piece[s->gt.cur];
    int status = 0;
    unsigned long long id = 0;
    pcu_graph gr = NULL;
    const pcu_graph_node *deps = NULL;
    size_t n = 0;
    if (!d->fam->graph.GetCaptureInfo || d->fam->graph.GetCaptureInfo(s->s, &status, &id, &gr, &deps, &n) != PCU_SUCCESS || n != 1 || !deps) {
        s->patch_failed = 1;
        return;
    }
    if (p->n_patch == p->cap_patch) {
        int cap = p->cap_patch ? 2 * p->cap_patch : 64;
        pcu_patch *q = realloc(p->patch, (size_t)cap * sizeof *q);
        if (!q) {
            s->patch_failed = 1;
            return;
        }
        p->patch = q, p->cap_patch = cap;
    }
    p->patch[p->n_patch++] = (pcu_patch){k, deps[0]};
}

static int pcu_cb_launch(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                         unsigned by, int nargs, const pgd_arg *args) {
    pcu_dev *d = impl;
    pcu_stream *s = stream;
    void *params[32];
    pcu_ptr addr[32]; /* device addresses as CUdeviceptr */
    unsigned shared = 0; /* (a PGD_LOCAL argument: the dynamic shared memory, not a parameter) */
    if (nargs > 32) return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: too many kernel arguments");
    for (int i = 0; i < nargs; i++) {
        if (args[i].is_ptr == PGD_ARG_LOCAL) {
            shared = (unsigned)args[i].size, nargs = i;
            break;
        }
        if (args[i].is_ptr) addr[i] = pgd_addr(*(const pgd_ptr *)args[i].p);
        params[i] = args[i].is_ptr ? (void *)&addr[i] : (void *)args[i].p;
    }
    if (shared > PCU_STATIC_SHARED_MAX && atomic_load(&d->fn_shared[k]) < (int)shared) {
        /* (the attribute once a kernel, at the device's most less 1 KiB for the kernel's static shared memory) */
        int allow = d->fam->info[d->index].shared_optin - 1024;
        pcu_result ra = allow >= (int)shared ? d->fam->cu.FuncSetAttribute(d->fn[k], PCU_FUNC_ATTR_MAX_DYNAMIC_SHARED_SIZE_BYTES, allow)
                                             : PCU_ERROR_OUT_OF_MEMORY;
        if (ra != PCU_SUCCESS)
            return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: %s: %u bytes of dynamic shared memory refused (the device allows %d; error %d)",
                              pgd_kernel_name(k), shared, allow, ra);
        atomic_store(&d->fn_shared[k], allow);
    }
    if (s->patching) return pcu_graph_patch(d, s, k, gx, gy, gz, bx, by, shared, params);
    pcu_result r = d->fam->cu.LaunchKernel(d->fn[k], gx, gy, gz, bx, by, 1, shared, s->s, params, NULL);
    if (r == PCU_SUCCESS && s->rec_patch) pcu_graph_record(d, s, k);
    if (r != PCU_SUCCESS) {
        const char *name = NULL;
        d->fam->cu.GetErrorName(r, &name);
        return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: launching %s failed: %s (%d)", pgd_kernel_name(k),
                          name ? name : "?", r);
    }
    return PDDE_OK;
}

/* Per-stream scratch of at least nbytes (grown by reallocation after the stream drains). */
static int pcu_cb_scratch(void *impl, void *stream, size_t nbytes, pgd_ptr *out) {
    pcu_dev *d = impl;
    pcu_stream *s = stream;
    if (s->scratch_bytes < nbytes) {
        size_t want = nbytes < 65536 ? 65536 : nbytes;
        if (s->patching) return s->patch_failed = 1, PDDE_ERR_BACKEND; /* (a replay's operation asks more than when captured) */
        if (s->gt.mode == PGD_GRAPH_CAPTURE) s->torn = 1;
        if (s->scratch) {
            int st = pcu_graph_flush(d, s); /* (the synchronisation below may not be captured; this node's rest runs uncaptured) */
            if (st) return st;
            PCU_CHECK(d, d->fam->cu.StreamSynchronize(s->s), "cuStreamSynchronize");
            for (int i = 0; i < PGD_GRAPH_SLOTS; i++) /* (kept graphs read the old scratch: captured again) */
                pcu_piece_drop(d, &s->piece[i]), s->gt.slot[i].has_exec = 0, s->gt.slot[i].repeats = 0;
            d->fam->cu.MemFree(s->scratch);
            s->scratch = 0;
            s->scratch_bytes = 0;
        }
        pcu_result r = d->fam->cu.MemAlloc(&s->scratch, want);
        if (r != PCU_SUCCESS) return pcu_fail(d->fam, r, "cuMemAlloc (scratch)", want);
        s->scratch_bytes = want;
    }
    *out = (pgd_ptr){s->scratch, 0};
    return PDDE_OK;
}

static int pcu_cb_fill32(void *impl, void *stream, pgd_ptr dst, uint32_t value, size_t count) {
    pcu_dev *d = impl;
    if (!count) return PDDE_OK;
    if (((pcu_stream *)stream)->patching) return ((pcu_stream *)stream)->patch_failed = 1, PDDE_OK; /* (only kernels are patched) */
    PCU_CHECK(d, d->fam->cu.MemsetD32Async(pgd_addr(dst), value, count, ((pcu_stream *)stream)->s), "cuMemsetD32Async");
    return PDDE_OK;
}

static int pcu_cb_copy(void *impl, void *stream, pgd_ptr dst, pgd_ptr src, size_t nbytes) {
    pcu_dev *d = impl;
    if (((pcu_stream *)stream)->patching) return ((pcu_stream *)stream)->patch_failed = 1, PDDE_OK;
    PCU_CHECK(d, d->fam->cu.MemcpyDtoDAsync(pgd_addr(dst), pgd_addr(src), nbytes, ((pcu_stream *)stream)->s), "cuMemcpyDtoDAsync");
    return PDDE_OK;
}

/* cuBLAS's handle on stream s (nonzero: it refused); set only where it changes (a call per GEMM otherwise) */
static int pcu_blas_stream(pcu_dev *d, const pcu_stream *s) {
    if (d->blas_stream == s->s) return 0;
    if (d->fam->blas.SetStream(d->blas, s->s) != 0) return 1;
    d->blas_stream = s->s;
    return 0;
}

static int pcu_cb_gemm(void *impl, void *stream, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a,
                       int64_t sA, pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    pcu_dev *d = impl;
    if (((pcu_stream *)stream)->patching) return ((pcu_stream *)stream)->patch_failed = 1, PDDE_OK;
    const pcublas_api *bl = &d->fam->blas;
    if (!d->blas || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX) return 1;
    if (pcu_blas_stream(d, stream)) return 1;
    float one = 1.0f, zero = 0.0f;
    /* Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T. */
    int ldb = (int)(tb ? K : N), lda = (int)(ta ? M : K);
    int st = bl->SgemmStridedBatched(d->blas, tb ? 1 : 0, ta ? 1 : 0, (int)N, (int)M, (int)K, &one,
                                     (const float *)(uintptr_t)pgd_addr(b), ldb, sB,
                                     (const float *)(uintptr_t)pgd_addr(a), lda, sA, &zero,
                                     (float *)(uintptr_t)pgd_addr(c), (int)N, sC, (int)batch);
    if (st != 0) return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: cublasSgemmStridedBatched failed: status %d", st);
    return PDDE_OK;
}

/* PDDE_CUDA_GEMM_SINGLE=1 (off until measured): a GEMM of batch 1 goes to cublasGemmEx, as torch.matmul's does, not
 * to cublasGemmStridedBatchedEx with a batch of 1 (whose kernel choice may differ). */
static int pcu_gemm_single_on(const pcu_stream *s) {
    if (s->fixed) return s->gemm_single;
    return pdde_env_bool("PDDE_CUDA_GEMM_SINGLE", 0);
}

/* cuBLAS's mixed-precision GEMM (row-major D = op(A) op(B) as column-major D^T = op(B)^T op(A)^T), f32 compute */
static int pcu_blas_ex(pcu_dev *d, const pcu_stream *s, int in, int out, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a,
                       int64_t sA, pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    const pcublas_api *bl = &d->fam->blas;
    float one = 1.0f, zero = 0.0f;
    int ldb = (int)(tb ? K : N), lda = (int)(ta ? M : K);
    const void *pb = (const void *)(uintptr_t)pgd_addr(b), *pa = (const void *)(uintptr_t)pgd_addr(a);
    void *pc = (void *)(uintptr_t)pgd_addr(c);
    if (batch == 1 && bl->GemmEx && pcu_gemm_single_on(s))
        return bl->GemmEx(d->blas, tb ? 1 : 0, ta ? 1 : 0, (int)N, (int)M, (int)K, &one, pb, in, ldb, pa, in, lda, &zero, pc, out, (int)N,
                          PCUBLAS_COMPUTE_32F, PCUBLAS_GEMM_DEFAULT);
    return bl->GemmStridedBatchedEx(d->blas, tb ? 1 : 0, ta ? 1 : 0, (int)N, (int)M, (int)K, &one, pb, in, ldb, sB, pa, in, lda, sA, &zero, pc,
                                    out, (int)N, sC, (int)batch, PCUBLAS_COMPUTE_32F, PCUBLAS_GEMM_DEFAULT);
}

static int pcu_cb_gemm_lowp(void *impl, void *stream, pdde_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K,
                            pgd_ptr a, int64_t sA, pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    pcu_dev *d = impl;
    if (((pcu_stream *)stream)->patching) return ((pcu_stream *)stream)->patch_failed = 1, PDDE_OK;
    const pcublas_api *bl = &d->fam->blas;
    if (!d->blas || !bl->GemmStridedBatchedEx || M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX) return 1;
    if (pcu_blas_stream(d, stream)) return 1;
    int in = dt == PDDE_BF16 ? PCUBLAS_R_16BF : PCUBLAS_R_16F;
    int st = pcu_blas_ex(d, stream, in, PCUBLAS_R_32F, ta, tb, M, N, K, a, sA, b, sB, c, sC, batch);
    if (st != 0) return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: cublasGemmStridedBatchedEx (%s) failed: status %d", pdde_dtype_name(dt), st);
    return PDDE_OK;
}

/* PDDE_CUDA_GEMMEX_LOWP=1 (off until measured): a matmul node with a bf16 / f16 output and no epilogue (a cast
 * folded into it) is one cublasGemmStridedBatchedEx writing that dtype, as torch.matmul runs it, tried before
 * cublasLt; else such nodes take cublasLt (unless PDDE_CUDA_LT=0) or the GEMM into f32 and a cast. */
static int pcu_gemmex_lowp_on(const pcu_stream *s) {
    if (s->fixed) return s->gemmex_lowp;
    return pdde_env_bool("PDDE_CUDA_GEMMEX_LOWP", 0);
}

static int pcu_cb_gemm_epi(void *impl, void *stream, pdde_dtype dt, pdde_dtype ddt, int ta, int tb, int64_t M, int64_t N, int64_t K,
                           pgd_ptr pa, int64_t sA, pgd_ptr pb, int64_t sB, pgd_ptr pd, int64_t sD, int64_t batch, pgd_ptr bias, pgd_ptr pc,
                           float beta) {
    pcu_dev *d = impl;
    if (((pcu_stream *)stream)->patching) return ((pcu_stream *)stream)->patch_failed = 1, PDDE_OK;
    const pcublas_api *bl = &d->fam->blas;
    if (pcu_gemmex_lowp_on(stream) && !bias.base && beta == 0.0f && dt == ddt && (dt == PDDE_BF16 || dt == PDDE_F16) && d->blas &&
        bl->GemmStridedBatchedEx && M <= INT32_MAX && N <= INT32_MAX && K <= INT32_MAX && batch <= INT32_MAX &&
        !pcu_blas_stream(d, stream)) {
        int ty = dt == PDDE_BF16 ? PCUBLAS_R_16BF : PCUBLAS_R_16F;
        int st = pcu_blas_ex(d, stream, ty, ty, ta, tb, M, N, K, pa, sA, pb, sB, pd, sD, batch);
        if (st == 0) return PDDE_OK;
    }
    return d->lt ? pclt_cb_gemm_epi(impl, stream, dt, ddt, ta, tb, M, N, K, pa, sA, pb, sB, pd, sD, batch, bias, pc, beta) : 1;
}

/* The MoE kernels (gpu_moe.h) run only with PDDE_CUDA_MOE=1 until a GPU has verified them; without it
 * the MoE nodes fall back to the CPU as other unsupported ops do. */
static int pcu_moe_enabled(void) {
    return pdde_env_bool("PDDE_CUDA_MOE", 0);
}

static int pcu_supports_op(void *dev, const pdde_tensor *node) {
    (void)dev;
    return pgd_supports_op(node) || (pcu_moe_enabled() && pgd_supports_moe(node)) ||
           pgd_cuda_takes_rope(node, pdde_env_bool(PGD_CUDA_ROPE_ENV, 0)); /* (gpu_dispatch.h: rope only under PDDE_CUDA_ROPE=1) */
}

/* The GEMM entry points under the device's lock. cuBLAS's handle (its stream set by each call) and cublasLt's
 * plans (a plan's bias pointer set by each call) are the device's, shared by the streams of every session on it,
 * and sessions on host threads of their own (a pipeline stage's workers, each with a session here) call at once. */
#define PCU_LOCKED(call)                          \
    do {                                          \
        pcu_dev *d_ = impl;                       \
        pthread_mutex_lock(&d_->gemm_lock);       \
        int r_ = (call);                          \
        pthread_mutex_unlock(&d_->gemm_lock);     \
        return r_;                                \
    } while (0)
static int pcu_locked_gemm(void *impl, void *stream, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a, int64_t sA, pgd_ptr b,
                           int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    PCU_LOCKED(pcu_cb_gemm(impl, stream, ta, tb, M, N, K, a, sA, b, sB, c, sC, batch));
}
static int pcu_locked_gemm_lowp(void *impl, void *stream, pdde_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a,
                                int64_t sA, pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    PCU_LOCKED(pcu_cb_gemm_lowp(impl, stream, dt, ta, tb, M, N, K, a, sA, b, sB, c, sC, batch));
}
static int pcu_locked_gemm_epi(void *impl, void *stream, pdde_dtype dt, pdde_dtype ddt, int ta, int tb, int64_t M, int64_t N, int64_t K,
                               pgd_ptr pa, int64_t sA, pgd_ptr pb, int64_t sB, pgd_ptr pd, int64_t sD, int64_t batch, pgd_ptr bias, pgd_ptr pc,
                               float beta) {
    PCU_LOCKED(pcu_cb_gemm_epi(impl, stream, dt, ddt, ta, tb, M, N, K, pa, sA, pb, sB, pd, sD, batch, bias, pc, beta));
}
static int pcu_locked_gemm_act(void *impl, void *stream, int act, pdde_dtype dt, pdde_dtype ddt, int tb, int64_t M, int64_t N, int64_t K,
                               pgd_ptr pa, pgd_ptr pb, pgd_ptr pd, pgd_ptr bias, pgd_ptr aux, pdde_dtype xdt) {
    PCU_LOCKED(pclt_cb_gemm_act(impl, stream, act, dt, ddt, tb, M, N, K, pa, pb, pd, bias, aux, xdt));
}
static int pcu_locked_gemm_bgrad(void *impl, void *stream, pdde_dtype dt, int ta, int64_t M, int64_t N, int64_t K, pgd_ptr pa, pgd_ptr pb,
                                 pgd_ptr pd, pgd_ptr pg) {
    PCU_LOCKED(pclt_cb_gemm_bgrad(impl, stream, dt, ta, M, N, K, pa, pb, pd, pg));
}

/* The dispatcher's view of device d and stream s (the caller has made d's context current). */
static void pcu_dispatcher(pcu_dev *d, pcu_stream *s, pgd_ctx *out) {
    if (!s->fixed) pcu_switches_read(s);
    *out = (pgd_ctx){
        .ctx = d->fam->ctx, .name = "cuda", .impl = d, .stream = s,
        .units = (unsigned)d->sm_count, .max_block = 1024,
        .launch = pcu_cb_launch, .scratch = pcu_cb_scratch, .fill32 = pcu_cb_fill32, .copy = pcu_cb_copy,
        .gemm = pcu_locked_gemm, .gemm_lowp = pcu_locked_gemm_lowp, .gemm_epi = d->lt || s->gemmex_lowp ? pcu_locked_gemm_epi : NULL,
        .gemm_act = d->lt ? pcu_locked_gemm_act : NULL, .gemm_bgrad = d->lt ? pcu_locked_gemm_bgrad : NULL,
        /* (the attention's settings: backends/gpu_dispatch.h) */
        .attention_env = PGD_CUDA_ATTENTION_ENV, .attention_default = PGD_CUDA_ATTENTION_DEFAULT,
        .has_flash = d->has_flash ? PGD_CUDA_FLASH : 0, .flash_rows = 64, .flash_threads = 128, .flash2_variant = s->flash2_variant,
        .mem_kernels = s->mem_kernels, /* (PDDE_CUDA_COLSUM2, _ADAMW_CHUNKS: on unless "0"; _CE1, _ADAMW_VEC, _GELU2, _LN2: off unless "1") */
        /* (the shared memory past the static of the kernels that take it: block_sum's and block_max's) */
        .max_local = d->fam->info[d->index].shared_optin > 2048 ? (size_t)d->fam->info[d->index].shared_optin - 2048 : 0,
        .embedding_back = s->embedding_back, .embedding_sort = s->embedding_sort,
    };
}

/* --------------------------------------------------------------------------------------------------
 * Operations through the graph decisions (PDDE_CUDA_GRAPH; the section "CUDA graphs" above) */

/* Enqueues op on s as without graphs (or, patching, sets the kept graph's arguments). */
static int pcu_op_run(pcu_dev *d, pcu_stream *s, const pcu_op *op) {
    if (op->kind == PCU_OP_COPY) {
        PCU_CHECK(d, d->fam->cu.MemcpyDtoDAsync(op->dst, op->src, op->nbytes, s->s), "cuMemcpyDtoDAsync");
        return PDDE_OK;
    }
    pgd_ctx g;
    pcu_dispatcher(d, s, &g);
    return op->kind == PCU_OP_NODE ? pgd_compute_any(&g, op->node) : pgd_compute_group(&g, op->nodes, op->n);
}

static uint64_t pcu_op_key(const pcu_op *op, int declined, int *per_step) {
    *per_step = 0;
    return op->kind == PCU_OP_NODE    ? pgd_graph_node_key(op->node, per_step)
           : op->kind == PCU_OP_GROUP ? pgd_graph_group_key(op->nodes, op->n, declined, per_step)
                                      : pgd_graph_copy_key(op->dst, op->src, op->nbytes);
}

/* Swaps the op parameters of kept operation o's node(s) with those kept (before and after running it again). */
static void pcu_op_swap_params(pcu_op *o) {
    int n = o->kind == PCU_OP_GROUP ? o->n : o->kind == PCU_OP_NODE ? 1 : 0;
    for (int i = 0; i < n; i++) {
        pdde_tensor *t = o->kind == PCU_OP_GROUP ? o->nodes[i] : o->node;
        pcu_params cur;
        memcpy(cur.ip, t->iparams, sizeof cur.ip), memcpy(cur.fp, t->fparams, sizeof cur.fp);
        memcpy(t->iparams, o->params[i].ip, sizeof cur.ip), memcpy(t->fparams, o->params[i].fp, sizeof cur.fp);
        o->params[i] = cur;
    }
}

/* Runs the operations kept (a replay's deferred ones, or a capture's that did not become a graph) as without
 * graphs, each with the op parameters it came with. Each must still be what it was: a node the executor has
 * rebound since (another micro-batch's buffers) cannot run as it was. */
static int pcu_graph_run_deferred(pcu_dev *d, pcu_stream *s) {
    int st = PDDE_OK, n = s->n_def;
    s->n_def = 0;
    d->graph_fallbacks++;
    for (int i = 0; i < n && !st; i++) {
        pcu_op *o = &s->def[i];
        int per_step;
        pcu_op_swap_params(o);
        if (pcu_op_key(o, 0, &per_step) != o->key) {
            pcu_graph_refuse(d, "a node changed while its replay was pending", 0);
            st = pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: PDDE_CUDA_GRAPH: %s changed between its deferred launch and the replay's fallback",
                            o->kind == PCU_OP_NODE ? o->node->name : o->kind == PCU_OP_GROUP ? o->nodes[0]->name : "a copy");
        } else
            st = pcu_op_run(d, s, o);
        pcu_op_swap_params(o);
    }
    return st;
}

/* Keeps op, with its nodes' op parameters, until the segment's end. */
static int pcu_graph_defer(pcu_dev *d, pcu_stream *s, const pcu_op *op) {
    if (s->n_def == s->cap_def) {
        int cap = s->cap_def ? 2 * s->cap_def : 256;
        pcu_op *q = realloc(s->def, (size_t)cap * sizeof *q);
        if (!q) return pdde_error(d->fam->ctx, PDDE_ERR_OOM, "cuda: out of host memory (graph replay)");
        memset(q + s->cap_def, 0, (size_t)(cap - s->cap_def) * sizeof *q);
        s->def = q, s->cap_def = cap;
    }
    pcu_op *o = &s->def[s->n_def];
    int need = op->kind == PCU_OP_GROUP ? op->n : op->kind == PCU_OP_NODE ? 1 : 0, cap = o->cap;
    pdde_tensor **nodes = o->nodes;
    pcu_params *params = o->params;
    if (need > cap) {
        free(nodes), free(params);
        nodes = malloc((size_t)need * sizeof *nodes), params = malloc((size_t)need * sizeof *params), cap = need;
        if (!nodes || !params) {
            free(nodes), free(params), o->nodes = NULL, o->params = NULL, o->cap = 0;
            return pdde_error(d->fam->ctx, PDDE_ERR_OOM, "cuda: out of host memory (graph replay)");
        }
    }
    *o = *op, o->nodes = nodes, o->params = params, o->cap = cap;
    for (int i = 0; i < need; i++) {
        const pdde_tensor *t = op->kind == PCU_OP_GROUP ? op->nodes[i] : op->node;
        if (op->kind == PCU_OP_GROUP) nodes[i] = op->nodes[i];
        memcpy(params[i].ip, t->iparams, sizeof params[i].ip), memcpy(params[i].fp, t->fparams, sizeof params[i].fp);
    }
    s->n_def++;
    return PDDE_OK;
}

/* A replay that cannot go on: the graph dropped, the deferred operations run. */
static int pcu_graph_fall_back(pcu_dev *d, pcu_stream *s) {
    pcu_piece_drop(d, &s->piece[s->gt.cur]);
    return pcu_graph_run_deferred(d, s);
}

/* Runs op on s through the stream's graph decisions (gpu_graph.h). */
static int pcu_graph_run(pcu_dev *d, pcu_stream *s, pcu_op *op) {
    if (!d->graph_on && s->gt.mode == PGD_GRAPH_IDLE) return pcu_op_run(d, s, op);
    int per_step, st;
    uint64_t key = op->key = pcu_op_key(op, 0, &per_step);
    if (s->gt.mode == PGD_GRAPH_IDLE) {
        if (op->kind == PCU_OP_COPY) return pcu_op_run(d, s, op); /* (a copy opens no segment) */
        int drop;
        pgd_graph_mode m = pgd_graph_open(&s->gt, key, &drop);
        if (drop) pcu_piece_drop(d, &s->piece[s->gt.cur]);
        s->patch_pos = 0, s->patch_failed = 0, s->torn = 0;
        if (m == PGD_GRAPH_CAPTURE) {
            pcu_piece_drop(d, &s->piece[s->gt.cur]);
            pcu_result r = d->fam->graph.BeginCapture(s->s, PCU_STREAM_CAPTURE_MODE_RELAXED);
            if (r != PCU_SUCCESS) pcu_graph_refuse(d, "cuStreamBeginCapture failed", r), pgd_graph_abandon(&s->gt), s->gt.mode = PGD_GRAPH_PLAIN;
        }
    }
    if (op->kind == PCU_OP_GROUP && s->gt.mode == PGD_GRAPH_REPLAY) { /* (recorded as declined: the nodes come one by one) */
        int ps;
        uint64_t declined = pcu_op_key(op, 1, &ps);
        if (pgd_graph_expected(&s->gt) == declined) return pgd_graph_op(&s->gt, declined), PDDE_ERR_UNSUPPORTED;
    }
    switch (pgd_graph_op(&s->gt, key)) {
    case PGD_GRAPH_DEFER:
        if ((st = pcu_graph_defer(d, s, op))) return st;
        if (per_step) { /* (patched now: the executor sets the next micro-batch's values on the same node) */
            s->patching = 1;
            st = pcu_op_run(d, s, op);
            s->patching = 0;
            if (st || s->patch_failed) {
                pgd_graph_diverge(&s->gt);
                if ((st = pcu_graph_fall_back(d, s))) return st;
            }
        }
        return pgd_graph_full(&s->gt) ? pcu_graph_flush(d, s) : PDDE_OK;
    case PGD_GRAPH_DIVERGE:
        if ((st = pcu_graph_fall_back(d, s))) return st;
        break;
    case PGD_GRAPH_NOMEM: /* (nothing kept: plain from here) */
        if (s->n_def && (st = pcu_graph_fall_back(d, s))) return st;
        pcu_graph_refuse(d, "out of host memory for the graph decisions", 0);
        break;
    default: break;
    }
    if (s->gt.mode == PGD_GRAPH_CAPTURE && (st = pcu_graph_defer(d, s, op))) return st; /* (run again if the capture fails) */
    s->rec_patch = s->gt.mode == PGD_GRAPH_CAPTURE && per_step;
    st = pcu_op_run(d, s, op);
    s->rec_patch = 0;
    if (op->kind == PCU_OP_GROUP && st == PDDE_ERR_UNSUPPORTED) { /* (declined, nothing enqueued: its nodes come one by one) */
        int ps;
        if (s->gt.mode == PGD_GRAPH_CAPTURE && s->n_def) s->n_def--;
        pgd_graph_rekey(&s->gt, pcu_op_key(op, 1, &ps));
    }
    return !st && pgd_graph_full(&s->gt) ? pcu_graph_flush(d, s) : st;
}

/* Closes s's open segment before a host-visible operation: launches what it captured or the kept graph it
 * replayed, or runs what a replay deferred. */
static int pcu_graph_flush(pcu_dev *d, pcu_stream *s) {
    if (s->gt.mode == PGD_GRAPH_IDLE) return PDDE_OK;
    const pcu_graph_api *G = &d->fam->graph;
    pcu_piece *p = &s->piece[s->gt.cur];
    int st = PDDE_OK;
    if (s->gt.mode == PGD_GRAPH_REPLAY && s->patch_pos != p->n_patch) { /* (fewer per-step kernels than captured) */
        pgd_graph_diverge(&s->gt);
        st = pcu_graph_fall_back(d, s);
    }
    pgd_graph_action a = pgd_graph_close(&s->gt);
    if (a == PGD_GRAPH_LAUNCH) {
        s->n_def = 0;
        pcu_result r = G->Launch(p->exec, s->s);
        if (r != PCU_SUCCESS) return pcu_fail(d->fam, r, "cuGraphLaunch", 0);
        d->graph_replays++;
    } else if (a == PGD_GRAPH_FALLBACK) {
        st = pcu_graph_fall_back(d, s);
    } else if (a == PGD_GRAPH_KEEP || a == PGD_GRAPH_DISCARD) {
        pcu_graph gr = NULL;
        pcu_graph_exec ex = NULL;
        pcu_result r = G->EndCapture(s->s, &gr);
        if (r == PCU_SUCCESS && gr && (r = G->Instantiate(&ex, gr, 0)) != PCU_SUCCESS) ex = NULL;
        if (!ex) { /* (the captured work did not run: it runs now as without graphs, and no graphs from now on) */
            if (gr) G->Destroy(gr);
            p->n_patch = 0;
            pgd_graph_abandon(&s->gt);
            pcu_graph_refuse(d, gr ? "cuGraphInstantiate failed" : "the capture of a step failed (an operation that cannot be captured?)", r);
            if (s->torn) { /* (closed inside an operation, whose rest runs after: its start cannot run again alone) */
                s->n_def = 0, s->torn = 0, s->patch_failed = 0;
                return pdde_error(d->fam->ctx, PDDE_ERR_BACKEND, "cuda: a CUDA graph capture failed (%d) inside an operation: its work did not run", r);
            }
            st = pcu_graph_run_deferred(d, s);
            s->torn = 0, s->patch_failed = 0;
            return st;
        }
        s->n_def = 0;
        d->graph_captures++;
        r = G->Launch(ex, s->s);
        int keep = a == PGD_GRAPH_KEEP && !s->torn && !s->patch_failed && r == PCU_SUCCESS;
        if (keep) p->exec = ex, p->graph = gr;
        else {
            static atomic_int said;
            if (s->patch_failed && !atomic_exchange(&said, 1))
                pdde_log(PDDE_LOG_WARN, "pdde: cuda: PDDE_CUDA_GRAPH=1: a step's per-step kernel arguments cannot be patched in its graph (%s): "
                                "such segments run captured anew\n", G->GetCaptureInfo && G->KernelNodeSetParams ? "a capture's node was not found"
                                : "the driver lacks cuStreamGetCaptureInfo_v2 or cuGraphExecKernelNodeSetParams");
            G->ExecDestroy(ex), G->Destroy(gr);
            p->n_patch = 0;
            pgd_graph_abandon(&s->gt);
            d->graph_discards++;
        }
        if (r != PCU_SUCCESS) return pcu_fail(d->fam, r, "cuGraphLaunch", 0);
    }
    s->torn = 0, s->patch_failed = 0;
    return st;
}

static pdde_status pcu_compute(void *dev, void *stream, pdde_tensor *node) {
    pcu_dev *d = dev;
    int st = pcu_bind(d);
    pcu_op op = {.kind = PCU_OP_NODE, .node = node};
    return st ? st : pcu_graph_run(d, pcu_st(d, stream), &op);
}

static pdde_status pcu_compute_group(void *dev, void *stream, pdde_tensor *const *nodes, int n) {
    pcu_dev *d = dev;
    int st = pcu_bind(d);
    pcu_op op = {.kind = PCU_OP_GROUP, .nodes = (pdde_tensor **)nodes, .n = n};
    return st ? st : pcu_graph_run(d, pcu_st(d, stream), &op);
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
    .copy = pcu_copy,
    .native = pcu_native,
    .stream_create = pcu_stream_create,
    .stream_free = pcu_stream_free,
    .stream_sync = pcu_stream_sync,
    .compute = pcu_compute,
    .event_create = pcu_event_create,
    .event_free = pcu_event_free,
    .event_record = pcu_event_record,
    .event_sync = pcu_event_sync,
    .stream_wait_event = pcu_stream_wait_event,
    .host_alloc = pcu_host_alloc,
    .host_free = pcu_host_free,
    .compute_group = pcu_compute_group,
    .stream_create_timed = pcu_stream_create, /* (every CUDA stream can time its events) */
    .event_create_timed = pcu_event_create_timed,
    .event_elapsed = pcu_event_elapsed,
    .zero = pcu_zero,
};

#endif /* PDDE_NO_CUDA */
