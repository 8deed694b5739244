/* pdde_extension.h — the extension points of pdde: what a new backend (a device family, built in or a
 * plugin), a bootstrap store or a transport implements. An application includes pdde.h only; an
 * extender includes this header, which includes pdde.h and the named op parameters a backend reads
 * (backends/op_params.h). Every vtable starts with api_version and struct_size; new slots are only
 * appended, and optional slots may be NULL (the core then falls back). */
#ifndef PDDE_EXTENSION_H
#define PDDE_EXTENSION_H

#include "pdde.h"
#include "backends/op_params.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------
 * Backends (backends/README.md is the bring-up guide).
 */
/* The backend interface, version 1. A backend fills one of these (api_version and struct_size first;
 * new slots are only ever appended; optional slots may be NULL and the core falls back).
 * Device memory: buffer_alloc returns a handle that the core stores in pdde_tensor.data, with the
 * tensor's byte offset in pdde_tensor.offset. Errors are reported with pdde_error(ctx, ...). */
/* A node flag the core sets, when it compiles a session, on each node whose device's supports_op took it
 * (the session never changes a node after): compute may skip asking again. */
#define PDDE_TENSOR_SUPPORTED (1u << 31)
#define PDDE_BACKEND_API_VERSION 1
struct pdde_backend_iface {
    uint32_t api_version;
    uint32_t struct_size;
    const char *name;
    /* family: PDDE_ERR_UNAVAILABLE with a message when there is no driver or no device */
    pdde_status (*init)(pdde_context *ctx, void **family, int *n_devices);
    void (*free)(void *family);
    pdde_status (*device_props)(void *family, int index, pdde_device_props *out);
    pdde_status (*device_open)(void *family, int index, void **dev);
    void (*device_close)(void *dev);
    /* 1 if the device can run this node (op, dtypes, shapes) */
    int (*supports_op)(void *dev, const pdde_tensor *node);
    pdde_status (*buffer_alloc)(void *dev, size_t nbytes, void **handle); /* PDDE_ERR_DEVICE_OOM */
    void (*buffer_free)(void *dev, void *handle);
    /* host <-> device copies, ordered on stream; complete when the stream is synchronized */
    pdde_status (*write)(void *dev, void *stream, void *handle, size_t offset, const void *src, size_t n);
    pdde_status (*read)(void *dev, void *stream, void *handle, size_t offset, void *dst, size_t n);
    pdde_status (*stream_create)(void *dev, void **stream);
    void (*stream_free)(void *dev, void *stream);
    pdde_status (*stream_sync)(void *dev, void *stream);
    /* enqueue the node's kernel on stream; node->data/offset and its srcs' are on this device */
    pdde_status (*compute)(void *dev, void *stream, pdde_tensor *node);
    /* optional: events (NULL: the core synchronizes the whole stream instead) */
    pdde_status (*event_create)(void *dev, void **event);
    void (*event_free)(void *dev, void *event);
    pdde_status (*event_record)(void *dev, void *event, void *stream);
    pdde_status (*event_sync)(void *dev, void *event);
    pdde_status (*stream_wait_event)(void *dev, void *stream, void *event);
    /* optional: page-locked host memory for staging transfers (NULL: plain malloc) */
    pdde_status (*host_alloc)(void *dev, size_t nbytes, void **ptr);
    void (*host_free)(void *dev, void *ptr);
    /* optional: enqueue n update nodes of one op (PDDE_OP_ADAMW_UPDATE or PDDE_OP_SGD_UPDATE) as one
     * multi-tensor launch. The core groups only nodes whose parameters are equal but for
     * UPDATE_WEIGHT_DECAY and that share their gnorm_sq source. PDDE_ERR_UNSUPPORTED (with nothing
     * enqueued; or NULL) makes the core run them one by one with compute. */
    pdde_status (*compute_group)(void *dev, void *stream, pdde_tensor *const *nodes, int n);
    /* optional: n bytes from one buffer of this device to another (or the same), ordered on stream
     * (the device gradient buckets of pdde_device_collectives_iface need it) */
    pdde_status (*copy)(void *dev, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset, size_t n);
    /* optional: for libraries that enqueue on the device themselves (NCCL): makes dev current on the
     * calling thread and gives the runtime's own stream for stream (CUDA: a CUstream; NULL: the
     * device's default stream) and the device's index in its runtime (CUDA: the ordinal). A buffer
     * handle plus an offset is then the device address (CUDA: a CUdeviceptr). */
    pdde_status (*native)(void *dev, void *stream, void **native_stream, int *runtime_index);
    /* optional: timing on the device (PDDE_PROFILE=device; any of the three NULL: the core times on the
     * host, synchronising after each node). The _timed creators make a stream whose recorded events can
     * be timed (OpenCL: a profiling queue) and such an event; event_elapsed gives the device's ms from e0
     * to e1, both recorded on streams of this device and complete (stream_sync'ed). */
    pdde_status (*stream_create_timed)(void *dev, void **stream);
    pdde_status (*event_create_timed)(void *dev, void **event);
    pdde_status (*event_elapsed)(void *dev, void *e0, void *e1, double *ms);
    /* optional: n bytes of buffer handle from offset set to zero on the device, ordered on stream (NULL, or
     * PDDE_ERR_UNSUPPORTED with nothing enqueued: the core writes zeros from host memory) */
    pdde_status (*zero)(void *dev, void *stream, void *handle, size_t offset, size_t n);
};
/* A context's device (a global index, as pdde_device_find gives): its backend and opened handle, for
 * extensions that work on a device outside a session (device collectives, their tests). */
