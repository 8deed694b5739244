/* pdde.h — the one public header of pdde, an embeddable C engine for adaptive distributed training.
 *
 * A program builds a training step as a symbolic graph (no tensor data is allocated while building),
 * appends the backward pass and the optimizer update to the same graph, compiles it into a session
 * (memory plan + schedule on the chosen devices) and runs it step after step.
 *
 *     pdde_context *ctx; pdde_context_init(NULL, &ctx);
 *     pdde_graph *g;     pdde_graph_init(ctx, &g);
 *     pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){32, 784});
 *     ...build the model, pdde_backward(g, loss), pdde_optimizer_adamw(g, &opt)...
 *     pdde_session *s;   pdde_session_init(g, NULL, &s);
 *     pdde_session_run(s, PDDE_RUN_STEP);
 *
 * Conventions (shared/DESIGN.md "Style"):
 *  - fallible calls return pdde_status (0 = ok, negative = error, grouped by hundreds) and give outputs
 *    through their last pointer argument; pdde_last_error(ctx) carries the detail of the last error.
 *  - graph-building calls return a tensor, or NULL on error (the graph then remembers the first error,
 *    see pdde_graph_status), so a model can be written as plain expressions and checked once.
 *  - parameter structs are made by PDDE_*_PARAMS_INIT; a zero field means "the default".
 *  - every pdde_X_init has a pdde_X_free, and pdde_X_free(NULL) does nothing.
 *  - the library never calls exit() or abort() on bad input. */
#ifndef PDDE_H
#define PDDE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PDDE_VERSION_MAJOR 0
#define PDDE_VERSION_MINOR 1
#define PDDE_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------------------
 * Status codes, grouped by hundreds. */
typedef enum {
    PDDE_OK = 0,
    /* -1xx: the caller's input */
    PDDE_ERR_INVALID_ARG = -100,
    PDDE_ERR_SHAPE = -101,      /* shapes that do not fit together */
    PDDE_ERR_DTYPE = -102,      /* a dtype the op does not take */
    PDDE_ERR_UNKNOWN_OP = -103, /* an op id pdde does not know */
    PDDE_ERR_STATE = -104,      /* a call out of order (e.g. building after compile) */
    /* -2xx: resources */
    PDDE_ERR_OOM = -200,        /* host memory */
    PDDE_ERR_DEVICE_OOM = -201, /* a device's memory */
    /* -3xx: files and data */
    PDDE_ERR_IO = -300,
    PDDE_ERR_CORRUPT = -301,  /* bad magic, truncated, checksum mismatch */
    PDDE_ERR_VERSION = -302,  /* a format version this build cannot read */
    PDDE_ERR_MISMATCH = -303, /* a checkpoint that does not fit the model */
    PDDE_ERR_NOT_FOUND = -304,
    /* -4xx: devices and backends */
    PDDE_ERR_UNAVAILABLE = -400, /* no driver / no device of that family */
    PDDE_ERR_UNSUPPORTED = -401, /* the device cannot run that op or dtype */
    PDDE_ERR_BUILD = -402,       /* a kernel failed to build; the log is in the message */
    PDDE_ERR_BACKEND = -403,     /* the vendor runtime returned an error; its code is in the message */
    /* -5xx: communication */
    PDDE_ERR_TIMEOUT = -500,
    PDDE_ERR_PEER_LOST = -501,
    PDDE_ERR_COMM = -502,
    PDDE_ERR_ABORTED = -503,
    PDDE_ERR_ENV = -504, /* missing or inconsistent launcher environment */
    /* -6xx: distribution and planning */
    PDDE_ERR_NO_PLAN = -600,
    PDDE_ERR_DIST_ATTR = -601,
    /* -7xx: numerics */
    PDDE_ERR_NONFINITE = -700, /* a NaN or infinity in the loss or the gradients: the step was not taken */
} pdde_status;

/* A short constant description of a status code ("shape mismatch", ...). */
const char *pdde_status_str(int status);

/* ---------------------------------------------------------------------------------------------------
 * Context: owns the backends in use, the thread pool and the last-error message. */
typedef struct pdde_context pdde_context;

typedef struct pdde_backend_iface pdde_backend_iface;
typedef struct pdde_comm pdde_comm; /* a communicator (see "Communication") */

typedef struct {
    int n_threads;        /* CPU threads for kernels; 0 = all online cores; at most 4 per online core (more are
                             capped, with a message on stderr) */
    uint64_t seed;        /* seed of the context RNG (initial weights); 0 = 1234 */
    int log_level;        /* 0 = errors only (default), 1 = info, 2 = debug */
    /* Out-of-tree backends, tried after the built-in ones (the registry is fixed for the context). */
    const pdde_backend_iface *const *extra_backends;
    int n_extra_backends;
    /* Comma-separated backend families to start ("cpu,opencl"); NULL = all. The CPU always starts.
     * Also read from the environment variable PDDE_BACKENDS when this is NULL. Device runtimes start
     * threads that do not survive fork(): a process that forks workers (without exec) should start
     * only "cpu" and let each worker make its own context. */
    const char *backends;
} pdde_context_params;
#define PDDE_CONTEXT_PARAMS_INIT {0, 0, 0, NULL, 0, NULL}

