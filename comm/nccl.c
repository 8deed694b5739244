/* comm/nccl.c — pdde_device_collectives_iface on NCCL, loaded at run time: libnccl.so.2 is dlopen'ed
 * in init (PDDE_NCCL_LIB, else the loader's search path, else beside PyTorch's nvidia-nccl wheel), so
 * pdde builds and runs without it and says PDDE_ERR_UNAVAILABLE where it is missing. Only the types,
 * enums and functions called here are declared, with NCCL's documented ABI (nccl.h of 2.18 and later;
 * the config struct carries its own size, so later libraries read it as they should).
 *
 * Bootstrap: the ranks first agree that every one of them can (libnccl loaded, a device whose backend
 * has the native slot: CUDA), else all say unavailable at once; then they exchange their devices'
 * UUIDs through the group, and where two ranks share a GPU (NCCL refuses them: "duplicate GPU") all
 * say unavailable at once, naming the two ranks, before any ncclCommInitRank; rank 0's ncclGetUniqueId goes to the
 * others with pdde_comm_broadcast (the group came out of pdde's store). The communicator is made
 * non-blocking (ncclCommInitRankConfig, blocking = 0) and polled (ncclCommGetAsyncError) until it is
 * ready, an error, pdde's own failure detection reports a lost peer, or the timeout: then
 * ncclCommAbort. Afterwards a watchdog thread polls the same two every few milliseconds and aborts the
 * communicator on an error or a lost peer, which ends NCCL kernels that wait for a dead rank; the
 * stream's synchronisation then returns instead of hanging, and every later call fails by name. */

#ifndef PDDE_COMM_NCCL_C
#define PDDE_COMM_NCCL_C

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "../pdde.h"
#include "../pdde_extension.h"

#include <dlfcn.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- NCCL's ABI (nccl.h): only what is called ---- */
typedef enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7 } nccl_result; /* ncclResult_t (0..7) */
typedef struct nccl_comm_st *nccl_comm;                                 /* ncclComm_t */
typedef struct { char internal[128]; } nccl_unique_id;                   /* ncclUniqueId, NCCL_UNIQUE_ID_BYTES */
typedef enum { NCCL_INT32 = 2, NCCL_INT64 = 4, NCCL_FLOAT16 = 6, NCCL_FLOAT32 = 7, NCCL_BFLOAT16 = 9 } nccl_dtype; /* ncclDataType_t */
typedef enum { NCCL_SUM = 0, NCCL_MAX = 2, NCCL_MIN = 3, NCCL_AVG = 4 } nccl_op; /* ncclRedOp_t */
typedef struct {                                                          /* ncclConfig_t as of 2.18 */
    size_t size;
    unsigned int magic, version;
    int blocking, cga_cluster_size, min_ctas, max_ctas;
    const char *net_name;
    int split_share;
} nccl_config;
#define NCCL_CONFIG_MAGIC 0xcafebeefu
#define NCCL_CONFIG_VERSION 21800u /* NCCL_VERSION(2, 18, 0) */

typedef struct {
    void *lib;
    nccl_result (*get_version)(int *);
    nccl_result (*get_unique_id)(nccl_unique_id *);
    nccl_result (*init_rank_config)(nccl_comm *, int, nccl_unique_id, int, nccl_config *);
    nccl_result (*get_async_error)(nccl_comm, nccl_result *);
    nccl_result (*abort)(nccl_comm);
    nccl_result (*destroy)(nccl_comm);
    nccl_result (*finalize)(nccl_comm); /* (2.14 and later; may be missing) */
    const char *(*error_string)(nccl_result);
    nccl_result (*allreduce)(const void *, void *, size_t, nccl_dtype, nccl_op, nccl_comm, void *);
    nccl_result (*reduce_scatter)(const void *, void *, size_t, nccl_dtype, nccl_op, nccl_comm, void *);
    nccl_result (*allgather)(const void *, void *, size_t, nccl_dtype, nccl_comm, void *);
} nccl_api;

typedef struct {
    pdde_context *ctx;
    pdde_comm *comm;
    const pdde_backend_iface *be;
    void *dev;
    double timeout_s;
    nccl_api api;
    nccl_comm nc;
    pthread_mutex_t lock;           /* NCCL calls on nc and its abort, one at a time */
    pthread_t watchdog;
    int watching;
    _Atomic int stop, aborted;      /* aborted: the reason, a pdde_status */
    char why[200];
} nccl_impl;