pdde_status pdde_device_backend(pdde_context *ctx, int device, const pdde_backend_iface **iface, void **dev);

/* Backend plugins: a shared library (backends/README.md is the guide) that exports
 *     const pdde_backend_iface *pdde_backend_plugin(const pdde_backend_host *host);
 * pdde calls it once per context with host->api_version = PDDE_BACKEND_API_VERSION and the library
 * functions a plugin may call (so a plugin links against nothing of pdde's, whether pdde is a static
 * or a shared library); it returns its vtable, or NULL when it cannot serve, after
 * host->error(NULL, status, "why") (no context exists yet: with NULL the call records the reason the
 * loader shows for this plugin). Later calls pass the context init got.
 * A plugin that does not load, lacks the symbol, returns NULL or a vtable of another api_version is
 * refused: its family is listed unavailable with the reason (pdde_backend_status) and one line goes
 * to stderr; the context still starts with the other backends. */
#define PDDE_BACKEND_PLUGIN_ENTRY "pdde_backend_plugin"
typedef struct {
    uint32_t api_version;   /* PDDE_BACKEND_API_VERSION of the loading library */
    uint32_t struct_size;
    pdde_status (*error)(pdde_context *ctx, pdde_status status, const char *fmt, ...); /* = pdde_error; ctx NULL: why the entry declines */
    const char *(*op_name)(pdde_op op);                                /* = pdde_op_name */
    int64_t (*numel)(const pdde_tensor *t);                            /* = pdde_tensor_numel */
    size_t (*dtype_size)(pdde_dtype t);                                /* = pdde_dtype_size */
} pdde_backend_host;
typedef const pdde_backend_iface *(*pdde_backend_plugin_fn)(const pdde_backend_host *host);

/* ---------------------------------------------------------------------------------------------------
 * Device collectives
 */