pdde_status pdde_context_init(const pdde_context_params *params, pdde_context **out);
void pdde_context_free(pdde_context *ctx);
/* The message of the last error raised through ctx ("" if none). Valid until the next failing call. */
const char *pdde_last_error(const pdde_context *ctx);
int pdde_context_n_threads(const pdde_context *ctx);
/* Records an error message on ctx and returns status (for backends, plugins and the library itself). */
int pdde_error(pdde_context *ctx, int status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---------------------------------------------------------------------------------------------------
 * Data types. Computation is in f32; the others exist for memory accounting, ids and casts. */
typedef enum { PDDE_F32 = 0, PDDE_F16, PDDE_BF16, PDDE_I32, PDDE_I64, PDDE_DTYPE_COUNT } pdde_dtype;
size_t pdde_dtype_size(pdde_dtype t);
const char *pdde_dtype_name(pdde_dtype t);
/* Conversions used by casts and checkpoints (round to nearest even). */
uint16_t pdde_f32_to_f16(float f);
float pdde_f16_to_f32(uint16_t h);
uint16_t pdde_f32_to_bf16(float f);
float pdde_bf16_to_f32(uint16_t h);

/* ---------------------------------------------------------------------------------------------------
 * Tensors and ops. A pdde_tensor is a node of a graph: its op, inputs, shape and attributes. It holds
 * data only inside a compiled session. The struct is public so that out-of-tree backends can read a
 * node's op and parameters (ggml style); user code treats it as read-only. */
#define PDDE_MAX_DIMS 6
#define PDDE_MAX_SRC 6

typedef enum {
    PDDE_OP_NONE = 0, /* leaf: input, parameter or optimizer state */
    /* forward ops */
    PDDE_OP_MATMUL,      /* [..,M,K]x[..,K,N]; iparams: trans_a, trans_b; b may be 2-D (shared) */
    PDDE_OP_ADD,         /* numpy broadcasting of src1 onto src0's shape */
    PDDE_OP_SUB,
    PDDE_OP_MUL,
    PDDE_OP_SCALE,       /* fparams[0] * x */
    PDDE_OP_GELU,        /* tanh approximation (GPT-2) */
    PDDE_OP_RELU,
    PDDE_OP_SILU,
    PDDE_OP_LAYERNORM,   /* over the last dim; src: x, gamma, beta; fparams[0] = eps */
    PDDE_OP_RMSNORM,     /* over the last dim; src: x, gamma; fparams[0] = eps */
    PDDE_OP_SOFTMAX,     /* over the last dim; iparams[0] = causal (mask j > i of the last two dims) */
    PDDE_OP_CROSS_ENTROPY, /* src: logits [N,V], targets i32 [N]; scalar mean loss over targets >= 0 */
    PDDE_OP_EMBEDDING,   /* src: table [V,C], ids i32 [...]; out [...,C]. Vocab parallel (set by an SPMD
                            session; 0, 0 = a whole table): iparams[0] = the first id the table holds,
                            iparams[1] = the whole vocab; ids outside the table's rows give zero rows */
    PDDE_OP_RESHAPE,     /* a view: same data, new shape */
    PDDE_OP_PERMUTE,     /* iparams[0..ndim): output dim i takes input dim iparams[i] */
    PDDE_OP_CONCAT,      /* iparams[0] = axis; 2..PDDE_MAX_SRC inputs */
    PDDE_OP_SLICE,       /* iparams: axis, start; the output shape gives the length */
    PDDE_OP_SUM,         /* iparams[0] = axis (-1: all), iparams[1] = keepdim */
    PDDE_OP_MEAN,
    PDDE_OP_DROPOUT,     /* fparams[0] = p; iparams[0..1] = seed (lo, hi), iparams[2] = run counter
                            (set by the executor each run); keep(i) = hash(seed, counter, i) >= p */
    PDDE_OP_CAST,        /* to the output dtype */
    /* backward ops (appended by pdde_backward) */
    PDDE_OP_SUM_TO,      /* reduce src0 to this tensor's (broadcast-compatible) shape */
    PDDE_OP_EXPAND,      /* broadcast src0 to this tensor's shape, times fparams[0] */
    PDDE_OP_GELU_BACK,   /* src: x, dy */
    PDDE_OP_RELU_BACK,
    PDDE_OP_SILU_BACK,
    PDDE_OP_LAYERNORM_BACK,       /* src: x, gamma, dy -> dx */
    PDDE_OP_LAYERNORM_BACK_GAMMA, /* src: x, dy -> dgamma */
    PDDE_OP_RMSNORM_BACK,         /* src: x, gamma, dy -> dx */
    PDDE_OP_RMSNORM_BACK_GAMMA,   /* src: x, dy -> dgamma */
    PDDE_OP_SOFTMAX_BACK,         /* src: y, dy */
    PDDE_OP_CROSS_ENTROPY_BACK,   /* src: logits, targets, dloss (scalar) -> dlogits. With the
                                     forward: iparams[1] > 0 = logits split on the vocab (first
                                     column iparams[0] of iparams[1], over mesh axis iparams[2]),
                                     run by the SPMD session itself (cross-rank row reductions) */
    PDDE_OP_EMBEDDING_BACK,       /* src: base grad [V,C], ids, dy: base + scatter-add (in place);
                                     iparams as the embedding's (ids of other rows are skipped) */
    PDDE_OP_SLICE_BACK,           /* src: dy; pads dy with zeros back to this shape */
    PDDE_OP_DROPOUT_BACK,         /* src: dy; same mask as the forward (same seed) */
    PDDE_OP_GRAD_ACCUM,           /* src: accumulator (persistent), g: acc += g (in place); with
                                     iparams[3] = 1: acc[iparams[1] + i] += g[i] for i < iparams[2] */
    /* optimizer ops (appended by pdde_optimizer_*). Update ops write src0 (and their state) in place
     * and zero the gradient they consumed. fparams: [0] lr (set by the executor each step), [1] beta1
     * or momentum, [2] beta2, [3] eps, [4] weight decay, [5] clip norm (0 = off), [6] gradient scale
     * (1/grad_accum_steps); iparams[0] = step t, 1-based (set by the executor). */
    PDDE_OP_GRAD_NORM_SQ,         /* src: grad [, previous partial sum]: partial + scale^2 * sum(g^2) */
    PDDE_OP_SGD_UPDATE,           /* src: param, grad, momentum [, gnorm_sq] */
    PDDE_OP_ADAMW_UPDATE,         /* src: param, grad, m, v [, gnorm_sq] */
    /* (sharded optimizer, ZeRO-1: with iparams[3] = 1 the three ops above cover only elements
     *  [iparams[1], iparams[1] + iparams[2]) of param and grad; the state holds just that range) */
    /* communication and device-boundary ops (distributed graph; see the planner) */
    PDDE_OP_COPY,                 /* to another device */
    /* reshard collectives (inserted by the session where an op needs another layout of an input, see
     * "Distributed attributes"): over the communicator of mesh axis iparams[4], along tensor dim
     * iparams[5]; iparams[0] = reduce op. A gradient's reduction may start early (asynchronously) and
     * a PDDE_OP_COMM_WAIT (src: the collective) completes it. */
    PDDE_OP_ALLREDUCE,            /* partial -> whole */
    PDDE_OP_REDUCE_SCATTER,       /* partial -> split */
    PDDE_OP_ALLTOALL,             /* src0 split on dim iparams[7] -> split on dim iparams[5] instead */
    PDDE_OP_ALLGATHER,            /* split -> whole (with 2 srcs: the updated slices back into src0) */
    PDDE_OP_COMM_WAIT,
    /* between pipeline stages (inserted by the session where a tensor moves to another mesh): SEND
     * starts sending src0 to the rank at the same place of the consumer's mesh, RECV (no src) receives
     * it; iparams[0] = peer rank, [1] = tag */
    PDDE_OP_SEND,
    PDDE_OP_RECV,
    PDDE_OP_COUNT
} pdde_op;

const char *pdde_op_name(pdde_op op);

typedef enum {
    PDDE_TENSOR_INPUT = 1 << 0,      /* fed by the caller each step */
    PDDE_TENSOR_PARAM = 1 << 1,      /* trainable parameter */
    PDDE_TENSOR_STATE = 1 << 2,      /* optimizer state / gradient accumulator: persists across steps */
    PDDE_TENSOR_LOSS = 1 << 3,
    PDDE_TENSOR_OUTPUT = 1 << 4,     /* kept alive to the end of the step so the caller can read it */
    PDDE_TENSOR_VIEW = 1 << 5,       /* shares its src0's memory */
    PDDE_TENSOR_INPLACE = 1 << 6,    /* writes into its src0's memory */
    PDDE_TENSOR_CONST = 1 << 7,      /* a leaf filled with fparams[0] once */
    PDDE_TENSOR_GRAD = 1 << 8,       /* a parameter's gradient accumulator (STATE, not checkpointed) */
} pdde_tensor_flags;

typedef enum { PDDE_PHASE_FORWARD = 0, PDDE_PHASE_BACKWARD = 1, PDDE_PHASE_OPTIMIZER = 2 } pdde_phase;

typedef struct pdde_graph pdde_graph;
typedef struct pdde_tensor pdde_tensor;

/* Distributed attributes (the unified distributed graph; see "Distributed attributes" below).
 * A process mesh is an N-d array of ranks with named axes (e.g. dp x tp x pp). */
#define PDDE_MAX_MESH_DIMS 4
typedef struct pdde_mesh {
    int ndim;
    int shape[PDDE_MAX_MESH_DIMS];
    char names[PDDE_MAX_MESH_DIMS][16];
    int n_ranks;
    const int *ranks;        /* n_ranks process ids, row-major over shape */
} pdde_mesh;

/* A tensor's placement on a mesh: for each tensor dim, the mesh axis it is split over (-1 =
 * replicated along every axis; entries past ndim are -1); `partial` has bit a set when the values
 * are partial results still to be reduced over mesh axis a. A NULL mesh means "not annotated"
 * (completion fills it).
 * `partial_avg` bit a says that reductions over axis a are means, not sums: with `partial` bit a the
 * pending reduction is an average (a mean loss over a batch dim split over a); without it, the
 * values come from a local mean over a's shards (the gradient of such a loss: each rank
 * differentiates its own mean), so a partial over a that an op later makes of them (a weight
 * gradient summing the rows) is an average too. That is how data parallelism gets averaging. */
typedef struct {
    const pdde_mesh *mesh;
    int8_t ndim;                         /* entries of dims_mapping in use: the tensor's ndim */
    int8_t dims_mapping[PDDE_MAX_DIMS];
    uint8_t partial;
    uint8_t partial_avg;
} pdde_dist_attr;

struct pdde_tensor {
    int id;                  /* index in its graph, creation order (a topological order) */
    pdde_op op;
    pdde_dtype dtype;
    int ndim;
    int64_t shape[PDDE_MAX_DIMS];
    int nsrc;
    pdde_tensor *src[PDDE_MAX_SRC];
    int32_t iparams[8];
    float fparams[8];        /* leaves: [0] initial value (param: normal std; const: fill value) */
    uint32_t flags;          /* pdde_tensor_flags */
    pdde_phase phase;
    int device;              /* index into the session's devices; -1 = not placed (default device) */
    int layer;               /* user-set layer id (placement, recompute); -1 = none */
    pdde_tensor *grad;       /* set by pdde_backward for parameters (the gradient accumulator) */
    pdde_dist_attr dist;     /* how the tensor is laid out over the ranks (pdde_shard, completion) */
    void *data;              /* inside a compiled session: the buffer holding this rank's (local) data:
                                a host pointer on the CPU, the backend's buffer handle elsewhere */
    size_t offset;           /* byte offset of the data in that buffer */
    char name[64];
};

int64_t pdde_tensor_numel(const pdde_tensor *t);
size_t pdde_tensor_nbytes(const pdde_tensor *t);

/* ---------------------------------------------------------------------------------------------------
 * Graph building. All calls return NULL after an error; pdde_graph_status returns the first error and
 * pdde_last_error(ctx) its message (naming the op, the tensor and the shapes). */
pdde_status pdde_graph_init(pdde_context *ctx, pdde_graph **out);
/* Free a graph's session before the graph. */
void pdde_graph_free(pdde_graph *g);
pdde_status pdde_graph_status(const pdde_graph *g);
pdde_context *pdde_graph_context(const pdde_graph *g);
int pdde_graph_n_tensors(const pdde_graph *g);
pdde_tensor *pdde_graph_tensor(const pdde_graph *g, int id);
pdde_tensor *pdde_graph_find(const pdde_graph *g, const char *name);
/* Layer id given to tensors made from now on (for placement per layer and recompute); -1 = none. */
void pdde_graph_set_layer(pdde_graph *g, int layer);
/* Activation checkpointing: on != 0 makes pdde_backward recompute layer `layer` (>= 0) in the backward
 * pass instead of keeping its activations from the forward pass. Only the layer's inputs from other
 * layers (its checkpoints), parameters and outputs stay alive until backward; right before the layer's
 * first backward node, the forward nodes its backward reads run again (dropout draws the same mask),
 * so the activation memory of the layer is needed during its own backward only, at the price of about
 * one more forward of the layer. Call before pdde_backward (PDDE_ERR_STATE after). */
pdde_status pdde_graph_set_recompute(pdde_graph *g, int layer, int on);

/* Leaves. init_std > 0: normal(0, init_std) initial values; 0: zeros; < 0: ones. */
pdde_tensor *pdde_input(pdde_graph *g, const char *name, pdde_dtype t, int ndim, const int64_t *shape);
pdde_tensor *pdde_param(pdde_graph *g, const char *name, int ndim, const int64_t *shape, float init_std);

pdde_tensor *pdde_matmul(pdde_graph *g, pdde_tensor *a, pdde_tensor *b, int trans_a, int trans_b);
pdde_tensor *pdde_add(pdde_graph *g, pdde_tensor *a, pdde_tensor *b);
pdde_tensor *pdde_sub(pdde_graph *g, pdde_tensor *a, pdde_tensor *b);
pdde_tensor *pdde_mul(pdde_graph *g, pdde_tensor *a, pdde_tensor *b);
pdde_tensor *pdde_scale(pdde_graph *g, pdde_tensor *a, float s);
/* x + bias over the last dim (an add with broadcasting, named for readability). */
pdde_tensor *pdde_bias_add(pdde_graph *g, pdde_tensor *x, pdde_tensor *bias);
pdde_tensor *pdde_gelu(pdde_graph *g, pdde_tensor *x);
pdde_tensor *pdde_relu(pdde_graph *g, pdde_tensor *x);
pdde_tensor *pdde_silu(pdde_graph *g, pdde_tensor *x);
pdde_tensor *pdde_layernorm(pdde_graph *g, pdde_tensor *x, pdde_tensor *gamma, pdde_tensor *beta, float eps);
pdde_tensor *pdde_rmsnorm(pdde_graph *g, pdde_tensor *x, pdde_tensor *gamma, float eps);
pdde_tensor *pdde_softmax(pdde_graph *g, pdde_tensor *x, int causal);
/* Causal self-attention of q, k, v [B, H, T, D]: softmax(q k^T / sqrt(D), causal) v -> [B, H, T, D]. */
pdde_tensor *pdde_attention(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v);
/* Mean cross-entropy of softmax(logits [N, V]) against targets (i32 [N]; a negative target is ignored). */
pdde_tensor *pdde_cross_entropy(pdde_graph *g, pdde_tensor *logits, pdde_tensor *targets);
pdde_tensor *pdde_embedding(pdde_graph *g, pdde_tensor *table, pdde_tensor *ids);
pdde_tensor *pdde_reshape(pdde_graph *g, pdde_tensor *x, int ndim, const int64_t *shape);
pdde_tensor *pdde_permute(pdde_graph *g, pdde_tensor *x, const int *perm);
pdde_tensor *pdde_transpose(pdde_graph *g, pdde_tensor *x, int dim0, int dim1);
pdde_tensor *pdde_concat(pdde_graph *g, int n, pdde_tensor *const *xs, int axis);
pdde_tensor *pdde_slice(pdde_graph *g, pdde_tensor *x, int axis, int64_t start, int64_t len);
/* Splits x along axis into n equal parts written to out[0..n). Returns out[0] (NULL on error). */
pdde_tensor *pdde_split(pdde_graph *g, pdde_tensor *x, int axis, int n, pdde_tensor **out);
pdde_tensor *pdde_sum(pdde_graph *g, pdde_tensor *x, int axis, int keepdim); /* axis -1: all */
pdde_tensor *pdde_mean(pdde_graph *g, pdde_tensor *x, int axis, int keepdim);
/* Inverted dropout; deterministic for a given seed. Each training run (one with backward) draws a new
 * mask from (seed, run number); a forward-only run reuses the mask of the last training run. */
pdde_tensor *pdde_dropout(pdde_graph *g, pdde_tensor *x, float p, uint64_t seed);
pdde_tensor *pdde_cast(pdde_graph *g, pdde_tensor *x, pdde_dtype to);
pdde_status pdde_tensor_set_name(pdde_tensor *t, const char *name);
/* Keeps t's value readable after a run (pdde_session_read). Losses are outputs already. */
void pdde_mark_output(pdde_tensor *t);

/* ---------------------------------------------------------------------------------------------------
 * Autodiff: appends the backward pass of a scalar loss. Every parameter that the loss depends on gets
 * t->grad, a persistent gradient accumulator (sums over the micro-batches of one step). A tensor used
 * several times (tied embeddings) sums the gradients of all its uses. */
pdde_status pdde_backward(pdde_graph *g, pdde_tensor *loss);

/* ---------------------------------------------------------------------------------------------------
 * Optimizers: update nodes appended to the graph (phase PDDE_PHASE_OPTIMIZER). */
typedef enum { PDDE_LR_CONSTANT = 0, PDDE_LR_COSINE } pdde_lr_schedule;

typedef struct {
    float lr;              /* peak learning rate; 0 = 1e-3 */
    float beta1, beta2;    /* AdamW; 0 = 0.9, 0.999 */
    float eps;             /* AdamW; 0 = 1e-8 */
    float weight_decay;    /* decoupled (AdamW) / L2 (SGD); applied to tensors of ndim >= 2 only */
    float momentum;        /* SGD */
    float clip_norm;       /* global gradient-norm clipping; 0 = off */
    pdde_lr_schedule schedule;
    int64_t warmup_steps;  /* linear warmup from 0 */
    int64_t total_steps;   /* cosine decays to min_lr_ratio * lr at total_steps */
    float min_lr_ratio;
    int grad_accum_steps;  /* micro-batches per optimizer step; 0 = 1 (the loss is scaled by 1/n) */
} pdde_optimizer_params;
#define PDDE_OPTIMIZER_PARAMS_INIT {0}

pdde_status pdde_optimizer_adamw(pdde_graph *g, const pdde_optimizer_params *p);
pdde_status pdde_optimizer_sgd(pdde_graph *g, const pdde_optimizer_params *p);
/* Learning rate of the optimizer at a (0-based) step under its schedule. */
float pdde_lr_at(const pdde_optimizer_params *p, int64_t step);

/* ---------------------------------------------------------------------------------------------------
 * Devices and backends (ggml-style layering: backend family -> device -> stream / buffer -> event).
 * Every device of every available family gets a global index; device 0 is always the CPU. */
typedef enum { PDDE_DEVICE_CPU = 0, PDDE_DEVICE_GPU, PDDE_DEVICE_ACCEL } pdde_device_kind;

typedef struct {
    pdde_device_kind kind;
    char name[128];
    char backend[16];        /* family name: "cpu", "opencl", "cuda", "level_zero", ... */
    uint64_t memory_total;   /* bytes */
    uint64_t memory_free;    /* bytes; 0 = unknown */
    int compute_units;
    double peak_flops_f32;   /* FLOP/s, measured or from the vendor; 0 = unknown */
    double mem_bandwidth;    /* B/s; 0 = unknown */
} pdde_device_props;

int pdde_device_count(pdde_context *ctx);
pdde_status pdde_device_get_props(pdde_context *ctx, int device, pdde_device_props *out);
/* The global index of the index-th device of a family, or -1. */
int pdde_device_find(pdde_context *ctx, const char *backend, int index);

int pdde_backend_count(pdde_context *ctx);
const char *pdde_backend_name(pdde_context *ctx, int backend);
/* PDDE_OK if the family is available; else its status and, in *why, the reason ("no OpenCL ICD"). */
pdde_status pdde_backend_status(pdde_context *ctx, int backend, const char **why);

/* The backend interface, version 1. A backend fills one of these (api_version and struct_size first;
 * new slots are only ever appended; optional slots may be NULL and the core falls back).
 * Device memory: buffer_alloc returns a handle that the core stores in pdde_tensor.data, with the
 * tensor's byte offset in pdde_tensor.offset. Errors are reported with pdde_error(ctx, ...). */
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
};