static double nccl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static void nccl_nap(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* libnccl's path beside PyTorch: the nvidia-nccl wheel's lib/ under a site-packages of python3 */
static void *nccl_open_beside_torch(char *tried, size_t cap) {
    FILE *p = popen("python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], \"lib\", \"libnccl.so.2\"))' "
                    "2>/dev/null", "r");
    char path[1024] = "";
    if (!p) return NULL;
    if (!fgets(path, sizeof path, p)) path[0] = 0;
    pclose(p);
    path[strcspn(path, "\n")] = 0;
    if (!path[0]) return NULL;
    size_t n = strlen(tried);
    snprintf(tried + n, cap - n, ", %s", path);
    return dlopen(path, RTLD_NOW | RTLD_LOCAL);
}

/* Loads libnccl and its symbols; 0 on success, else why in msg. */
static int nccl_load(nccl_api *a, char *msg, size_t cap) {
    char tried[1400];
    const char *env = getenv("PDDE_NCCL_LIB");
    memset(a, 0, sizeof *a);
    if (env && *env) {
        snprintf(tried, sizeof tried, "PDDE_NCCL_LIB=%s", env);
        a->lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    } else {
        snprintf(tried, sizeof tried, "libnccl.so.2 on the loader's path");
        a->lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
        if (!a->lib) a->lib = nccl_open_beside_torch(tried, sizeof tried);
    }
    if (!a->lib) {
        snprintf(msg, cap, "libnccl.so.2 not found (tried %s)", tried);
        return -1;
    }
#define NCCL_SYM(field, name, required)                                                        \
    do {                                                                                       \
        *(void **)&a->field = dlsym(a->lib, name);                                             \
        if (!a->field && required) {                                                           \
            snprintf(msg, cap, "%s lacks %s (NCCL 2.14 or later is needed)", tried, name);     \
            dlclose(a->lib);                                                                   \
            a->lib = NULL;                                                                     \
            return -1;                                                                         \
        }                                                                                      \
    } while (0)
    NCCL_SYM(get_version, "ncclGetVersion", 1);
    NCCL_SYM(get_unique_id, "ncclGetUniqueId", 1);
    NCCL_SYM(init_rank_config, "ncclCommInitRankConfig", 1);
    NCCL_SYM(get_async_error, "ncclCommGetAsyncError", 1);
    NCCL_SYM(abort, "ncclCommAbort", 1);
    NCCL_SYM(destroy, "ncclCommDestroy", 1);
    NCCL_SYM(finalize, "ncclCommFinalize", 0);
    NCCL_SYM(error_string, "ncclGetErrorString", 1);
    NCCL_SYM(allreduce, "ncclAllReduce", 1);
    NCCL_SYM(reduce_scatter, "ncclReduceScatter", 1);
    NCCL_SYM(allgather, "ncclAllGather", 1);
#undef NCCL_SYM
    int v = 0;
    if (a->get_version(&v) != NCCL_SUCCESS || v < 21400) {
        snprintf(msg, cap, "%s is NCCL %d: 2.14 or later is needed (non-blocking communicators)", tried, v);
        dlclose(a->lib);
        a->lib = NULL;
        return -1;
    }
    return 0;
}

/* The UUID of CUDA device ordinal (16 bytes; zeros where the driver does not say) and its PCI bus id
 * (for the message): from libcuda, which the CUDA backend has loaded (NCCL needs it too). */
static void nccl_device_uuid(int ordinal, unsigned char uuid[16], char *bus, size_t cap) {
    memset(uuid, 0, 16);
    snprintf(bus, cap, "?");
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    int (*get)(int *, int) = NULL, (*get_uuid)(unsigned char *, int) = NULL, (*get_bus)(char *, int, int) = NULL;
    *(void **)&get = dlsym(lib, "cuDeviceGet");
    *(void **)&get_uuid = dlsym(lib, "cuDeviceGetUuid_v2"); /* (11.4 and later: a MIG instance's own) */
    if (!get_uuid) *(void **)&get_uuid = dlsym(lib, "cuDeviceGetUuid");
    *(void **)&get_bus = dlsym(lib, "cuDeviceGetPCIBusId");
    int d = 0;
    if (get && get(&d, ordinal) == 0) {
        if (get_uuid && get_uuid(uuid, d)) memset(uuid, 0, 16);
        if (get_bus && get_bus(bus, (int)cap, d)) snprintf(bus, cap, "?");
    }
    dlclose(lib);
}

static const char *nccl_str(const nccl_impl *m, nccl_result r) {
    const char *s = m->api.error_string ? m->api.error_string(r) : NULL;
    return s ? s : "unknown NCCL error";
}

/* Aborts the communicator once, remembering why (the lock is held). */
static void nccl_abort_locked(nccl_impl *m, pdde_status why, const char *fmt, const char *detail) {
    if (atomic_load(&m->aborted) || !m->nc) return;
    snprintf(m->why, sizeof m->why, fmt, detail);
    m->api.abort(m->nc);
    atomic_store(&m->aborted, (int)why);
}

/* Polls the communicator until no operation of it is in progress: 0 when it is ready, else it was
 * aborted (an NCCL error, a peer pdde found lost, or timeout_s passed). The lock is held. */
static int nccl_settle(nccl_impl *m, double timeout_s, const char *what) {
    double deadline = nccl_now() + timeout_s, pause = 1e-4;
    for (;;) {
        nccl_result r = NCCL_IN_PROGRESS;
        if (m->api.get_async_error(m->nc, &r) != NCCL_SUCCESS) r = (nccl_result)3; /* (internal error) */
        if (r == NCCL_SUCCESS) return 0;
        if (r != NCCL_IN_PROGRESS) {
            nccl_abort_locked(m, PDDE_ERR_COMM, "nccl: %s", nccl_str(m, r));
            return -1;
        }
        if (pdde_comm_status(m->comm) != PDDE_OK) {
            nccl_abort_locked(m, PDDE_ERR_PEER_LOST, "nccl: aborted: %s", pdde_last_error(m->ctx));
            return -1;
        }
        if (nccl_now() >= deadline) {
            nccl_abort_locked(m, PDDE_ERR_TIMEOUT, "nccl: %s did not finish within the timeout: aborted", what);
            return -1;
        }
        nccl_nap(pause);
        pause = pause * 2 < 5e-3 ? pause * 2 : 5e-3;
    }
}

/* The watchdog: NCCL's asynchronous errors (a network failure, a remote abort) and pdde's failure
 * detection (a rank that died or stopped answering) abort the communicator. */
static void *nccl_watch(void *arg) {
    nccl_impl *m = arg;
    while (!atomic_load(&m->stop) && !atomic_load(&m->aborted)) {
        nccl_nap(0.01);
        if (pthread_mutex_trylock(&m->lock)) continue; /* a call is under way: it polls itself */
        nccl_result r = NCCL_SUCCESS;
        if (m->api.get_async_error(m->nc, &r) == NCCL_SUCCESS && r != NCCL_SUCCESS && r != NCCL_IN_PROGRESS)
            nccl_abort_locked(m, PDDE_ERR_COMM, "nccl: %s", nccl_str(m, r));
        else if (pdde_comm_status(m->comm) != PDDE_OK)
            nccl_abort_locked(m, PDDE_ERR_PEER_LOST, "nccl: aborted: %s", "a peer was lost");
        pthread_mutex_unlock(&m->lock);
    }
    return NULL;
}

static void nccl_free(void *impl) {
    nccl_impl *m = impl;
    if (!m) return;
    if (m->watching) {
        atomic_store(&m->stop, 1);
        pthread_join(m->watchdog, NULL);
    }
    if (m->nc) {
        pthread_mutex_lock(&m->lock);
        if (!atomic_load(&m->aborted) && m->be->native(m->dev, NULL, NULL, NULL) == PDDE_OK) {
            /* a healthy communicator finishes its work and parts in order, within the timeout */
            nccl_result r = m->api.finalize ? m->api.finalize(m->nc) : NCCL_SUCCESS;
            if (r == NCCL_SUCCESS || r == NCCL_IN_PROGRESS) {
                if (!nccl_settle(m, m->timeout_s, "ncclCommFinalize")) m->api.destroy(m->nc);
            } else {
                m->api.abort(m->nc);
            }
        } else if (!atomic_load(&m->aborted)) {
            m->api.abort(m->nc);
        }
        pthread_mutex_unlock(&m->lock);
    }
    pthread_mutex_destroy(&m->lock);
    if (m->api.lib) dlclose(m->api.lib);
    free(m);
}

static pdde_status nccl_init(const pdde_device_collectives_params *p, void **impl) {
    if (!p || !impl || !p->comm) return PDDE_ERR_INVALID_ARG;
    *impl = NULL;
    pdde_context *ctx = p->ctx;
    nccl_impl *m = calloc(1, sizeof *m);
    if (!m) return pdde_error(ctx, PDDE_ERR_OOM, "nccl: out of memory");
    m->ctx = ctx, m->comm = p->comm, m->be = p->backend, m->dev = p->dev;
    m->timeout_s = p->timeout_s > 0 ? p->timeout_s : 60;
    pthread_mutex_init(&m->lock, NULL);
    char why[1600] = "";
    int ready = 0, index = -1;
    if (nccl_load(&m->api, why, sizeof why)) (void)0;
    else if (!p->backend || !p->dev || p->backend->struct_size < offsetof(pdde_backend_iface, native) + sizeof(void *) ||
             !p->backend->native || strcmp(p->backend->name, "cuda"))
        snprintf(why, sizeof why, "NCCL serves CUDA devices only (this device's backend: %s)", p->backend ? p->backend->name : "none");
    else if (p->backend->native(p->dev, NULL, NULL, &index) != PDDE_OK)
        snprintf(why, sizeof why, "the CUDA device cannot be made current: %s", pdde_last_error(ctx));
    else
        ready = 1;
    /* every rank the same answer, at once: one that cannot would leave the others in ncclCommInitRank */
    int32_t all = ready;
    pdde_status st = pdde_comm_allreduce(p->comm, &all, &all, 1, PDDE_I32, PDDE_REDUCE_MIN);
    if (st) { nccl_free(m); return st; }
    if (!all) {
        int me = pdde_comm_rank(p->comm);
        nccl_free(m);
        if (!ready) return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "nccl: rank %d: %s", me, why);
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "nccl: another rank of the group cannot use NCCL (its message says why)");
    }
    /* one GPU a rank: NCCL's init fails ("duplicate GPU") where two ranks of a group share one */
    int me = pdde_comm_rank(p->comm), n = pdde_comm_size(p->comm), a = 0, b = 0;
    union { unsigned char b[16]; int32_t w[4]; } mine;
    char bus[64];
    nccl_device_uuid(index, mine.b, bus, sizeof bus);
    int32_t *uuids = calloc((size_t)n, sizeof mine);
    if (!uuids) { nccl_free(m); return pdde_error(ctx, PDDE_ERR_OOM, "nccl: out of memory"); }
    if ((st = pdde_comm_allgather(p->comm, mine.w, uuids, 4, PDDE_I32))) { free(uuids), nccl_free(m); return st; }
    int shared = pdde_device_ids_shared(uuids, n, sizeof mine, &a, &b);
    free(uuids);
    if (shared) {
        nccl_free(m);
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "nccl: ranks %d and %d of the group share one GPU (this rank's: CUDA device %d, PCI %s) and "
                          "NCCL needs a GPU a rank", a, b, index, bus);
    }
    nccl_unique_id id;
    memset(&id, 0, sizeof id);
    nccl_result r = NCCL_SUCCESS;
    if (me == 0) r = m->api.get_unique_id(&id);
    int32_t ok = r == NCCL_SUCCESS;
    if ((st = pdde_comm_allreduce(p->comm, &ok, &ok, 1, PDDE_I32, PDDE_REDUCE_MIN)) ||
        (!ok && (st = pdde_error(ctx, PDDE_ERR_COMM, "nccl: ncclGetUniqueId on rank 0 failed"))) ||
        (st = pdde_comm_broadcast(p->comm, &id, sizeof id / 4, PDDE_I32, 0))) {
        nccl_free(m);
        return st;
    }
    nccl_config cfg = {sizeof cfg, NCCL_CONFIG_MAGIC, NCCL_CONFIG_VERSION, 0, INT_MIN, INT_MIN, INT_MIN, NULL, INT_MIN};
    pthread_mutex_lock(&m->lock);
    r = m->api.init_rank_config(&m->nc, pdde_comm_size(p->comm), id, pdde_comm_rank(p->comm), &cfg);
    if (r != NCCL_SUCCESS && r != NCCL_IN_PROGRESS) {
        snprintf(m->why, sizeof m->why, "nccl: ncclCommInitRankConfig: %s", nccl_str(m, r));
        if (m->nc) m->api.abort(m->nc);
        m->nc = NULL;
        st = PDDE_ERR_COMM;
    } else if (nccl_settle(m, m->timeout_s, "ncclCommInitRankConfig")) {
        st = (pdde_status)atomic_load(&m->aborted);
        m->nc = NULL; /* (aborted: freed by NCCL) */
    }
    pthread_mutex_unlock(&m->lock);
    if (st) {
        pdde_status e = pdde_error(ctx, st, "%s (rank %d of %d, CUDA device %d)", m->why, pdde_comm_rank(p->comm), pdde_comm_size(p->comm), index);
        nccl_free(m);
        return e;
    }
    m->watching = pthread_create(&m->watchdog, NULL, nccl_watch, m) == 0;
    *impl = m;
    return PDDE_OK;
}