/* A gradient bucket's collective on device memory, ordered on a device stream (NCCL's shape:
 * ncclAllReduce(buf, buf, count, type, op, comm, stream)). Given to a session
 * (pdde_session_params.device_collectives), it serves the allreduce buckets, and ZeRO's reduce-scatter
 * and gather buckets where it fills reduce_scatter and allgather, whose members all live on a device
 * of its backend family (`backend`, e.g. "cuda") that has the backend's copy slot: the session
 * gathers the members into a device buffer of the bucket's (a reduce-scatter's or gather's laid out
 * rank-major, its result after them) with copies on the device's stream, calls the collective on
 * that buffer and stream, and scatters the result with copies after it;
 * the executor, the lowering and the other buckets (host staging) do not change. init runs once per
 * communicator (an axis's group) on every one of its ranks at once, with p->comm for the bootstrap
 * (rank 0 creates the unique id, pdde_comm_broadcast carries it; the communicator itself came out
 * of pdde's store) and the failure semantics (an allreduce that cannot finish, a peer lost, fails
 * within p->timeout_s: an implementation polls its async error and aborts). An NCCL implementation
 * dlopens libnccl.so.2 in init and says PDDE_ERR_UNAVAILABLE where it is missing (the session then
 * stages through host memory). Functions report errors with pdde_error(ctx, ...). */
#define PDDE_DEVICE_COLLECTIVES_API_VERSION 1
typedef struct {
    pdde_context *ctx;
    pdde_comm *comm;                   /* the group: its rank, size and bootstrap */
    const pdde_backend_iface *backend; /* the devices' backend family and this rank's open device */
    void *dev;
    double timeout_s;
} pdde_device_collectives_params;
struct pdde_device_collectives_iface {
    uint32_t api_version;
    uint32_t struct_size;
    const char *name;       /* "nccl" */
    const char *backend;    /* the device family it serves: "cuda" */
    pdde_status (*init)(const pdde_device_collectives_params *p, void **impl);
    /* in place on count elements of buffer handle at byte offset, after what stream holds; done when
     * the stream is */
    pdde_status (*allreduce)(void *impl, void *stream, void *handle, size_t offset, size_t count, pdde_dtype t,
                             pdde_reduce_op op);
    void (*free)(void *impl);
    /* optional (NULL: not offered): out of place, ordered on stream like allreduce. reduce_scatter
     * reduces size x recvcount elements of src into this rank's recvcount at dst; allgather gathers
     * every rank's sendcount elements of src, in rank order, into dst. */
    pdde_status (*reduce_scatter)(void *impl, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset,
                                  size_t recvcount, pdde_dtype t, pdde_reduce_op op);
    pdde_status (*allgather)(void *impl, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset,
                             size_t sendcount, pdde_dtype t);
};
/* NCCL's implementation (libnccl.so.2 loaded at init: PDDE_NCCL_LIB, else the loader's path, else
 * beside PyTorch's nvidia-nccl wheel), for the "cuda" backend; where libnccl or CUDA is missing its
 * init says PDDE_ERR_UNAVAILABLE and why. */
const pdde_device_collectives_iface *pdde_nccl_collectives(void);
/* For implementations that need a device of its own for each rank (NCCL refuses two ranks of a group
 * on one GPU): given n ids of id_size bytes in rank order (CUDA: device UUIDs; all zeros: unknown,
 * matching none), 1 with the first two ranks that share one in *first < *second, else 0. */
int pdde_device_ids_shared(const void *ids, int n, size_t id_size, int *first, int *second);

/* ---------------------------------------------------------------------------------------------------
 * Stores
 */
/* The bootstrap store: string keys, byte-string values. A backend fills this vtable (api_version and
 * struct_size first; slots are only appended). Functions report errors with pdde_error(ctx, ...)
 * (ctx may be NULL) and return PDDE_ERR_NOT_FOUND for a missing key. */