/* ---------------------------------------------------------------------------------------------------
 * Session: a compiled graph with its memory plan, run step by step. */
typedef struct pdde_session pdde_session;

typedef enum {
    /* one forward, one backward: a stage keeps at most (stages - its index) micro-batches alive */
    PDDE_PIPELINE_1F1B = 0,
    /* all forwards, then all backwards: every micro-batch's activations alive at once */
    PDDE_PIPELINE_GPIPE = 1,
} pdde_pipeline_schedule;

typedef struct {
    int device;            /* default device for unplaced nodes (index in pdde_device_count); 0 = cpu */
    int no_memory_reuse;   /* 1: every tensor gets its own memory (for debugging and tests) */
    /* Placement per layer: nodes of layer l (pdde_graph_set_layer) without a device of their own run on
     * layer_devices[l] (-1 = the default). Copies are inserted at every device boundary. */
    const int *layer_devices;
    int n_layer_devices;
    /* SPMD execution of a graph completed by pdde_complete: each rank runs its partition of the graph
     * (local shapes) and reshard collectives are inserted where an op needs another attribute of an
     * input. world's ranks are the graph mesh's ranks, and every rank builds the same graph and passes
     * the same session params. Nodes may be placed on devices (layer_devices): the collectives and
     * stage transfers of device tensors go through host memory. */
    pdde_comm *world;
    /* Pipeline parallelism (layers on stage sub-meshes, pdde_strategy_pipeline): the order in which
     * each stage runs the forward and backward passes of a step's micro-batches. */
    pdde_pipeline_schedule pipeline_schedule;
    /* What the reshard collectives of f32 tensors communicate in: PDDE_F32 (default, exact), PDDE_BF16
     * or PDDE_F16 (half the bytes on the wire; a cast on each side, visible in pdde_session_dump). */
    pdde_dtype comm_dtype;
    /* Data parallelism's overlap: each gradient's reduction starts in the step's last backward as soon
     * as the gradient is final (1), or runs at the update (-1). 0 = overlap when the ranks on a host
     * leave it cores to progress communication (ranks x threads < cores): where they do not, the
     * progress of collectives in flight only takes cores from the computation. */
    int overlap_gradients;
    /* Memory admission: pdde_session_init refuses (PDDE_ERR_OOM, PDDE_ERR_DEVICE_OOM, with the numbers)
     * a plan whose buffers on the host or on a device exceed what is available there less this
     * fraction kept free (for the runtime, the program and fragmentation). 0 = the environment's
     * PDDE_MEMORY_HEADROOM, else 0.1; < 0 (or PDDE_MEMORY_HEADROOM=off) = no check. Host memory is
     * MemAvailable (and the cgroup's limit), shared by the job's ranks on the host, or
     * PDDE_MEMORY_AVAILABLE bytes when set; a device's is its free (else total) memory. */
    double memory_headroom;
} pdde_session_params;
#define PDDE_SESSION_PARAMS_INIT {0, 0, NULL, 0, NULL, PDDE_PIPELINE_1F1B, PDDE_F32, 0, 0}