static int nccl_types(pdde_dtype t, pdde_reduce_op op, nccl_dtype *nt, nccl_op *no) {
    switch (t) {
    case PDDE_F32: *nt = NCCL_FLOAT32; break;
    case PDDE_F16: *nt = NCCL_FLOAT16; break;
    case PDDE_BF16: *nt = NCCL_BFLOAT16; break;
    case PDDE_I32: *nt = NCCL_INT32; break;
    case PDDE_I64: *nt = NCCL_INT64; break;
    default: return -1;
    }
    switch (op) {
    case PDDE_REDUCE_SUM: *no = NCCL_SUM; break;
    case PDDE_REDUCE_AVG: *no = NCCL_AVG; break;
    case PDDE_REDUCE_MAX: *no = NCCL_MAX; break;
    case PDDE_REDUCE_MIN: *no = NCCL_MIN; break;
    default: return -1;
    }
    return 0;
}

typedef enum { NCCL_CALL_ALLREDUCE, NCCL_CALL_REDUCE_SCATTER, NCCL_CALL_ALLGATHER } nccl_call_kind;

/* One collective, enqueued on the device's stream (CUDA: the CUstream the backend gives). */
static pdde_status nccl_call(nccl_impl *m, nccl_call_kind kind, void *stream, void *src, size_t src_off, void *dst, size_t dst_off,
                             size_t count, pdde_dtype t, pdde_reduce_op op) {
    static const char *const names[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather"};
    nccl_dtype nt;
    nccl_op no;
    if (!m) return PDDE_ERR_INVALID_ARG;
    if (nccl_types(t, op, &nt, &no))
        return pdde_error(m->ctx, PDDE_ERR_DTYPE, "nccl: %s of %s (op %d): NCCL has no such type or operation", names[kind], pdde_dtype_name(t), (int)op);
    if (!count) return PDDE_OK;
    pthread_mutex_lock(&m->lock);
    pdde_status st = (pdde_status)atomic_load(&m->aborted);
    void *cs = NULL;
    if (!st && (st = m->be->native(m->dev, stream, &cs, NULL))) snprintf(m->why, sizeof m->why, "nccl: %s", pdde_last_error(m->ctx));
    if (!st) {
        const char *s = (const char *)(uintptr_t)src + src_off;
        char *d = (char *)(uintptr_t)dst + dst_off;
        nccl_result r = kind == NCCL_CALL_ALLREDUCE        ? m->api.allreduce(s, d, count, nt, no, m->nc, cs)
                        : kind == NCCL_CALL_REDUCE_SCATTER ? m->api.reduce_scatter(s, d, count, nt, no, m->nc, cs)
                                                           : m->api.allgather(s, d, count, nt, m->nc, cs);
        if (r == NCCL_IN_PROGRESS) r = nccl_settle(m, m->timeout_s, names[kind]) ? (nccl_result)3 : NCCL_SUCCESS;
        else if (r != NCCL_SUCCESS) nccl_abort_locked(m, PDDE_ERR_COMM, "nccl: %s", nccl_str(m, r));
        st = r == NCCL_SUCCESS ? PDDE_OK : (pdde_status)atomic_load(&m->aborted);
    }
    char why[sizeof m->why];
    snprintf(why, sizeof why, "%s", m->why);
    pthread_mutex_unlock(&m->lock);
    return st ? pdde_error(m->ctx, st, "%s (%s)", why, names[kind]) : PDDE_OK;
}

static pdde_status nccl_allreduce(void *impl, void *stream, void *handle, size_t offset, size_t count, pdde_dtype t, pdde_reduce_op op) {
    return nccl_call(impl, NCCL_CALL_ALLREDUCE, stream, handle, offset, handle, offset, count, t, op);
}
static pdde_status nccl_reduce_scatter(void *impl, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset,
                                       size_t recvcount, pdde_dtype t, pdde_reduce_op op) {
    return nccl_call(impl, NCCL_CALL_REDUCE_SCATTER, stream, src, src_offset, dst, dst_offset, recvcount, t, op);
}
static pdde_status nccl_allgather(void *impl, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset,
                                  size_t sendcount, pdde_dtype t) {
    return nccl_call(impl, NCCL_CALL_ALLGATHER, stream, src, src_offset, dst, dst_offset, sendcount, t, PDDE_REDUCE_SUM);
}

static const pdde_device_collectives_iface nccl_collectives = {
    .api_version = PDDE_DEVICE_COLLECTIVES_API_VERSION,
    .struct_size = sizeof(pdde_device_collectives_iface),
    .name = "nccl",
    .backend = "cuda",
    .init = nccl_init,
    .allreduce = nccl_allreduce,
    .free = nccl_free,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather = nccl_allgather,
};

const pdde_device_collectives_iface *pdde_nccl_collectives(void) { return &nccl_collectives; }

#endif /* PDDE_COMM_NCCL_C */