#define PDDE_STORE_API_VERSION 1
struct pdde_store_iface {
    uint32_t api_version;
    uint32_t struct_size;
    const char *name;
    pdde_status (*set)(void *impl, pdde_context *ctx, const char *key, const void *val, size_t len);
    /* *val is malloc'ed (freed by the caller with free()) and NUL-terminated past len */
    pdde_status (*get)(void *impl, pdde_context *ctx, const char *key, void **val, size_t *len);
    /* atomically adds delta to the key's value (a decimal integer; a missing key is 0) */
    pdde_status (*add)(void *impl, pdde_context *ctx, const char *key, int64_t delta, int64_t *out);
    /* sets key to desired if its value equals expected (a missing key equals an empty expected) */
    pdde_status (*compare_set)(void *impl, pdde_context *ctx, const char *key, const void *expected,
                               size_t expected_len, const void *desired, size_t desired_len, int *swapped);
    pdde_status (*remove)(void *impl, pdde_context *ctx, const char *key);
    /* optional (NULL: pdde polls get): waits until key exists; PDDE_ERR_TIMEOUT after timeout_s */
    pdde_status (*wait)(void *impl, pdde_context *ctx, const char *key, double timeout_s);
    /* optional: if this client goes away (its process dies, or it is silent for lease_s > 0 seconds)
     * before pdde_store_close, the store sets key to val unless key exists (an ephemeral "death
     * notice", like an etcd lease); any call refreshes the lease. */
    pdde_status (*set_liveness)(void *impl, pdde_context *ctx, const char *key, const void *val,
                                size_t len, double lease_s);
    pdde_status (*ping)(void *impl, pdde_context *ctx); /* optional: refreshes the lease */
    void (*close)(void *impl); /* a clean goodbye: cancels the liveness notice */
};

/* ---------------------------------------------------------------------------------------------------
 * Transports
 */
/* The transport interface, shaped like NCCL's net plugin. A listen handle is an opaque blob that the
 * communicator publishes through the store; connect and accept are non-blocking (they return PDDE_OK
 * with *comm NULL until the connection is up, and are called again); isend/irecv return a request that
 * test() completes. Messages are matched by (connection, tag); a receive is at least as large as its
 * message. A lost peer makes its connections' requests fail with PDDE_ERR_PEER_LOST. */
#define PDDE_TRANSPORT_API_VERSION 1
#define PDDE_TRANSPORT_HANDLE_MAX 1024
#define PDDE_TRANSPORT_TAG_BITS 40 /* tags are < 2^40 */
typedef struct {
    char name[32];
    double bandwidth;        /* B/s, for the cost model; 0 = unknown */
    double latency;          /* s */
    uint32_t mem_kinds;      /* bit (1 << pdde_mem_kind) for each kind isend/irecv can take */
} pdde_transport_props;

typedef struct {
    double peer_timeout_s;   /* failure detection bound; 0 = 5 */
    const char *secret;      /* the job secret a connection must prove (NULL: none is checked) */
} pdde_transport_params;

struct pdde_transport_iface {
    uint32_t api_version;
    uint32_t struct_size;
    const char *name;
    pdde_status (*init)(pdde_context *ctx, const pdde_transport_params *p, void **tr);
    void (*fini)(void *tr);
    pdde_status (*get_props)(void *tr, pdde_transport_props *out);
    pdde_status (*listen)(void *tr, void *handle, size_t *handle_len, void **listen_comm);
    pdde_status (*connect)(void *tr, const void *handle, size_t handle_len, void **send_comm);
    pdde_status (*accept)(void *listen_comm, void **recv_comm);
    pdde_status (*isend)(void *send_comm, const void *buf, size_t n, uint64_t tag, pdde_mem_kind kind, void **req);
    pdde_status (*irecv)(void *recv_comm, void *buf, size_t n, uint64_t tag, pdde_mem_kind kind, void **req);
    /* *done = 1 when finished (ok or not); the request is released when test returns done or an error */
    pdde_status (*test)(void *req, int *done, size_t *nbytes);
    /* releases a pending request; its buffer is not touched once cancel returns */
    void (*cancel)(void *tr, void *req);
    /* drives the transport; returns 1 if anything happened */
    int (*progress)(void *tr);
    void (*close_send)(void *send_comm);
    void (*close_recv)(void *recv_comm);
    void (*close_listen)(void *listen_comm);
    /* optional: called after a failure, before the close_* calls, which then drop connections at once
     * (no flush, no progress: a cancelled receive must not be written into a buffer freed since) */
    void (*abort)(void *tr);
};

#ifdef __cplusplus
}
#endif

#endif /* PDDE_EXTENSION_H */