/* Micro-batches: with the optimizer's grad_accum_steps M > 1, a step is M micro-batches. Either write
 * each one's inputs with pdde_session_write_micro and run PDDE_RUN_STEP (the session runs them all,
 * in the pipeline schedule when there are stages, then the update; the loss is their mean; FORWARD
 * likewise runs all M), or run FORWARD_BACKWARD M times (on what pdde_session_write wrote, which is
 * micro-batch 0) and then OPTIMIZER — not possible with pipeline stages, whose micro-batches must be
 * in flight together. */
typedef enum {
    PDDE_RUN_FORWARD = 1,           /* forward only (evaluation): no gradients */
    PDDE_RUN_FORWARD_BACKWARD = 3,  /* forward + backward: accumulates gradients */
    PDDE_RUN_OPTIMIZER = 4,         /* apply the accumulated gradients, zero them, step += 1 */
    PDDE_RUN_STEP = 7,              /* one training step: every micro-batch forward + backward, the update */
} pdde_run_mode;

/* Compiles g (one live session per graph: free it before compiling g again): keeps the nodes the step needs, places them, inserts COPY nodes at device boundaries
 * (appended to g, visible to pdde_graph_tensor), plans memory and allocates it. */
pdde_status pdde_session_init(pdde_graph *g, const pdde_session_params *params, pdde_session **out);
void pdde_session_free(pdde_session *s);
/* PDDE_ERR_NONFINITE: the loss, or the gradient norm when clipping, is NaN or infinite (see README
 * "Non-finite guard"); the update did not run and the step's gradients were dropped. */
pdde_status pdde_session_run(pdde_session *s, pdde_run_mode mode);
/* Copies between caller memory and a tensor's data (inputs, params, outputs, gradients).
 * nbytes must equal pdde_tensor_nbytes(t). */
pdde_status pdde_session_write(pdde_session *s, pdde_tensor *t, const void *src, size_t nbytes);
pdde_status pdde_session_read(pdde_session *s, const pdde_tensor *t, void *dst, size_t nbytes);
/* Writes t from a buffer holding the whole (global) tensor: under SPMD execution each rank keeps its
 * block; otherwise the same as pdde_session_write. */
pdde_status pdde_session_write_global(pdde_session *s, pdde_tensor *t, const void *src, size_t nbytes);
/* Writes input t of micro-batch `micro` (0..grad_accum_steps-1) of the next step, from a buffer
 * holding the whole micro-batch (global, as pdde_session_write_global). Under SPMD execution a rank
 * that does not hold t (another pipeline stage's input) ignores the call. */
pdde_status pdde_session_write_micro(pdde_session *s, pdde_tensor *t, int micro, const void *src, size_t nbytes);
float pdde_session_loss(pdde_session *s); /* the loss of the last run (NaN if none) */
int64_t pdde_session_step(const pdde_session *s);  /* optimizer steps taken */

typedef struct {
    size_t arena_bytes;       /* the activation arena: peak of the memory plan */
    size_t activation_bytes;  /* the sum of all non-persistent tensors (what no reuse would take) */
    size_t param_bytes;       /* parameters */
    size_t grad_bytes;        /* gradient accumulators */
    size_t optimizer_bytes;   /* optimizer state */
    size_t input_bytes;
    int n_nodes;              /* nodes scheduled */
} pdde_memory_stats;
pdde_status pdde_session_memory(const pdde_session *s, pdde_memory_stats *out);
/* This rank's program as it will run: every scheduled node in order with its phase, device, local
 * shape and dist attr, the communication the session inserted (collectives with their mesh axis,
 * sends and receives with their peer), and under pipeline stages the micro-batch schedule. */
void pdde_session_dump(const pdde_session *s, FILE *f);

/* ---------------------------------------------------------------------------------------------------
 * Checkpoints. Format (little-endian), documented in README.md "Checkpoint format":
 *   "PDDECKPT" u32 version u32 n_tensors u64 step u64 data_position u64 rng[2]
 *   per tensor: u16 name_len, name, u8 dtype, u8 ndim, i64 shape[ndim] (global), u16 attr_len, attr
 *   (the dist attr it was saved under, as pdde_dist_attr_str writes it; empty without one), u64 nbytes,
 *   data (the whole tensor, so it loads under any plan)
 *   u32 crc32 of everything before it.
 * Written to path.tmp, fsync'ed, then renamed over path: a crash mid-save leaves the old file. */
typedef struct {
    uint64_t data_position;  /* the data loader's position, restored by the caller */
} pdde_checkpoint_extra;

pdde_status pdde_checkpoint_save(pdde_session *s, const char *path, const pdde_checkpoint_extra *extra);
pdde_status pdde_checkpoint_load(pdde_session *s, const char *path, pdde_checkpoint_extra *extra);

/* ---------------------------------------------------------------------------------------------------
 * Data: a byte-level tokenizer (vocabulary 256) and a token loader with deterministic shuffling. */
typedef struct pdde_data pdde_data;

/* Loads a text file (bytes are the tokens) or a token file ("PDDETOK1" u64 count, i32 tokens). */
pdde_status pdde_data_open(pdde_context *ctx, const char *path, pdde_data **out);
/* The part [begin, end) of the tokens, as fractions (e.g. 0.9..1.0 for validation). */
pdde_status pdde_data_open_part(pdde_context *ctx, const char *path, double begin, double end,
                                pdde_data **out);
void pdde_data_free(pdde_data *d);
int64_t pdde_data_n_tokens(const pdde_data *d);
/* Fills x and y (next-token targets) [batch, T] with windows at positions shuffled by seed (a new
 * permutation each epoch); advances the position by batch. */
pdde_status pdde_data_next_batch(pdde_data *d, int batch, int T, uint64_t seed, int32_t *x, int32_t *y);
uint64_t pdde_data_position(const pdde_data *d);
void pdde_data_set_position(pdde_data *d, uint64_t pos);
/* Writes a text file's tokens as a token file. */
pdde_status pdde_data_write_tokens(pdde_context *ctx, const char *text_path, const char *out_path);

/* ---------------------------------------------------------------------------------------------------
 * Distributed attributes (shared/DESIGN.md "Distributed attributes"; Paddle's semi-automatic
 * auto-parallel). A program describes its ranks as process meshes, annotates a few tensors (inputs,
 * parameters, optimizer state) with pdde_shard or a strategy helper, and pdde_complete gives every
 * tensor of the graph a dist attr through per-op SPMD rules, and every op the attr it requires of
 * each input. Where a producer's attr and a consumer's requirement differ, the executor reshards:
 * partial -> replicated = allreduce, partial -> split = reduce_scatter, split -> replicated =
 * allgather, replicated -> split = a local slice, split on another dim = alltoall, another mesh =
 * send/recv. Completion is pure graph analysis: no process, device or data is needed.
 *
 *     const pdde_mesh *mesh = pdde_mesh_create(g, 2, (int[]){2, 4}, (const char *[]){"dp", "tp"}, NULL);
 *     pdde_strategy_data_parallel(g, mesh, "dp");
 *     pdde_strategy_tensor_parallel_linear(g, w, b, mesh, "tp", PDDE_TP_COLUMN);
 *     pdde_complete(g);
 *     pdde_graph_dump_dist(g, stdout);
 *
 * Meshes belong to the graph (freed with it). The first mesh created is the graph's mesh: the ranks
 * of the whole job, on which unannotated inputs and parameters are replicated; later meshes (e.g.
 * pipeline stages) may only use its ranks. Errors are PDDE_ERR_DIST_ATTR with a message naming the
 * tensor, the dim and the mesh axis. */

/* A mesh of shape[0] x ... x shape[ndim-1] ranks (ndim 1..PDDE_MAX_MESH_DIMS) with distinct axis
 * names (< 16 chars); ranks row-major (NULL = 0..n-1). NULL, and a sticky graph error, on bad input. */
const pdde_mesh *pdde_mesh_create(pdde_graph *g, int ndim, const int *shape, const char *const *names,
                                  const int *ranks);
/* The sub-mesh at `index` along `axis`, which it drops (e.g. one pipeline stage of a dp x pp mesh). */
const pdde_mesh *pdde_mesh_slice(pdde_graph *g, const pdde_mesh *mesh, int axis, int index);
/* Places layers first..last (pdde_graph_set_layer ids) on mesh, the graph's mesh or a slice of it: their
 * ops run there, their parameters (and state) live there, annotations on the graph's mesh seen from
 * the slice. Consecutive layers on different slices are pipeline stages: the tensors crossing them
 * move by send/recv, and the session runs micro-batches through the stages. */
pdde_status pdde_graph_set_layer_mesh(pdde_graph *g, int first_layer, int last_layer, const pdde_mesh *mesh);
/* The graph's mesh (NULL before any mesh exists); _set makes another of its meshes the default. */
const pdde_mesh *pdde_graph_mesh(const pdde_graph *g);
pdde_status pdde_graph_set_mesh(pdde_graph *g, const pdde_mesh *mesh);
/* The index of the axis called name, or -1. */
int pdde_mesh_axis(const pdde_mesh *mesh, const char *name);
/* coords[0..ndim) of rank in the mesh; PDDE_ERR_NOT_FOUND if the rank is not in it. */
pdde_status pdde_mesh_coords(const pdde_mesh *mesh, int rank, int *coords);
/* The rank at coords, or -1 when a coordinate is out of range. */
int pdde_mesh_rank_at(const pdde_mesh *mesh, const int *coords);

/* Annotates a leaf (input, parameter, optimizer state or gradient accumulator): dims_mapping[d] is
 * the mesh axis dim d is split over, or -1 (NULL = replicated). Checked: each axis in range, used by
 * at most one dim, and dividing its dim. Computed tensors get their attrs from completion. */
pdde_status pdde_shard(pdde_graph *g, pdde_tensor *t, const pdde_mesh *mesh, const int *dims_mapping);

/* Fills t->dist for every tensor of the graph (forward, backward and optimizer nodes) and the attr
 * each op requires of each input. Leaves keep their annotation; an unannotated input or parameter is
 * replicated on the graph's mesh, optimizer state and gradient accumulators follow their parameter.
 * Can be called again after more annotations (it starts over). Where the inputs of an op disagree
 * (two dims on one axis, a dim split two ways) the op's rule decides, e.g. the weight follows the
 * activation, and records a conflict; nothing is silently guessed. */
pdde_status pdde_complete(pdde_graph *g);
/* The attr node requires of its k-th input (NULL before completion, for leaves, or k out of range). */
const pdde_dist_attr *pdde_op_input_dist(const pdde_graph *g, const pdde_tensor *node, int k);
/* The conflicts the last completion resolved, and the message of the i-th ("node, input, why"). */
int pdde_complete_n_conflicts(const pdde_graph *g);
const char *pdde_complete_conflict(const pdde_graph *g, int i);
/* "mesh[2,2] dims[dp,-1,tp] partial{tp}" (partial{dp:avg} for a pending mean, avg{dp} for a local
 * mean, "unannotated" without mesh); returns what snprintf would. */
int pdde_dist_attr_str(const pdde_dist_attr *a, char *buf, size_t n);
/* A readable program: every node with its attr, the attrs it requires of its inputs where they differ
 * from what the producer gives (with the reshard that implies), and the conflicts. */
void pdde_graph_dump_dist(const pdde_graph *g, FILE *f);

/* Strategies: helpers that emit the annotations of common parallelisms (they only call pdde_shard,
 * merging with what is already annotated, so they compose: data parallel, then ZeRO or tensor
 * parallel, then pdde_complete). */
/* Every input's dim 0 (the batch) split over axis; unannotated parameters replicated on mesh. */
pdde_status pdde_strategy_data_parallel(pdde_graph *g, const pdde_mesh *mesh, const char *axis);
/* ZeRO over the data-parallel axis (after the optimizer is appended): stage 1 splits optimizer state,
 * 2 also the gradient accumulators, 3 also the parameters, each along its first dim that the axis
 * divides (kept as it is when none). */
pdde_status pdde_strategy_zero(pdde_graph *g, const pdde_mesh *mesh, const char *axis, int stage);
/* Megatron tensor parallelism of y = x @ w + b, w [in, out]: COLUMN splits w's out dim and b; ROW
 * splits w's in dim (x is then expected split on its last dim, the output is partial) and
 * replicates b. b may be NULL. */
typedef enum { PDDE_TP_COLUMN = 0, PDDE_TP_ROW = 1 } pdde_tp_kind;
pdde_status pdde_strategy_tensor_parallel_linear(pdde_graph *g, pdde_tensor *w, pdde_tensor *b,
                                                 const pdde_mesh *mesh, const char *axis, pdde_tp_kind kind);
/* Vocab-parallel embedding table [V, C] (Megatron's VocabParallelEmbedding, Paddle's c_embedding):
 * splits the vocab dim over axis, each rank holding V / axis-size consecutive rows. Its lookups give
 * partial rows (a rank adds the ids of its range, zeros for the others) that are reduced where a
 * consumer needs them whole; a tied head (logits = x @ table^T) gives logits split on the vocab, and
 * the cross-entropy reading them reduces its row max and sum over the axis inside (no gather of the
 * logits). V must divide by the axis size. */
pdde_status pdde_strategy_vocab_parallel(pdde_graph *g, pdde_tensor *table, const pdde_mesh *mesh, const char *axis);
/* Pipeline parallelism over mesh axis `axis` of size S: layers 0..n_layers-1 are cut into S stages of
 * consecutive layers (stage s: [s*n/S, (s+1)*n/S)), each on the slice of mesh at s along the axis
 * (pdde_graph_set_layer_mesh). The micro-batch count is the optimizer's grad_accum_steps; the
 * schedule is the session's pipeline_schedule. */
pdde_status pdde_strategy_pipeline(pdde_graph *g, const pdde_mesh *mesh, const char *axis, int n_layers);
/* Interleaved stages (Megatron's virtual pipeline): the layers cut into S x chunks runs, run r on stage
 * r % S, so each stage holds `chunks` runs of layers far apart and the pipeline bubble shrinks by that
 * factor. The micro-batch count must be a multiple of S. */
pdde_status pdde_strategy_pipeline_interleaved(pdde_graph *g, const pdde_mesh *mesh, const char *axis, int n_layers, int chunks);

/* ---------------------------------------------------------------------------------------------------
 * The planner search (planner/search.c): how to run a layered model on a set of devices. It tries
 * every data x tensor x pipeline degree the devices allow (and plans leaving the slowest devices out),
 * micro-batch counts, ZeRO stages, recompute and interleaved stages, cuts the layers (ids of
 * pdde_graph_set_layer) into pipeline stages sized by each stage's devices, and predicts each
 * candidate's step time and per-device memory from the graph's work per layer and the devices'
 * speeds, memories and links. Reads the symbolic graph only (build it at any size). */
#define PDDE_PLAN_MAX_STAGES 64

typedef struct {
    int n_devices;
    const double *flops;        /* [n] effective FLOP/s of each device on the model's GEMMs */
    const double *mem_bw;       /* [n] B/s of each device's memory (the other ops) */
    const double *memory;       /* [n] bytes each device may use */
    const int *host;            /* [n] host id of each device; NULL = one host */
    double intra_bw, intra_lat; /* a link between devices of one host: B/s, s */
    double inter_bw, inter_lat; /* between hosts */
} pdde_plan_devices;

typedef struct {
    int64_t batch;       /* the global batch the graph was built with (required) */
    int n_layers;        /* layer ids 0..n_layers-1; 0 = from the graph */
    int tp_divisor;      /* tensor-parallel degrees must divide this (e.g. attention heads); 0 = any */
    int max_micro;       /* 0 = 64 */
    int no_tp, no_pp, no_zero, no_recompute; /* 1 leaves a dimension out of the search */
    int overlap_dp;      /* 1: data-parallel gradient reductions overlap backward (spare cores, GPUs) */
} pdde_plan_params;
#define PDDE_PLAN_PARAMS_INIT {0, 0, 0, 0, 0, 0, 0, 0, 0}

/* A plan: dp x tp x pp ranks on a [dp, tp, pp] mesh (pp innermost; rank r on the r-th device used, in
 * the cluster's order), micro-batches per step, ZeRO stage over dp, recompute of every layer,
 * interleaved runs per stage, and the layers of each stage. */
typedef struct {
    int dp, tp, pp, micro, zero, recompute, chunks;
    int stage_first[PDDE_PLAN_MAX_STAGES + 1]; /* stage s runs layers [stage_first[s], stage_first[s+1]) */
    double step_s;      /* predicted step time (for a rejected plan: had it fitted) */
    double bubble_s;    /* of which the pipeline fills and drains */
    double peak_bytes;  /* predicted memory of the fullest device */
    int peak_device;
    char why[160];      /* a rejected plan: why it does not fit ("out of memory on device 3 ..."); else "" */
} pdde_plan;

/* Fills plans[0..*n_fit) with the fastest plans that fit, fastest first, then
 * plans[*n_fit..*n_fit + *n_rejected) with the fastest that do not fit and why. PDDE_ERR_NO_PLAN
 * (with the closest plan's reason in the message) when nothing fits. */
pdde_status pdde_plan_search(pdde_graph *g, const pdde_plan_devices *devices, const pdde_plan_params *params,
                             pdde_plan *plans, int max_plans, int *n_fit, int *n_rejected);
/* Predicts one plan (plan->stage_first all 0: an even cut), on its dp*tp*pp fastest devices, as the
 * search would: fills step_s, bubble_s, peak_bytes, peak_device and why ("" when it fits). */
pdde_status pdde_plan_evaluate(pdde_graph *g, const pdde_plan_devices *devices, const pdde_plan_params *params, pdde_plan *plan);
/* "dp=2,tp=1,pp=2,mb=4,zero=1,recompute=0[,chunks=2][,stages=3:3]"; returns what snprintf would. */
int pdde_plan_str(const pdde_plan *p, char *buf, size_t n);
/* Parses that form (keys in any order, missing ones 1 or 0; stages = layers per stage). */
pdde_status pdde_plan_parse(const char *text, pdde_plan *out);

/* ---------------------------------------------------------------------------------------------------
 * Communication (comm/): a bootstrap key-value store, rank discovery from launcher environments, a
 * transport plugin interface (UCX built in) and communicators with collectives.
 *
 *     pdde_comm *world;  pdde_comm_init(ctx, NULL, &world);        (rank/size/store from the env)
 *     pdde_comm_allreduce(world, grad, grad, n, PDDE_F32, PDDE_REDUCE_AVG);
 *     pdde_comm *dp;     pdde_comm_split(world, rank % tp, rank, &dp);   (one mesh axis)
 *
 * Rules: collectives on a communicator are called in the same order by all its ranks; a communicator
 * is used by one thread at a time (pdde_comm_abort excepted); every blocking call has a timeout.
 * Failure semantics: a timeout, a lost peer or an abort poisons the world communicator and every
 * communicator split from it: pending and future operations on them return PDDE_ERR_PEER_LOST,
 * PDDE_ERR_TIMEOUT or PDDE_ERR_ABORTED (on every rank, within params.peer_timeout_s of the failure);
 * recovery is pdde_comm_free and a new pdde_comm_init.
 * This section is compiled when pdde is built with UCX (PDDE_HAVE_UCX) and without PDDE_NO_COMM. */

/* The bootstrap store: string keys, byte-string values. A backend fills this vtable (api_version and
 * struct_size first; slots are only appended). Functions report errors with pdde_error(ctx, ...)
 * (ctx may be NULL) and return PDDE_ERR_NOT_FOUND for a missing key. */
#define PDDE_STORE_API_VERSION 1
typedef struct pdde_store pdde_store;
typedef struct {
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
     * before pdde_store_free, the store sets key to val unless key exists (an ephemeral "death
     * notice", like an etcd lease); any call refreshes the lease. */
    pdde_status (*set_liveness)(void *impl, pdde_context *ctx, const char *key, const void *val,
                                size_t len, double lease_s);
    pdde_status (*ping)(void *impl, pdde_context *ctx); /* optional: refreshes the lease */
    void (*close)(void *impl); /* a clean goodbye: cancels the liveness notice */
} pdde_store_iface;

/* Wraps a backend (etcd, ...): the store owns impl and closes it in pdde_store_free. */
pdde_status pdde_store_wrap(pdde_context *ctx, const pdde_store_iface *iface, void *impl, pdde_store **out);
/* A client of the built-in TCP store at "host:port", retrying the connection for up to timeout_s
 * (0 = 30 s) so that ranks may start before the server. */
pdde_status pdde_store_connect(pdde_context *ctx, const char *addr, double timeout_s, pdde_store **out);
void pdde_store_free(pdde_store *s);
pdde_status pdde_store_set(pdde_store *s, const char *key, const void *val, size_t len);
pdde_status pdde_store_get(pdde_store *s, const char *key, void **val, size_t *len);
pdde_status pdde_store_wait(pdde_store *s, const char *key, double timeout_s);
pdde_status pdde_store_add(pdde_store *s, const char *key, int64_t delta, int64_t *out);
pdde_status pdde_store_compare_set(pdde_store *s, const char *key, const void *expected, size_t expected_len,
                                   const void *desired, size_t desired_len, int *swapped);
pdde_status pdde_store_remove(pdde_store *s, const char *key);
pdde_status pdde_store_set_liveness(pdde_store *s, const char *key, const void *val, size_t len, double lease_s);
pdde_status pdde_store_ping(pdde_store *s);

/* The built-in TCP store server: one thread serving any number of clients. Hosted by pdde-run, or by
 * rank 0 under other launchers. addr "host:port"; port 0 picks a free port (see _port). */
typedef struct pdde_store_server pdde_store_server;
pdde_status pdde_store_server_init(pdde_context *ctx, const char *addr, pdde_store_server **out);
int pdde_store_server_port(const pdde_store_server *srv);
/* The clients connected now. */
int pdde_store_server_n_clients(const pdde_store_server *srv);
void pdde_store_server_free(pdde_store_server *srv);

/* Rank discovery. Read in this order, the first launcher found wins: pdde-run (PDDE_RANK,
 * PDDE_WORLD_SIZE, PDDE_LOCAL_RANK, PDDE_STORE_ADDR), OpenMPI (OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK),
 * PMI (PMI_RANK, PMI_SIZE), Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID). The store address
 * always comes from PDDE_STORE_ADDR (host:port). Missing or inconsistent variables give PDDE_ERR_ENV
 * with a message naming the variable. */
typedef struct {
    int rank, world_size;
    int local_rank;          /* -1 when the launcher does not say */
    char store_addr[256];    /* "" when PDDE_STORE_ADDR is not set */
    const char *launcher;    /* "pdde-run", "openmpi", "pmi", "slurm" */
} pdde_comm_env;
pdde_status pdde_comm_env_read(pdde_context *ctx, pdde_comm_env *out);

/* Memory kinds of communication buffers. Host only for now; device buffers will be staged through
 * host memory (or passed to transports whose props list PDDE_MEM_DEVICE). */
typedef enum { PDDE_MEM_HOST = 0, PDDE_MEM_DEVICE = 1 } pdde_mem_kind;

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
} pdde_transport_params;

typedef struct {
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
} pdde_transport_iface;

/* The built-in UCX transport (UCP tag API). Shared memory (posix, sysv, cma) then TCP by default;
 * UCX_* environment variables (UCX_TLS, UCX_NET_DEVICES, ...) override pdde's choices. */
const pdde_transport_iface *pdde_transport_ucx(void);

/* Communicators (pdde_comm, declared with the context) and collectives. */
typedef struct pdde_comm_request pdde_comm_request;

typedef enum { PDDE_REDUCE_SUM = 0, PDDE_REDUCE_AVG, PDDE_REDUCE_MAX, PDDE_REDUCE_MIN } pdde_reduce_op;

/* Algorithm choice (allreduce, reduce_scatter, allgather, broadcast, reduce). AUTO picks by message
 * size and topology: recursive doubling / trees for small messages, rings and pipelined chains for
 * large ones, two-level (intra-host, then inter-host) for allreduce when ranks span hosts. */
typedef enum {
    PDDE_ALGO_AUTO = 0,
    PDDE_ALGO_RING,       /* ring (allreduce, reduce_scatter, allgather); chain (broadcast, reduce) */
    PDDE_ALGO_RECURSIVE,  /* recursive doubling (allreduce, allgather); binomial tree (broadcast, reduce) */
    PDDE_ALGO_TWO_LEVEL,  /* allreduce only: intra-host reduce-scatter, inter-host allreduce, allgather */
} pdde_comm_algo;

typedef struct {
    pdde_store *store;           /* NULL: connect to PDDE_STORE_ADDR (rank 0 hosts it under launchers
                                    other than pdde-run); not owned */
    int rank, world_size;        /* world_size 0: both from the environment (pdde_comm_env_read) */
    const char *prefix;          /* key prefix in the store, one per job; NULL = "pdde" */
    double timeout_s;            /* init and blocking collectives; 0 = 300 */
    double peer_timeout_s;       /* bound on failure detection; 0 = 5 */
    pdde_comm_algo algo;         /* 0 = auto; the env PDDE_COMM_ALGO (ring, recursive, two_level) too */
    pdde_mem_kind mem_kind;      /* where the buffers passed to collectives live; host only for now */
    const pdde_transport_iface *transport; /* NULL = UCX */
    int no_progress_thread;      /* 1: non-blocking operations progress only inside test/wait */
    const char *host_id;         /* NULL: PDDE_HOST_ID or hostname + network namespace */
} pdde_comm_params;
#define PDDE_COMM_PARAMS_INIT {NULL, 0, 0, NULL, 0, 0, PDDE_ALGO_AUTO, PDDE_MEM_HOST, NULL, 0, NULL}

/* Collective over all ranks: reads the environment (or params), meets the others through the store,
 * connects every pair, exchanges host ids. */
pdde_status pdde_comm_init(pdde_context *ctx, const pdde_comm_params *params, pdde_comm **out);
/* Collective over comm: ranks with the same color form a sub-communicator, ordered by (key, rank);
 * color < 0 (PDDE_COMM_NO_COLOR) gives *out = NULL. Sub-communicators share the parent's connections
 * and must be freed before their world. */
#define PDDE_COMM_NO_COLOR (-1)
pdde_status pdde_comm_split(pdde_comm *comm, int color, int key, pdde_comm **out);
/* Local (no communication). Operations still pending on comm end with PDDE_ERR_ABORTED; requests of
 * comm must be freed before it. */
void pdde_comm_free(pdde_comm *comm);
int pdde_comm_rank(const pdde_comm *comm);
int pdde_comm_size(const pdde_comm *comm);
int pdde_comm_n_hosts(const pdde_comm *comm);
pdde_context *pdde_comm_context(const pdde_comm *comm);
void pdde_comm_set_algo(pdde_comm *comm, pdde_comm_algo algo);
/* The algorithm the last collective on comm used ("ring", "recursive", "two_level", ...). */
const char *pdde_comm_last_algo(const pdde_comm *comm);
/* Fails every pending and future operation of comm's world with PDDE_ERR_ABORTED here (and with
 * PDDE_ERR_ABORTED on the other ranks, through the store). Safe from any thread. */
void pdde_comm_abort(pdde_comm *comm);
/* PDDE_OK, or the error that poisoned the communicator. */
pdde_status pdde_comm_status(pdde_comm *comm);

/* Blocking collectives; buffers of count elements of dtype (in place: sendbuf == recvbuf). */
pdde_status pdde_comm_allreduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                pdde_dtype t, pdde_reduce_op op);
/* sendbuf holds size * recvcount elements; rank r gets the reduced block r. */
pdde_status pdde_comm_reduce_scatter(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                     pdde_dtype t, pdde_reduce_op op);
/* recvbuf gets size * sendcount elements, block r from rank r. */
pdde_status pdde_comm_allgather(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount, pdde_dtype t);
pdde_status pdde_comm_broadcast(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int root);
/* recvbuf is written on root only (may be NULL elsewhere). */
pdde_status pdde_comm_reduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t,
                             pdde_reduce_op op, int root);
/* Block r of sendbuf (count elements) goes to rank r; block r of recvbuf comes from rank r. */
pdde_status pdde_comm_alltoall(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t);
/* Counts and displacements in elements, one per rank. */
pdde_status pdde_comm_alltoallv(pdde_comm *c, const void *sendbuf, const size_t *sendcounts,
                                const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                const size_t *rdispls, pdde_dtype t);
pdde_status pdde_comm_barrier(pdde_comm *c);
/* Point to point; tag in [0, 2^20). */
pdde_status pdde_comm_send(pdde_comm *c, const void *buf, size_t count, pdde_dtype t, int peer, int tag);
pdde_status pdde_comm_recv(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int peer, int tag);

/* Non-blocking variants: same arguments, a request out; buffers stay untouched by the caller until the
 * request is done. Operations progress in the background (a progress thread per world) and inside
 * test/wait, so communication overlaps compute. */
pdde_status pdde_comm_iallreduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                                 pdde_dtype t, pdde_reduce_op op, pdde_comm_request **req);
pdde_status pdde_comm_ireduce_scatter(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                      pdde_dtype t, pdde_reduce_op op, pdde_comm_request **req);
pdde_status pdde_comm_iallgather(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount,
                                 pdde_dtype t, pdde_comm_request **req);
pdde_status pdde_comm_ibroadcast(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int root,
                                 pdde_comm_request **req);
pdde_status pdde_comm_ireduce(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t,
                              pdde_reduce_op op, int root, pdde_comm_request **req);
pdde_status pdde_comm_ialltoall(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t,
                                pdde_comm_request **req);
pdde_status pdde_comm_ialltoallv(pdde_comm *c, const void *sendbuf, const size_t *sendcounts,
                                 const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                 const size_t *rdispls, pdde_dtype t, pdde_comm_request **req);
pdde_status pdde_comm_ibarrier(pdde_comm *c, pdde_comm_request **req);
pdde_status pdde_comm_isend(pdde_comm *c, const void *buf, size_t count, pdde_dtype t, int peer, int tag,
                            pdde_comm_request **req);
pdde_status pdde_comm_irecv(pdde_comm *c, void *buf, size_t count, pdde_dtype t, int peer, int tag,
                            pdde_comm_request **req);
/* *done = 1 once finished; returns the operation's status then (PDDE_OK while pending). */
pdde_status pdde_comm_test(pdde_comm_request *req, int *done);
/* Waits up to timeout_s (< 0: the communicator's timeout_s). PDDE_ERR_TIMEOUT leaves the request
 * pending (wait again or free it); spins briefly, then sleeps, so a waiting rank does not burn a core. */
pdde_status pdde_comm_wait(pdde_comm_request *req, double timeout_s);
/* Frees a finished request; a pending one is detached and finishes (or fails) on its own, so its
 * buffers must stay valid until then or until the communicator is freed. */
void pdde_comm_request_free(pdde_comm_request *req);

#ifdef __cplusplus
}
#endif
#endif /* PDDE_H */
