/* pdde.h — the public header of pdde, an embeddable C engine for adaptive distributed training.
 *
 * Three objects and a dozen calls are all a first program needs (examples/mlp.c is one):
 *
 *     pdde_context   pdde_context_init(params, &ctx)      pdde_context_free(ctx)    backends, threads, errors
 *     pdde_graph     pdde_graph_init(ctx, &g)             pdde_graph_free(g)        the symbolic training step
 *     pdde_session   pdde_session_init(g, params, &s)     pdde_session_free(s)      g compiled: memory, devices
 *
 *     pdde_input, pdde_param, pdde_matmul, ..., pdde_cross_entropy    build the forward pass (no data yet)
 *     pdde_backward(g, loss)                                          append the backward pass
 *     pdde_optimizer_adamw(g, &opt)                                    append the update
 *     pdde_session_write(s, x, data, bytes)                            feed inputs
 *     pdde_session_run(s, PDDE_RUN_STEP)                               forward + backward + update
 *     pdde_session_loss(s), pdde_checkpoint_save(s, path, NULL)        read results, save
 *     pdde_last_error(ctx)                                             what went wrong
 *
 * The sections below follow the order a program meets them: status codes, context, tensors and graph
 * building, autodiff, optimizers, sessions, checkpoints, data, devices, several processes
 * (communication), distributed attributes, the planner, the cluster object and cost model, the
 * parameter server, the asynchronous pipeline. What a new backend, store or transport implements is in
 * pdde_extension.h.
 *
 * Conventions:
 *  - fallible calls return pdde_status (0 = ok, negative = error, grouped by hundreds) and give outputs
 *    through their last pointer argument; pdde_last_error(ctx) carries the detail of the calling
 *    thread's last error (errors are per thread).
 *  - graph-building calls return a tensor, or NULL on error (the graph then remembers the first error,
 *    see pdde_graph_status), so a model can be written as plain expressions and checked once.
 *  - parameter structs are made by PDDE_*_PARAMS_INIT; a zero field means "the default".
 *  - every constructor has one destructor (pdde_X_init / pdde_X_free, pdde_X_open / pdde_X_close,
 *    pdde_store_connect / pdde_store_close), and the destructor of NULL does nothing.
 *  - counts are pdde_X_Y_count; units are SI (bytes, seconds, FLOP/s).
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
    PDDE_ERR_STATE = -104,      /* a call out of order (e.g. compiling a graph whose session lives, pdde_backward twice) */
    /* -2xx: resources */
    PDDE_ERR_OOM = -200,        /* host memory */
    PDDE_ERR_DEVICE_OOM = -201, /* a device's memory */
    /* -3xx: files and data */
    PDDE_ERR_IO = -300,
    PDDE_ERR_CORRUPT = -301,  /* bad magic, truncated, checksum mismatch */
    PDDE_ERR_VERSION = -302,  /* a format version this build cannot read */
    PDDE_ERR_MISMATCH = -303, /* a checkpoint that does not fit the model; ranks of a session that run different graphs or plans */
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
    PDDE_ERR_AUTH = -505, /* a peer or store client that could not prove the job secret */
    /* -6xx: distribution and planning */
    PDDE_ERR_NO_PLAN = -600,
    PDDE_ERR_DIST_ATTR = -601,
    /* -7xx: numerics */
    PDDE_ERR_NONFINITE = -700, /* a NaN or infinity in the loss or the gradients: the step was not taken */
} pdde_status;

/* A short constant description of a status code ("shape mismatch", ...). */
const char *pdde_status_str(int status);

/* What this build of the library contains. A part left out (PDDE_NO_COMM, no UCX, a vendored copy
 * without comm/, ...) still links: its calls return PDDE_ERR_UNAVAILABLE with a message naming what
 * is missing, so a program can test a bit here, or simply call and report the error. */
typedef enum {
    PDDE_FEATURE_COMM = 1u << 0,       /* comm/: store, collectives, SPMD sessions, parameter server (UCX) */
    PDDE_FEATURE_OPENCL = 1u << 1,     /* the OpenCL backend (its driver is opened at run time) */
    PDDE_FEATURE_CUDA = 1u << 2,       /* the CUDA backend (likewise) */
    PDDE_FEATURE_LEVEL_ZERO = 1u << 3, /* the Level Zero backend (likewise) */
    PDDE_FEATURE_OPENBLAS = 1u << 4,   /* CPU GEMM through OpenBLAS */
    PDDE_FEATURE_DNNL = 1u << 5,       /* CPU GEMM (f32, bf16) through oneDNN */
    PDDE_FEATURE_CLBLAST = 1u << 6,    /* OpenCL GEMM through CLBlast */
    PDDE_FEATURE_HWLOC = 1u << 7,      /* topology detection for the cluster object */
    PDDE_FEATURE_CJSON = 1u << 8,      /* cluster files (pdde_cluster_load/save): every build */
    PDDE_FEATURE_PLUGINS = 1u << 9,    /* out-of-tree backends loaded with dlopen (PDDE_BACKEND_PLUGINS) */
    PDDE_FEATURE_NATIVE = 1u << 10,    /* compiled for the building machine's CPU: may not run on older ones */
} pdde_feature;
#define PDDE_FEATURE_COUNT 11
/* The PDDE_FEATURE_* bits of this build. */
uint32_t pdde_features(void);
/* "comm", "opencl", ... for one bit; NULL for a bit that names no feature. */
const char *pdde_feature_name(uint32_t feature);

/* ---------------------------------------------------------------------------------------------------
 * Context: owns the backends in use, the thread pool and the last-error message. */
typedef struct pdde_context pdde_context;

typedef struct pdde_backend_iface pdde_backend_iface;
typedef struct pdde_device_collectives_iface pdde_device_collectives_iface; /* pdde_extension.h */
typedef struct pdde_comm pdde_comm; /* a communicator (see "Communication") */

typedef struct {
    int n_threads;        /* CPU threads for kernels; 0 = PDDE_NUM_THREADS (pdde-run sets each rank's share of
                             the cores there), else all online cores; at most 4 per online core (more are
                             capped, with a message on stderr) */
    uint64_t seed;        /* seed of the context RNG (initial weights); 0 = 1234 */
    int log_level;        /* what this context adds to the log (pdde_log_set): 0 = warnings and info (default),
                             1 = also how the pipeline was sized, 2 = also every error raised */
    /* Out-of-tree backends, tried after the built-in ones (the registry is fixed for the context). */
    const pdde_backend_iface *const *extra_backends;
    int n_extra_backends;
    /* Comma-separated backend families to start ("cpu,opencl"); NULL = all. The CPU always starts.
     * Also read from the environment variable PDDE_BACKENDS when this is NULL. Device runtimes start
     * threads that do not survive fork(): a process that forks workers (without exec) should start
     * only "cpu" and let each worker make its own context. */
    const char *backends;
    /* Out-of-tree backends in shared libraries, "/path/liba.so:/path/libb.so" (see "Backend plugins");
     * NULL = the environment variable PDDE_BACKEND_PLUGINS. */
    const char *backend_plugins;
} pdde_context_params;
#define PDDE_CONTEXT_PARAMS_INIT {0, 0, 0, NULL, 0, NULL, NULL}

pdde_status pdde_context_init(const pdde_context_params *params, pdde_context **out);
/* Frees ctx, or, while graphs of it live (and their sessions), marks it: the last pdde_graph_free then
 * frees it. Free the other objects made with ctx (comm, data, store, elastic, ...) before it. */
void pdde_context_free(pdde_context *ctx);
/* The message of the last error raised through ctx on the calling thread ("" if none). Errors are per
 * thread, as errno is: threads that share a context (pipeline stages, data loaders) each read their
 * own message, whole, whatever the others raise meanwhile; read it on the thread that got the error
 * (pdde_pipeline_run raises a stage's error on the thread that called it). A thread that has raised
 * none on ctx, or whose last error was on another context, reads the context's last error of any
 * thread. The text stays valid on this thread until its next failing call or pdde_last_error. */
const char *pdde_last_error(const pdde_context *ctx);
int pdde_context_thread_count(const pdde_context *ctx);
/* Records an error message on ctx and returns status (for backends, plugins and the library itself);
 * safe on any thread: the message is the calling thread's (see pdde_last_error). */
pdde_status pdde_error(pdde_context *ctx, pdde_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* What the library says on its own, a line at a time (no newline): warnings (a setting it could not
 * honour, a bad environment value, a plugin that misreports itself), info (nodes moved to the CPU,
 * elastic changes, the PDDE_PROFILE report, where a trace went) and debug (every error, under
 * log_level 2). By default each line goes to
 * stderr; pdde_log_set sends them to fn instead (NULL: stderr again). Process-wide, as the environment
 * variables are. fn is called from any of the library's threads, one line at a time (never two at
 * once), and must not call pdde itself. */
typedef enum { PDDE_LOG_WARN = 0, PDDE_LOG_INFO = 1, PDDE_LOG_DEBUG = 2 } pdde_log_level;
typedef void (*pdde_log_fn)(pdde_log_level level, const char *line, void *user);
void pdde_log_set(pdde_log_fn fn, void *user);

/* ---------------------------------------------------------------------------------------------------
 * Data types. Parameters, gradients and optimizer state are f32; matmuls and attention also compute in
 * bf16 or f16 under a compute dtype (pdde_graph_set_compute_dtype); i32/i64 hold ids. */
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
 * node's op and parameters (ggml style); user code treats it as read-only. An op's parameters are
 * named slots, listed with each op below ("i:" integer, "f:" float; NAME is PDDE_P_NAME of
 * backends/op_params.h, read with pdde_op_i32/pdde_op_f32 there). */
#define PDDE_MAX_DIMS 6
#define PDDE_MAX_SRC 6

typedef enum {
    PDDE_OP_NONE = 0, /* leaf: input, parameter or optimizer state */
    /* forward ops */
    PDDE_OP_MATMUL,      /* [..,M,K]x[..,K,N]; i: MATMUL_TRANS_A, MATMUL_TRANS_B; b may be 2-D (shared); f32, or bf16
                            in, f32 out (lowering's fusions: + bias [N] (src 2), + MATMUL_RESIDUAL's last src, bf16 out) */
    PDDE_OP_ADD,         /* numpy broadcasting of src1 onto src0's shape */
    PDDE_OP_SUB,
    PDDE_OP_MUL,
    PDDE_OP_SCALE,       /* f: SCALE times x */
    PDDE_OP_GELU,        /* tanh approximation (GPT-2) */
    PDDE_OP_RELU,
    PDDE_OP_SILU,
    PDDE_OP_LAYERNORM,   /* over the last dim; src: x, gamma, beta; f: NORM_EPS */
    PDDE_OP_RMSNORM,     /* over the last dim; src: x, gamma; f: NORM_EPS */
    PDDE_OP_SOFTMAX,     /* over the last dim; i: SOFTMAX_CAUSAL (mask j > i of the last two dims) */
    PDDE_OP_CROSS_ENTROPY, /* src: logits [N,V], targets i32 [N] [, dloss: i: CE_DLOGITS]; scalar mean loss over targets >= 0 */
    PDDE_OP_EMBEDDING,   /* src: table [V,C], ids i32 [...]; out [...,C]. Vocab parallel (set by an SPMD
                            session; 0, 0 = a whole table): i: VOCAB_FIRST = the first id the table
                            holds, VOCAB_SIZE = the whole vocab; ids outside the table's rows give zero
                            rows */
    PDDE_OP_RESHAPE,     /* a view: same data, new shape */
    PDDE_OP_PERMUTE,     /* i: PERMUTE_DIM0 + d for d < ndim: the input dim output dim d takes */
    PDDE_OP_CONCAT,      /* i: CONCAT_AXIS; 2..PDDE_MAX_SRC inputs */
    PDDE_OP_SLICE,       /* i: SLICE_AXIS, SLICE_START; the output shape gives the length */
    PDDE_OP_SUM,         /* i: REDUCE_AXIS (-1: all), REDUCE_KEEPDIM */
    PDDE_OP_MEAN,        /* as SUM */
    PDDE_OP_DROPOUT,     /* f: DROPOUT_P; i: DROPOUT_SEED_LO, DROPOUT_SEED_HI, DROPOUT_COUNTER (set by the
                            executor each run); keep(i) = hash(seed, counter, i) >= p */
    PDDE_OP_CAST,        /* to the output dtype */
    PDDE_OP_ATTENTION,   /* fused causal attention of q, k, v [B,H,T,D] -> [B,H,T,D+1]: columns 0..D-1 the
                            output softmax(q k^T * scale, causal) v, column D each row's logsumexp (what
                            the backward recomputes the probabilities from); f: ATTENTION_SCALE.
                            Flash-attention style: keys in tiles with an online softmax, no [T,T].
                            q, k, v all f32, all bf16 or all f16 (then f32 accumulation, statistics
                            and softmax); the output f32. i: ATTENTION_QKV_D > 0: the packed form
                            (pdde_attention_qkv): src qkv [B,T,H*3*D] -> [B,T,H*D], each row's
                            logsumexp [B*H,T] after it in the node's memory (pdde_tensor_nbytes) */
    /* backward ops (appended by pdde_backward) */
    PDDE_OP_SUM_TO,      /* reduce src0 to this tensor's (broadcast-compatible) shape */
    PDDE_OP_EXPAND,      /* broadcast src0 to this tensor's shape, times f: SCALE */
    PDDE_OP_GELU_BACK,   /* src: x, dy */
    PDDE_OP_RELU_BACK,
    PDDE_OP_SILU_BACK,
    PDDE_OP_LAYERNORM_BACK,       /* src: x, gamma, dy -> dx; f: NORM_EPS (as are the next three) */
    PDDE_OP_LAYERNORM_BACK_GAMMA, /* src: x, dy -> dgamma */
    PDDE_OP_RMSNORM_BACK,         /* src: x, gamma, dy -> dx */
    PDDE_OP_RMSNORM_BACK_GAMMA,   /* src: x, dy -> dgamma */
    PDDE_OP_SOFTMAX_BACK,         /* src: y, dy */
    PDDE_OP_CROSS_ENTROPY_BACK,   /* src: logits, targets, dloss (scalar) -> dlogits. With the
                                     forward: i: VOCAB_SIZE > 0 = logits split on the vocab (their
                                     first column is VOCAB_FIRST); that form is run by the executor
                                     itself (cross-rank row reductions), a backend only says it
                                     does not support it */
    PDDE_OP_EMBEDDING_BACK,       /* src: base grad [V,C], ids, dy: base + scatter-add (in place);
                                     i: as the embedding's (ids of other rows are skipped) */
    PDDE_OP_SLICE_BACK,           /* src: dy; pads dy with zeros back to this shape; i: as SLICE's */
    PDDE_OP_DROPOUT_BACK,         /* src: dy; same mask as the forward (same params) */
    PDDE_OP_ATTENTION_BACK,       /* src: q, k, v, y (the forward's [B,H,T,D+1]), dy (its gradient) ->
                                     [3,B,H,T,D]: dq, dk, dv; f: ATTENTION_SCALE as the forward;
                                     packed (i: ATTENTION_QKV_D > 0): src qkv, y, dy [B,T,H*D] ->
                                     dqkv [B,T,H*3*D] */
    PDDE_OP_GRAD_ACCUM,           /* src: accumulator (persistent), g: acc += g (in place) */
    /* optimizer ops (appended by pdde_optimizer_*). Update ops write src0 (and their state) in place
     * and zero the gradient they consumed. f: UPDATE_LR (set by the executor each step),
     * UPDATE_WEIGHT_DECAY, UPDATE_CLIP (0 = off; with a gnorm_sq source, gradients are scaled by
     * clip / (|g| + 1e-6) when |g| > clip; a gnorm_sq that is not finite makes the update do
     * nothing: parameter, state and gradient unchanged), UPDATE_GRAD_SCALE (1/grad_accum_steps); i: UPDATE_STEP
     * t, 1-based (set by the executor). */
    PDDE_OP_GRAD_NORM_SQ,         /* src: grad [, previous partial sum]: partial + scale^2 * sum(g^2),
                                     scale = f: UPDATE_GRAD_SCALE */
    PDDE_OP_SGD_UPDATE,           /* src: param, grad, momentum [, gnorm_sq]; f: also SGD_MOMENTUM */
    PDDE_OP_ADAMW_UPDATE,         /* src: param, grad, m, v [, gnorm_sq]; f: also UPDATE_BETA1,
                                     UPDATE_BETA2, UPDATE_EPS */
    /* communication and device-boundary ops (distributed graph; see the planner) */
    PDDE_OP_COPY,                 /* to another device */
    /* reshard collectives (inserted by lowering where an op needs another layout of an input, see
     * "Distributed attributes") and run by the executor, never by a backend: their mesh axis, dims
     * and reduce op are the local program's, not op parameters. A gradient's reduction may start
     * early (asynchronously) and a PDDE_OP_COMM_WAIT (src: the collective) completes it. */
    PDDE_OP_ALLREDUCE,            /* partial -> whole */
    PDDE_OP_REDUCE_SCATTER,       /* partial -> split */
    PDDE_OP_ALLTOALL,             /* src0 split on one dim -> split on another instead */
    PDDE_OP_ALLGATHER,            /* split -> whole (with 2 srcs: the updated slices back into src0) */
    PDDE_OP_COMM_WAIT,
    /* between pipeline stages (inserted by lowering where a tensor moves to another mesh; run by the
     * executor): SEND starts sending src0 to the rank at the same place of the consumer's mesh, RECV
     * (no src) receives it */
    PDDE_OP_SEND,
    PDDE_OP_RECV,
    /* fused kernels: one pass where the unfused ops take two (the unfused graph is their reference) */
    PDDE_OP_BIAS_GELU,            /* src: x [..., N], bias [N]: gelu(x + bias) (pdde_bias_gelu) */
    PDDE_OP_BIAS_GELU_BACK,       /* src: x, bias, dy -> dy * gelu'(x + bias): the gradient of x + bias */
    /* Mixture-of-Experts routing (see "Mixture-of-Experts"). Row r of an expert-ordered buffer [R, C]:
     * expert e's rows start at its offset (dropless, i: MOE_CAPACITY 0: the running sum of the counts
     * before it, R = N*k; with a capacity: e * capacity, R = E * capacity, rows past its count zero);
     * within an expert, tokens in order (n, then j). i: MOE_EXPERTS = E where no source gives it. */
    PDDE_OP_MOE_TOPK,             /* src: logits [N,E] f32 [, bias [E]] -> i32 [N,k]: the k experts of
                                     largest score + bias (ties: the lower expert), best first;
                                     i: MOE_FLAGS (PDDE_MOE_SIGMOID: score = sigmoid, else softmax) */
    PDDE_OP_MOE_GATE,             /* src: logits, idx [N,k] -> weights [N,k]; i: MOE_FLAGS */
    PDDE_OP_MOE_GATE_BACK,        /* src: logits, idx, dweights -> dlogits [N,E]; i: MOE_FLAGS */
    PDDE_OP_MOE_COUNTS,           /* src: idx -> i32 [E]: tokens routed to each expert (before dropping) */
    PDDE_OP_MOE_DISPATCH,         /* src: x [N,C], idx [, w [N,k]] -> [R,C]: row (n,j) = x[n] (* w[n,j]) */
    PDDE_OP_MOE_COMBINE,          /* src: ye [R,C], idx [, w] -> [N,C]: sum_j (w[n,j] *) ye[row (n,j)] */
    PDDE_OP_MOE_COMBINE_BACK_W,   /* src: ye, idx, dy -> dw [N,k] = dot(dy[n], ye[row (n,j)]) */
    PDDE_OP_MOE_GROUPED_MATMUL,   /* src: x [R,K], w [E,K,M] (i: MOE_TRANS_B: [E,M,K]), idx -> [R,M]:
                                     each expert's rows times its own matrix, one op for all E */
    PDDE_OP_MOE_GROUPED_MATMUL_BACK_W, /* src: a [R,K], b [R,M], idx -> [E,K,M]: a_e^T b_e per expert */
    PDDE_OP_MOE_AUX_LOSS,         /* src: logits [N,E], counts i32 [E] -> [1]: E sum_e f_e P_e, f = counts /
                                     their sum, P = the mean over the rows of softmax(logits) */
    PDDE_OP_MOE_AUX_LOSS_BACK,    /* src: logits, counts, dloss [1] -> dlogits [N,E] */
    PDDE_OP_ROPE,                 /* rotary position embedding of x [B,T,H,D] (pdde_rope); f: ROPE_BASE, and
                                     ROPE_FACTOR, _LOW, _HIGH, _ORIGINAL (pdde_rope_llama3; FACTOR 0: none);
                                     i: ROPE_INVERSE 1 rotates by minus the angle (the backward) */
    PDDE_OP_COUNT
} pdde_op;


typedef enum {
    PDDE_TENSOR_INPUT = 1 << 0,      /* fed by the caller each step */
    PDDE_TENSOR_PARAM = 1 << 1,      /* trainable parameter */
    PDDE_TENSOR_STATE = 1 << 2,      /* optimizer state / gradient accumulator: persists across steps */
    PDDE_TENSOR_LOSS = 1 << 3,
    PDDE_TENSOR_OUTPUT = 1 << 4,     /* kept alive to the end of the step so the caller can read it */
    PDDE_TENSOR_VIEW = 1 << 5,       /* shares its src0's memory */
    PDDE_TENSOR_INPLACE = 1 << 6,    /* writes into its src0's memory */
    PDDE_TENSOR_CONST = 1 << 7,      /* a leaf filled with f: CONST_VALUE once */
    PDDE_TENSOR_GRAD = 1 << 8,       /* a parameter's gradient accumulator (STATE, not checkpointed) */
    PDDE_TENSOR_SPARSE = 1 << 9,     /* a batch's rows of a parameter-server table: a PARAM with a gradient
                                        that the optimizers skip and checkpoints leave out (pdde_sparse_*) */
    PDDE_TENSOR_SHADOW = 1 << 10,    /* a parameter's bf16/f16 copy under a compute dtype: kept across steps and
                                        rewritten by the parameter's update, so its cast runs only after the
                                        parameter was written some other way (a load, a write, the first step) */
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
    /* op parameters: read and written only by name (pdde_op_i32 / pdde_op_f32 with the PDDE_P_* of
     * pdde_extension.h); which names an op has is listed with the op above */
    int32_t iparams[8];
    float fparams[8];
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

const char *pdde_op_name(pdde_op op);

int64_t pdde_tensor_numel(const pdde_tensor *t);
/* numel x the dtype's size; a packed attention node (pdde_attention_qkv) also holds its rows' logsumexp */
size_t pdde_tensor_nbytes(const pdde_tensor *t);

/* ---------------------------------------------------------------------------------------------------
 * Graph building. All calls return NULL after an error; pdde_graph_status returns the first error and
 * pdde_last_error(ctx) its message (naming the op, the tensor and the shapes). */
pdde_status pdde_graph_init(pdde_context *ctx, pdde_graph **out);
/* Frees g. While a session of g lives, the graph (and its tensors, which the session's calls take) is
 * kept until pdde_session_free frees it; do not build on g after this call. */
void pdde_graph_free(pdde_graph *g);
pdde_status pdde_graph_status(const pdde_graph *g);
pdde_context *pdde_graph_context(const pdde_graph *g);
int pdde_graph_tensor_count(const pdde_graph *g);
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
/* Mixed precision, as a region like torch.autocast: matmuls and fused attentions (pdde_attention) built
 * while the compute dtype is PDDE_BF16 or PDDE_F16 convert their f32 inputs to it and accumulate and
 * return f32 (the attention's row statistics and softmax f32 too);
 * everything else (norms, softmax, the loss, the optimizer, the gradients it reads) stays f32, and the
 * parameters stay f32 masters (each is converted once per step, however many matmuls read it; the
 * gradient GEMMs read the same copies). PDDE_F32 (the default) ends the region. With PDDE_F16 the
 * optimizer adds dynamic loss scaling (pdde_session_loss_scale). Call before pdde_backward. */
pdde_status pdde_graph_set_compute_dtype(pdde_graph *g, pdde_dtype dt);

/* Leaves. A parameter starts as normal(0, init_std) for init_std > 0, or as PDDE_INIT_ZEROS (biases) or
 * PDDE_INIT_ONES (norm gains). The values depend on
 * the context's seed and the parameter's name only (not the build order), and are the same whatever
 * the plan: a rank holding a block of a split parameter (tensor parallel, ZeRO-3) starts from that block
 * of the one-process tensor. */
pdde_tensor *pdde_input(pdde_graph *g, const char *name, pdde_dtype t, int ndim, const int64_t *shape);
#define PDDE_INIT_ZEROS 0.0f
#define PDDE_INIT_ONES (-1.0f)
pdde_tensor *pdde_param(pdde_graph *g, const char *name, int ndim, const int64_t *shape, float init_std);

pdde_tensor *pdde_matmul(pdde_graph *g, pdde_tensor *a, pdde_tensor *b, int trans_a, int trans_b);
pdde_tensor *pdde_add(pdde_graph *g, pdde_tensor *a, pdde_tensor *b);
pdde_tensor *pdde_sub(pdde_graph *g, pdde_tensor *a, pdde_tensor *b);
pdde_tensor *pdde_mul(pdde_graph *g, pdde_tensor *a, pdde_tensor *b);
pdde_tensor *pdde_scale(pdde_graph *g, pdde_tensor *a, float s);
/* x + bias over the last dim (an add with broadcasting, named for readability). */
pdde_tensor *pdde_bias_add(pdde_graph *g, pdde_tensor *x, pdde_tensor *bias);
pdde_tensor *pdde_gelu(pdde_graph *g, pdde_tensor *x);
/* gelu(x + bias), bias [N] over x's last dim N, as one op: pdde_gelu(g, pdde_bias_add(g, x, bias)) in
 * one pass over x, and the pre-activation x + bias is never stored (the backward recomputes it). */
pdde_tensor *pdde_bias_gelu(pdde_graph *g, pdde_tensor *x, pdde_tensor *bias);
pdde_tensor *pdde_relu(pdde_graph *g, pdde_tensor *x);
pdde_tensor *pdde_silu(pdde_graph *g, pdde_tensor *x);
pdde_tensor *pdde_layernorm(pdde_graph *g, pdde_tensor *x, pdde_tensor *gamma, pdde_tensor *beta, float eps);
pdde_tensor *pdde_rmsnorm(pdde_graph *g, pdde_tensor *x, pdde_tensor *gamma, float eps);
/* Rotary position embedding (RoPE, as LLaMA) of x [B, T, H, D], D even: at position t (dim 1) each head's
 * pairs (i, i + D/2), i < D/2, are rotated by the angle t * base^(-2i/D) (the "rotate half" layout of
 * GPT-NeoX and Hugging Face's LLaMA; base 10000 there). In f32; linear in x. */
pdde_tensor *pdde_rope(pdde_graph *g, pdde_tensor *x, float base);
/* The same with LLaMA 3.1's frequencies for long contexts (Hugging Face's rope_type "llama3"): a pair
 * whose wavelength 2 pi / base^(-2i/D) exceeds original / low_freq turns factor times slower, one below
 * original / high_freq keeps its speed, and those between blend the two linearly in original / wavelength.
 * LLaMA 3.1 and 3.2: factor 8 or 32, low_freq 1, high_freq 4, original 8192. */
pdde_tensor *pdde_rope_llama3(pdde_graph *g, pdde_tensor *x, float base, float factor, float low_freq, float high_freq, float original);
pdde_tensor *pdde_softmax(pdde_graph *g, pdde_tensor *x, int causal);
/* Causal self-attention of q, k, v [B, H, T, D]: softmax(q k^T / sqrt(D), causal) v -> [B, H, T, D] f32.
 * Fused (PDDE_OP_ATTENTION and its backward): memory O(B*H*T*D), never the [B, H, T, T] scores. q, k, v
 * are f32, or all bf16 / all f16; under a compute dtype f32 ones are converted to it. */
pdde_tensor *pdde_attention(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v);
/* The same attention from matmul, scale, causal softmax and matmul (materialises [B, H, T, T] scores
 * and probabilities): the reference the fused op is checked against. */
pdde_tensor *pdde_attention_unfused(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v);
/* The same attention on q, k, v packed in qkv [B, T, H*3*D] (head-major: head h's q, k, v are columns
 * h*3D + [0, D), [D, 2D), [2D, 3D)), read in place -> [B, T, H*D] f32 (head h in columns h*D + [0, D)):
 * no slice or permute around it, and its backward writes the [B, T, H*3*D] gradient directly. */
pdde_tensor *pdde_attention_qkv(pdde_graph *g, pdde_tensor *qkv, int heads);
/* Both forms with each query's first key: query t of batch row b sees only keys starts[b, t] .. t (starts
 * i32 [B, T], clamped to [0, t]). Documents packed in one row kept apart (starts[b, t]: where t's document
 * begins; FlashAttention's variable-length batches) or a sliding window (t - W + 1). Still O(B*H*T*D)
 * memory; key tiles no query of a tile sees are skipped. */
pdde_tensor *pdde_attention_docs(pdde_graph *g, pdde_tensor *q, pdde_tensor *k, pdde_tensor *v, pdde_tensor *starts);
pdde_tensor *pdde_attention_qkv_docs(pdde_graph *g, pdde_tensor *qkv, int heads, pdde_tensor *starts);
/* Says that starts (an i32 leaf given to the two above) lets no query see more than its last `window` keys (a
 * sliding window): the cost model and the planner price the pairs the attention keeps, about T * window, not
 * the causal triangle. Changes no result. */
pdde_status pdde_attention_window(pdde_graph *g, pdde_tensor *starts, int window);
/* Mean cross-entropy of softmax(logits [N, V]) against targets (i32 [N]; a negative target is ignored). A
 * target >= V fails the run with PDDE_ERR_INVALID_ARG naming the op, the target and its position (on a
 * device, found when the step checks its loss, which such a target makes NaN). */
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
/* Renames t (under 64 bytes). An input, parameter or state must keep a name of its own in its graph:
 * pdde_session_init refuses a graph where two of them share one. */
pdde_status pdde_tensor_set_name(pdde_tensor *t, const char *name);
/* Keeps t's value readable after a run (pdde_session_read). Losses are outputs already. */
void pdde_mark_output(pdde_tensor *t);
/* Makes input t state the caller carries from step to step (a running statistic, a balancing bias
 * updated between steps, a frozen pretrained weight): checkpoints and elastic snapshots save and restore
 * it as they do parameters, so after a resume the caller reads its block back (pdde_session_read)
 * instead of starting over. It holds one value for every micro-batch of a step (an input otherwise has
 * one per micro-batch). */
void pdde_mark_state(pdde_tensor *t);

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
    int64_t total_steps;   /* cosine decays to min_lr_ratio * lr at total_steps (required: > warmup_steps) */
    float min_lr_ratio;
    int grad_accum_steps;  /* micro-batches per optimizer step; 0 = 1 (the loss is scaled by 1/n) */
} pdde_optimizer_params;
#define PDDE_OPTIMIZER_PARAMS_INIT {0, 0, 0, 0, 0, 0, 0, PDDE_LR_CONSTANT, 0, 0, 0, 0}

pdde_status pdde_optimizer_adamw(pdde_graph *g, const pdde_optimizer_params *p);
pdde_status pdde_optimizer_sgd(pdde_graph *g, const pdde_optimizer_params *p);
/* Learning rate of the optimizer at a (0-based) step under its schedule (p NULL: the defaults, as the
 * optimizers take NULL). */
float pdde_lr_at(const pdde_optimizer_params *p, int64_t step);

/* ---------------------------------------------------------------------------------------------------
 * Session: a compiled graph with its memory plan, run step by step. A session is used by one thread at a
 * time; sessions of one context may run on several threads at once, on one device or on several. */
typedef struct pdde_session pdde_session;

typedef enum {
    /* one forward, one backward: a stage keeps at most (stages - its index) micro-batches alive */
    PDDE_PIPELINE_1F1B = 0,
    /* all forwards, then all backwards: every micro-batch's activations alive at once */
    PDDE_PIPELINE_GPIPE = 1,
} pdde_pipeline_schedule;

typedef struct {
    int device;            /* default device for unplaced nodes (index in pdde_device_count); 0 = cpu */
    int no_memory_reuse;   /* 1: every tensor gets its own memory (debugging) */
    /* Nodes of layer l (pdde_graph_set_layer) run on layer_devices[l] (-1 = the default); copies are
     * inserted at every device boundary. */
    const int *layer_devices;
    int n_layer_devices;
    /* SPMD execution of a graph completed by pdde_complete_dist_attrs: each rank runs its partition
     * (local shapes) with reshard collectives where an op needs another layout of an input. Every rank
     * builds the same graph and passes the same params; world's ranks are the graph mesh's. Ranks whose
     * graphs, meshes or applied plans differ fail here, on every rank, with PDDE_ERR_MISMATCH. */
    pdde_comm *world;
    pdde_pipeline_schedule pipeline_schedule; /* pipeline stages: the order of a step's micro-batches */
    /* What reshard collectives of f32 tensors carry: PDDE_F32 (exact), PDDE_BF16 or PDDE_F16 (half the
     * bytes; a cast on each side). */
    pdde_dtype comm_dtype;
    /* Each gradient's reduction starts in backward once the gradient is final (1), or at the update
     * (-1). 0 = overlap when the host's ranks leave it a core to progress communication (env:
     * PDDE_OVERLAP_GRADIENTS=1 or 0 decides instead). */
    int overlap_gradients;
    /* pdde_session_init refuses a plan that needs more than the host's or a device's available memory
     * less this fraction (PDDE_ERR_OOM / PDDE_ERR_DEVICE_OOM, with the numbers). 0 = 0.1; < 0 = no
     * check. Host memory is MemAvailable and the cgroup limit, shared by the host's ranks.
     * Env: PDDE_MEMORY_HEADROOM (a fraction, or "off"), PDDE_MEMORY_AVAILABLE (bytes). */
    double memory_headroom;
    /* A node whose device does not run its op (supports_op) runs on the CPU with copies around it and
     * a one-line notice (in-place ops cannot move: an error). 1 = PDDE_ERR_UNSUPPORTED instead, as a
     * conformance suite wants. Env: PDDE_CPU_FALLBACK=0. */
    int no_cpu_fallback;
    /* A Chrome/Perfetto trace of every run (a lane per device, one for communication, one for the
     * schedule; wall-clock microseconds, so ranks line up), written when the session is freed; under
     * several ranks each writes trace.rank<R> (pdde-run --trace merges them); a process's later
     * sessions under PDDE_TRACE write trace.session<N> (N = 2, 3, ...). Tracing synchronizes
     * devices after each node, so spans are kernel times. NULL = env PDDE_TRACE. */
    const char *trace;
    /* Gradient buckets, as torch DDP's: consecutive data-parallel collectives of one kind, axis and
     * dtype share one collective on a flat buffer of at most this many bytes (pdde_lower_dump shows
     * them). 0 = 25 MiB; < 0 = one collective per tensor. */
    int64_t gradient_bucket_bytes;
    /* Allreduce buckets whose members are on a device of this implementation's backend run it on a
     * device buffer of their own (pdde_extension.h: NCCL's shape); NULL: through host staging. */
    const pdde_device_collectives_iface *device_collectives;
    /* A cluster pdde-bench measured on this machine (its device ids the context's device indices):
     * PDDE_PROFILE=device sets each op's time against its device's measured GEMM rate and memory
     * bandwidth (README "Checking a GPU"); NULL, or a device it did not measure: PDDE_PROFILE_PEAKS.
     * Read at pdde_session_init only. */
    const struct pdde_cluster *cluster;
} pdde_session_params;
#define PDDE_SESSION_PARAMS_INIT {0, 0, NULL, 0, NULL, PDDE_PIPELINE_1F1B, PDDE_F32, 0, 0, 0, NULL, 0, NULL, NULL}

/* Micro-batches: with the optimizer's grad_accum_steps M > 1, a step is M micro-batches. Either write
 * each one's inputs with pdde_session_write_micro and run PDDE_RUN_STEP (the session runs them all,
 * in the pipeline schedule when there are stages, then the update; the loss is their mean; FORWARD
 * likewise runs all M), or run FORWARD_BACKWARD M times (on what pdde_session_write wrote, which is
 * micro-batch 0) and then OPTIMIZER — not possible with pipeline stages, whose micro-batches must be
 * in flight together. */
typedef enum {
    PDDE_RUN_FORWARD = 1,           /* forward only (evaluation): no gradients */
    PDDE_RUN_FORWARD_BACKWARD = 3,  /* forward + backward: accumulates gradients (their sum; the update divides by grad_accum_steps) */
    PDDE_RUN_OPTIMIZER = 4,         /* apply the accumulated gradients, zero them, step += 1 */
    PDDE_RUN_STEP = 7,              /* one training step: every micro-batch forward + backward, the update */
} pdde_run_mode;

/* Compiles g (one live session per graph: free it before compiling g again): lowers it to this rank's
 * local program (the nodes the step needs, placed, with COPY nodes at device boundaries and, under
 * SPMD execution, local shapes and the communication; see pdde_lower_dump), plans memory and
 * allocates it. g itself is not changed: it can be compiled again, under another plan. Tensors built on g
 * afterwards are not part of this session (its calls refuse them); a later session of g has them. */
pdde_status pdde_session_init(pdde_graph *g, const pdde_session_params *params, pdde_session **out);
void pdde_session_free(pdde_session *s);
/* PDDE_ERR_NONFINITE: the loss, or the gradient norm when clipping, is NaN or infinite (see README
 * "Non-finite guard"); the update changed nothing and the step's gradients were dropped. */
pdde_status pdde_session_run(pdde_session *s, pdde_run_mode mode);
/* Copies between caller memory and a tensor's data (inputs, params, outputs, gradients; a read of another
 * intermediate is PDDE_ERR_STATE: the step reuses its memory, unless no_memory_reuse). Gradients hold
 * their sum over the PDDE_RUN_FORWARD_BACKWARD runs since the last update; an update (PDDE_RUN_STEP,
 * PDDE_RUN_OPTIMIZER) zeroes them, so read them before it. NULL t, src or dst:
 * PDDE_ERR_INVALID_ARG. nbytes must equal the bytes of t's block on this rank: pdde_tensor_nbytes(pdde_session_tensor(s, t))
 * (t's own size without SPMD execution). */
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
/* The learning rate the next optimizer step uses (the session's schedule: the graph's optimizer's,
 * or the one a checkpoint load kept; 0 without an optimizer). */
float pdde_session_lr(const pdde_session *s);
int64_t pdde_session_step(const pdde_session *s);  /* optimizer steps taken */
int64_t pdde_session_op_runs(const pdde_session *s, pdde_op op); /* nodes of op run so far (every run, micro-batch) */
/* Data-parallel collectives the last run issued (gradient reductions and ZeRO's gathers of updated
 * shards, early or at the update): one per gradient bucket, one per tensor outside a bucket. */
int pdde_session_gradient_collectives(const pdde_session *s);
/* Copies between device memory and gradient buckets' host buffers that the last run put on a device's
 * second stream, beside its backward (0: on the device's stream; PDDE_COPY_STREAM, README "GPU"). */
int pdde_session_stream_copies(const pdde_session *s);
/* Token rows the last run sent to other ranks in expert parallelism's exchanges (only the rows routed
 * to an expert cross: the counts go first, pdde_moe_dispatch_experts' padding stays home). */
int64_t pdde_session_exchanged_rows(const pdde_session *s);
/* Micro-batches this rank runs per step: grad_accum_steps, times its share under uneven data
 * parallelism (pdde_strategy_data_parallel_shares). */
int pdde_session_micro_batches(const pdde_session *s);
/* How many times the session has made the host wait for a device other than the CPU (a stream
 * synchronisation, or a read or write, which ends in one) since it was made. A step on one device
 * waits once, at its end, where it clips or scales the loss (its update kernels check the gradient
 * norm themselves, the host reads the loss and norm after the step); without a norm, or under several
 * ranks, it also waits for the loss and norm before its first update (README "Non-finite guard"). */
int64_t pdde_session_host_syncs(const pdde_session *s);
/* PDDE_PROFILE=device (README "Checking a GPU"): per run, averaged over the runs after the first (the
 * first alone while it is the only one). busy_ms is the union of the busiest device's node intervals
 * on its clock, span_ms from its first node's start to its last one's end; the rest on the host's. */
typedef struct {
    int64_t runs;         /* runs averaged */
    double wall_ms;       /* pdde_session_run's duration */
    double busy_ms, span_ms;
    double idle_pct;      /* 100 (wall - busy) / wall: the device waiting for the host, or the host for it */
    double host_issue_ms; /* from the run's start to its last node enqueued, less host_wait_ms */
    double ops;           /* device nodes (or multi-tensor groups) timed */
    double host_wait_ms, host_waits; /* the host's waits for a device before that last node (the run's end waits too) */
    /* what the timed nodes must move and compute, as the cost model counts them (each input read once,
     * the output written once; the FLOPs of GEMMs and fused attention, 0 for other ops) */
    double bytes, flops;
    /* where the devices' peaks come from: 0 none (no bound; also where one device has none), 1 the session's
     * cluster (measured), 2 PDDE_PROFILE_PEAKS, 3 some devices each */
    int peaks;
    double bound_ms;      /* the sum over nodes of max(bytes / peak bandwidth, FLOPs / peak GEMM rate of its dtype) */
    double over_bound_ms; /* the nodes' device ms less bound_ms */
} pdde_device_profile;
/* PDDE_ERR_STATE where the session does not time on the device */
pdde_status pdde_session_device_profile(const pdde_session *s, pdde_device_profile *out);
double pdde_session_device_op_ms(const pdde_session *s, pdde_op op); /* device ms of op's nodes per run (0: none) */

/* Dynamic loss scaling, on in a graph with f16 matmuls (pdde_graph_set_compute_dtype(g, PDDE_F16)),
 * with torch.cuda.amp.GradScaler's constants: the backward pass starts from d loss = scale (initially
 * 2^16) and the optimizer divides it out again. A step whose loss or gradients hold an infinity or a
 * NaN is skipped instead of failing with PDDE_ERR_NONFINITE: no parameter or optimizer state changes,
 * the gradients are dropped, the step count stays, and the scale is halved; after 2000 steps in a row
 * without one the scale doubles. Checkpoints keep the scale (the seed tensor "loss.grad_seed"). */
#define PDDE_LOSS_SCALE_INIT 65536.0f
#define PDDE_LOSS_SCALE_BACKOFF 0.5f
#define PDDE_LOSS_SCALE_GROWTH 2.0f
#define PDDE_LOSS_SCALE_INTERVAL 2000
typedef struct {
    int enabled;              /* the graph has f16 matmuls: the session scales its loss */
    float scale;              /* the scale the next step runs with (1 when not enabled) */
    int64_t skipped_steps;    /* steps skipped for an overflow, in this session */
    int64_t good_steps;       /* steps in a row since the last skip or growth */
    int last_skipped;         /* the last run with an update skipped it */
} pdde_loss_scale_stats;
pdde_status pdde_session_loss_scale(const pdde_session *s, pdde_loss_scale_stats *out);
/* Sets the scale (finite, > 0; PDDE_ERR_STATE when the session does not scale its loss). */
pdde_status pdde_session_set_loss_scale(pdde_session *s, float scale);
/* The targets the next runs' loss averages over: the valid ones (>= 0) of every micro-batch on every
 * data-parallel rank of a step. Each micro-batch then divides its summed cross-entropy by n / (the
 * step's micro-batches), so the loss and the gradients are the mean over those n targets, as one
 * process computes it, however they fall on the micro-batches (targets ignored for a prompt, padding).
 * 0 (the default): each micro-batch's mean over its own targets, the micro-batches weighing the same. */
pdde_status pdde_session_set_loss_tokens(pdde_session *s, int64_t n);

typedef struct {
    size_t arena_bytes;       /* the activation arena: peak of the memory plan */
    size_t activation_bytes;  /* the sum of all non-persistent tensors (what no reuse would take) */
    size_t param_bytes;       /* parameters (and the bf16/f16 copies their updates keep) */
    size_t grad_bytes;        /* gradient accumulators */
    size_t optimizer_bytes;   /* optimizer state */
    size_t input_bytes;
    int n_nodes;              /* nodes scheduled */
    /* what the session really holds from the backends' buffer_alloc, on all its devices: the
     * persistent buffer (parameters, gradients, optimizer state, inputs, with alignment) and in all */
    size_t persistent_allocated_bytes, allocated_bytes;
    /* the most activation bytes alive at once in the plan (arena_bytes less the arena's fragmentation;
     * per micro-batch in flight) */
    size_t activation_peak_bytes;
    /* host buffers for data leaving the rank or crossing devices: a copy of each send per micro-batch
     * alive, a bounce buffer per copy onto a device, the gradient buckets (malloc'ed, not in
     * allocated_bytes) */
    size_t transfer_bytes;
} pdde_memory_stats;
pdde_status pdde_session_memory(const pdde_session *s, pdde_memory_stats *out);
/* This rank's program as it will run: every scheduled node in order with its phase, device, local
 * shape and dist attr, the communication the session inserted (collectives with their mesh axis,
 * sends and receives with their peer), and under pipeline stages the micro-batch schedule. */
void pdde_session_dump(const pdde_session *s, FILE *f);
/* The same program for any rank of any plan, without running, communicating or allocating: g lowered
 * (pdde_complete_dist_attrs first, for world_size > 0) under params (NULL = defaults; world is not read) for rank
 * `rank` of world_size ranks (0 = one process). It prints what pdde_session_dump prints on that rank;
 * g is not changed. (params->overlap_gradients = 0, auto, is decided as a session on one host decides
 * it: world_size ranks of the graph context's threads each leave this machine a core.) f NULL: lowers
 * and prints nothing (whether the plan lowers on that rank). */
pdde_status pdde_lower_dump(const pdde_graph *g, const pdde_session_params *params, int world_size, int rank, FILE *f);
/* What pdde_session_memory reports for rank `rank` of that plan (g lowered as pdde_lower_dump does),
 * without a session: the same memory plan the session allocates by (planner/memplan.c), its gradient
 * buckets in device buffers where params' device collectives (or PDDE_DEVICE_COLLECTIVES) serve them. */
pdde_status pdde_predict_memory(const pdde_graph *g, const pdde_session_params *params, int world_size, int rank, pdde_memory_stats *out);
/* What the session holds of user tensor t on this rank: a tensor of its own with t's local shape and
 * dist attr (NULL: t is not in the step here, e.g. another pipeline stage's). Compiling never changes
 * g's tensors, so sizes for pdde_session_read/write come from here. */
const pdde_tensor *pdde_session_tensor(const pdde_session *s, const pdde_tensor *t);
/* This rank's program in run order: node i of n (the session's own tensors; NULL past the end). */
int pdde_session_node_count(const pdde_session *s);
const pdde_tensor *pdde_session_node(const pdde_session *s, int i);

/* ---------------------------------------------------------------------------------------------------
 * Checkpoints (core/checkpoint.c). Format (little-endian):
 *   "PDDECKPT" u32 version u32 n_tensors u64 step u64 data_position u64 rng[2]
 *   (version >= 3) the schedule: u32 kind, f32 lr, f32 min_lr_ratio, i64 warmup_steps, i64 total_steps
 *   per tensor: u16 name_len, name, u8 dtype, u8 ndim, i64 shape[ndim] (global), u16 attr_len, attr
 *   (the dist attr it was saved under, as pdde_dist_attr_str writes it; empty without one), u64 nbytes,
 *   data (the whole tensor, so it loads under any plan)
 *   u32 crc32 of everything before it.
 * Written to path.tmp, fsync'ed, then renamed over path: a crash mid-save leaves the old file. */
typedef struct {
    uint64_t data_position;  /* the data loader's position, restored by the caller */
    /* The learning-rate schedule (lr, schedule, warmup_steps, total_steps, min_lr_ratio) of the run
     * that saved the file (format version 3; older files have none). On load the session continues
     * with it, so a resumed run's learning rate goes on where it was, whatever the graph's optimizer
     * now says (a longer --steps does not re-stretch the cosine): out: the stored schedule and
     * schedule_differs = 1 when it is not the graph's (the caller should say so). In:
     * use_graph_schedule = 1 continues with the graph's schedule instead (the caller says it
     * changes). Saving ignores these. */
    pdde_optimizer_params schedule;
    int schedule_differs;
    int use_graph_schedule;
    /* In: 1 loads the weights only (parameters and persistent inputs) into a session, as a fine-tune
     * starts from a trained model: the optimizer's state, step, schedule and loss scale stay the
     * session's, data_position is left as it is, and the saving run's optimizer state is skipped
     * (its names need not be this model's). Every weight of the model must be there. */
    int weights_only;
} pdde_checkpoint_extra;

pdde_status pdde_checkpoint_save(pdde_session *s, const char *path, const pdde_checkpoint_extra *extra);
pdde_status pdde_checkpoint_load(pdde_session *s, const char *path, pdde_checkpoint_extra *extra);

/* ---------------------------------------------------------------------------------------------------
 * Data: a token loader with deterministic shuffling: text as bytes (vocabulary 256), or a tokenizer's ids. */
typedef struct pdde_data pdde_data;

/* Opens a text file (bytes are the tokens), a token file ("PDDETOK1" u64 count, i32 tokens; a negative
 * one, ~id, is token id that is no target: the loss ignores predicting it, as a prompt's) or one of
 * llm.c's token shards (a 1 KiB header, then GPT-2's tokens as u16 or LLaMA 3's as u32); or a glob
 * pattern's files of one of these formats, in name order ("data/fineweb_train_*.bin"). The tokens are
 * read from the files as batches need them (the files must not change meanwhile: a shrunk file is an
 * error), and a window never spans two files. */
pdde_status pdde_data_open(pdde_context *ctx, const char *path, pdde_data **out);
/* The part [begin, end) of the tokens, as fractions (e.g. 0.9..1.0 for validation). */
pdde_status pdde_data_open_part(pdde_context *ctx, const char *path, double begin, double end,
                                pdde_data **out);
void pdde_data_close(pdde_data *d);
int64_t pdde_data_token_count(const pdde_data *d);
/* 1 when d's files are text (their bytes the tokens), 0 when a tokenizer's ids. */
int pdde_data_is_text(const pdde_data *d);
/* The largest token id of d's part (255 or less for text): the vocabulary must be larger. The first
 * call reads every token (checking each); -1 with the error on d's context when one is bad. */
int32_t pdde_data_max_token(pdde_data *d);
/* Fills x and y (next-token targets; -1 where the next token is no target) [batch, T] with windows at
 * positions shuffled by seed (a new permutation each epoch); advances the position by batch. */
pdde_status pdde_data_next_batch(pdde_data *d, int batch, int T, uint64_t seed, int32_t *x, int32_t *y);
/* From now on the windows start only where a document does (token start_token, the last of a run of them: an end
 * token of the same id before it belongs to the document before; each file's positions found by reading it once,
 * 8 bytes a document), so a short document is never cut from its start (the end of one longer than a window is
 * never read); the position goes back to 0. */
pdde_status pdde_data_align_windows(pdde_data *d, int32_t start_token);
uint64_t pdde_data_position(const pdde_data *d);
void pdde_data_set_position(pdde_data *d, uint64_t pos);
/* Writes a text file's tokens as a token file. */
pdde_status pdde_data_write_tokens(pdde_context *ctx, const char *text_path, const char *out_path);

/* ---------------------------------------------------------------------------------------------------
 * Devices: what the backends found (ggml-style layering: backend family -> device -> stream / buffer
 * -> event; a new backend implements pdde_backend_iface of pdde_extension.h).
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
    int on_host_cores;       /* 1: it computes on this host's CPU cores (an OpenCL CPU device such as PoCL's) */
} pdde_device_props;

int pdde_device_count(pdde_context *ctx);
pdde_status pdde_device_get_props(pdde_context *ctx, int device, pdde_device_props *out);
/* The global index of the index-th device of a family, or -1. */
int pdde_device_find(pdde_context *ctx, const char *backend, int index);

int pdde_backend_count(pdde_context *ctx);
const char *pdde_backend_name(pdde_context *ctx, int backend);
/* PDDE_OK if the family is available; else its status and, in *why, the reason ("no OpenCL ICD"). */
pdde_status pdde_backend_status(pdde_context *ctx, int backend, const char **why);


/* ---------------------------------------------------------------------------------------------------
 * Communication (comm/): a bootstrap key-value store, rank discovery from launcher environments, a
 * transport plugin interface (UCX built in) and communicators with collectives.
 *
 *     pdde_comm *world;  pdde_comm_init(ctx, NULL, &world);        (rank/size/store from the env)
 *     pdde_comm_allreduce(world, grad, grad, n, PDDE_F32, PDDE_REDUCE_AVG);
 *     pdde_comm *dp;     pdde_comm_split(world, rank % tp, rank, &dp);   (one mesh axis)
 *
 * Rules: collectives on a communicator are called in the same order by all its ranks; a communicator
 * is used by one thread at a time (pdde_comm_abort excepted; point-to-point calls and test/wait of their
 * requests may come from several threads at once); every blocking call has a timeout.
 * Failure semantics: a timeout, a lost peer or an abort poisons the world communicator and every
 * communicator split from it: pending and future operations on them return PDDE_ERR_PEER_LOST,
 * PDDE_ERR_TIMEOUT or PDDE_ERR_ABORTED (on every rank, within params.peer_timeout_s of the failure);
 * recovery is pdde_comm_free and a new pdde_comm_init.
 * This section is compiled when pdde is built with UCX (PDDE_HAVE_UCX) and without PDDE_NO_COMM. */

/* The bootstrap store: string keys, byte-string values; built in (TCP) or any backend that fills
 * pdde_store_iface (pdde_extension.h) and is wrapped by pdde_store_wrap. */
typedef struct pdde_store pdde_store;
typedef struct pdde_store_iface pdde_store_iface;

/* The job secret. Every client of the built-in store and every transport connection proves it by an
 * HMAC-SHA256 challenge-response before anything is served. Looked up in this order: PDDE_JOB_SECRET
 * (the text itself, 16 to 256 bytes), PDDE_JOB_SECRET_FILE (a regular file of this user, mode 0600 or
 * stricter), then the secret this process made: the first store server started without one in the
 * environment makes a random one, which its own clients and the processes it forks then use (pdde-run
 * passes its secret to the ranks in PDDE_JOB_SECRET). Never put it on a command line. Under mpirun and
 * srun see comm/README.md. */
/* Writes 64 random hex characters and a NUL to out (cap >= 65). */
pdde_status pdde_job_secret_generate(pdde_context *ctx, char *out, size_t cap);
/* The primitives the handshakes use (FIPS 180-4 SHA-256, RFC 2104 HMAC), for tests and for deriving
 * secrets. */
void pdde_sha256(const void *data, size_t n, unsigned char out[32]);
void pdde_hmac_sha256(const void *key, size_t key_len, const void *data, size_t n, unsigned char out[32]);

/* Wraps a backend (etcd, ...): the store owns impl and closes it in pdde_store_close. */
pdde_status pdde_store_wrap(pdde_context *ctx, const pdde_store_iface *iface, void *impl, pdde_store **out);
/* A client of the built-in TCP store at "host:port", retrying the connection for up to timeout_s
 * (0 = 30 s) so that ranks may start before the server. */
pdde_status pdde_store_connect(pdde_context *ctx, const char *addr, double timeout_s, pdde_store **out);
/* The same with an explicit secret (NULL: the job secret). PDDE_ERR_AUTH when either side fails to
 * prove it (the server also proves it to the client, so a squatter on the port is found out). */
pdde_status pdde_store_connect_secret(pdde_context *ctx, const char *addr, const char *secret, double timeout_s,
                                      pdde_store **out);
void pdde_store_close(pdde_store *s);
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
/* Limits keep one client from stalling or exhausting the store: each gets an error naming the limit
 * it hit; one that takes none of a pending reply for stall_timeout_s is dropped. */
typedef struct {
    const char *addr;            /* "host:port"; NULL = "127.0.0.1:0". 0.0.0.0 opens it to every host:
                                    then only the secret keeps others out */
    const char *secret;          /* NULL: the job secret (made for this process if there is none) */
    size_t max_value_bytes;      /* 0 = 16 MiB per value */
    size_t max_total_bytes;      /* 0 = 512 MiB: keys, values, buffers and pending replies together */
    size_t max_client_bytes;     /* 0 = 64 MiB of keys and values made by one client */
    int max_clients;             /* 0 = 1024 connections */
    double auth_timeout_s;       /* 0 = 5: a connection that has not proved the secret by then is closed */
    double stall_timeout_s;      /* 0 = 10 */
} pdde_store_server_params;
#define PDDE_STORE_SERVER_PARAMS_INIT {NULL, NULL, 0, 0, 0, 0, 0, 0}
pdde_status pdde_store_server_init_params(pdde_context *ctx, const pdde_store_server_params *params,
                                          pdde_store_server **out);
int pdde_store_server_port(const pdde_store_server *srv);
/* The clients connected now (authenticated ones). */
int pdde_store_server_n_clients(const pdde_store_server *srv);
/* The first failure notice the store received (the first value of a key ending in "/failed", set by a
 * rank or by the store for a rank that died or stopped answering), with why the store set it; 1 if
 * there is one. A launcher names the root cause of a failed job with it. */
int pdde_store_server_first_failure(pdde_store_server *srv, char *buf, size_t cap);
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

/* The transport a communicator runs on: UCX built in, or any that fills pdde_transport_iface
 * (pdde_extension.h). */
typedef struct pdde_transport_iface pdde_transport_iface;

/* The built-in UCX transport (UCP tag API). Shared memory (posix, sysv, cma) then TCP by default;
 * UCX_* environment variables (UCX_TLS, UCX_NET_DEVICES, ...) override pdde's choices. */
const pdde_transport_iface *pdde_transport_ucx(void);

/* Communicators (pdde_comm, declared with the context) and collectives. */
typedef struct pdde_comm_request pdde_comm_request;

typedef enum { PDDE_REDUCE_SUM = 0, PDDE_REDUCE_AVG, PDDE_REDUCE_MAX, PDDE_REDUCE_MIN } pdde_reduce_op;

/* Algorithm choice (allreduce, reduce_scatter, allgather, broadcast, reduce). AUTO picks by message
 * size and topology: recursive doubling / trees for small messages, rings and pipelined chains for
 * large ones, two-level (intra-host, then inter-host) for allreduce when ranks span hosts; on a
 * communicator whose ranks are all on one host, allreduce, reduce_scatter, allgather and broadcast go
 * through a shared-memory segment instead (pdde_comm_last_algo "shm"; PDDE_COMM_SHM=0 turns it off). */
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
    double timeout_s;            /* blocking collectives, and init unless init_timeout_s; 0 = PDDE_COMM_TIMEOUT or 300 */
    double peer_timeout_s;       /* bound on failure detection; 0 = 5 */
    pdde_comm_algo algo;         /* 0 = auto; the env PDDE_COMM_ALGO (ring, recursive, two_level) too */
    pdde_mem_kind mem_kind;      /* where the buffers passed to collectives live; host only for now */
    const pdde_transport_iface *transport; /* NULL = UCX */
    int no_progress_thread;      /* 1: non-blocking operations progress only inside test/wait */
    const char *host_id;         /* NULL: PDDE_HOST_ID or hostname + network namespace */
    double init_timeout_s;       /* forming the world (store, connections, shared memory); 0 = timeout_s */
} pdde_comm_params;
#define PDDE_COMM_PARAMS_INIT {NULL, 0, 0, NULL, 0, 0, PDDE_ALGO_AUTO, PDDE_MEM_HOST, NULL, 0, NULL, 0}

/* Collective over all ranks: reads the environment (or params), meets the others through the store,
 * connects every pair, exchanges host ids. */
pdde_status pdde_comm_init(pdde_context *ctx, const pdde_comm_params *params, pdde_comm **out);
/* Collective over comm: ranks with the same color form a sub-communicator, ordered by (key, rank);
 * color < 0 (PDDE_COMM_NO_COLOR) gives *out = NULL. Sub-communicators share the parent's connections
 * and must be freed before their world. */
#define PDDE_COMM_NO_COLOR (-1)
pdde_status pdde_comm_split(pdde_comm *comm, int color, int key, pdde_comm **out);
/* Local (no communication). Operations still pending on comm end with PDDE_ERR_ABORTED; requests of
 * comm must be freed before it. A clean leave: ranks still running wait for this one until
 * PDDE_COMM_TIMEOUT; a rank giving up on an error of its own calls pdde_comm_abort first. */
void pdde_comm_free(pdde_comm *comm);
int pdde_comm_rank(const pdde_comm *comm);
int pdde_comm_size(const pdde_comm *comm);
int pdde_comm_host_count(const pdde_comm *comm);
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
/* Block r of sendbuf (count elements) goes to rank r; block r of recvbuf comes from rank r. In place
 * (sendbuf == recvbuf, alltoallv: the same counts and displacements) only where all ranks share a host
 * (elsewhere PDDE_ERR_INVALID_ARG). */
pdde_status pdde_comm_alltoall(pdde_comm *c, const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t);
/* Counts and displacements in elements, one per rank. Both blocking calls run hierarchically where
 * comm spans several hosts with the same number (> 1) of its ranks on each: within each host, then
 * one message per host pair and local index, then a local permutation (the same result, bit for
 * bit). PDDE_COMM_A2A_HIER=1: always there, =0: never; unset: when a rank pair's mean message is at
 * most PDDE_COMM_A2A_HIER_BYTES(hosts, ranks a host) bytes (alltoallv agrees on it with a sum first);
 * the MoE cost model prices the exchange by the same rule. The non-blocking calls run flat. */
#define PDDE_COMM_A2A_HIER_BYTES(hosts, local) (50e3 / (1.0 + 3.0 * (hosts) * (local) / (((hosts) - 1.0) * ((local) - 1.0))))
pdde_status pdde_comm_alltoallv(pdde_comm *c, const void *sendbuf, const size_t *sendcounts,
                                const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
                                const size_t *rdispls, pdde_dtype t);
pdde_status pdde_comm_barrier(pdde_comm *c);
/* Zeroed memory the other ranks on this host read directly (no system call) when it is an all-to-all's
 * send buffer; freed with pdde_comm_buffer_free (not free()), usable with every communicator. */
pdde_status pdde_comm_buffer_alloc(pdde_comm *c, size_t bytes, void **out);
void pdde_comm_buffer_free(void *buf);
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

/* ---------------------------------------------------------------------------------------------------
 * Distributed attributes (planner/: the unified distributed graph; Paddle's semi-automatic
 * auto-parallel). A program describes its ranks as process meshes, annotates a few tensors (inputs,
 * parameters, optimizer state) with pdde_shard or a strategy helper, and pdde_complete_dist_attrs gives every
 * tensor of the graph a dist attr through per-op SPMD rules, and every op the attr it requires of
 * each input. Where a producer's attr and a consumer's requirement differ, the executor reshards:
 * partial -> replicated = allreduce, partial -> split = reduce_scatter, split -> replicated =
 * allgather, replicated -> split = a local slice, split on another dim = alltoall, another mesh =
 * send/recv. Completion is pure graph analysis: no process, device or data is needed.
 *
 *     const pdde_mesh *mesh = pdde_mesh_create(g, 2, (int[]){2, 4}, (const char *[]){"dp", "tp"}, NULL);
 *     pdde_strategy_data_parallel(g, mesh, "dp");
 *     pdde_strategy_tensor_parallel_linear(g, w, b, mesh, "tp", PDDE_TP_COLUMN);
 *     pdde_complete_dist_attrs(g);
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
pdde_status pdde_complete_dist_attrs(pdde_graph *g);
/* The attr node requires of its k-th input (NULL before completion, for leaves, or k out of range). */
const pdde_dist_attr *pdde_op_input_dist_attr(const pdde_graph *g, const pdde_tensor *node, int k);
/* The conflicts the last completion resolved, and the message of the i-th ("node, input, why"). */
int pdde_complete_conflict_count(const pdde_graph *g);
const char *pdde_complete_conflict(const pdde_graph *g, int i);
/* "mesh[2,2] dims[dp,-1,tp] partial{tp}" (partial{dp:avg} for a pending mean, avg{dp} for a local
 * mean, "unannotated" without mesh); returns what snprintf would. */
int pdde_dist_attr_str(const pdde_dist_attr *a, char *buf, size_t n);
/* A readable program: every node with its attr, the attrs it requires of its inputs where they differ
 * from what the producer gives (with the reshard that implies), and the conflicts. */
void pdde_graph_dump_dist(const pdde_graph *g, FILE *f);

/* Strategies: helpers that emit the annotations of common parallelisms (they only call pdde_shard,
 * merging with what is already annotated, so they compose: data parallel, then ZeRO or tensor
 * parallel, then pdde_complete_dist_attrs). */
/* Every input's dim 0 (the batch) split over axis; unannotated parameters replicated on mesh. */
pdde_status pdde_strategy_data_parallel(pdde_graph *g, const pdde_mesh *mesh, const char *axis);
/* Uneven data parallelism, for devices of different speeds: index i of axis (of size n) runs
 * shares[i] x grad_accum_steps micro-batches per step, each of the graph's micro-batch shape (local
 * shapes stay alike), and the update scales the reduced gradients by n / (grad_accum_steps x the sum
 * of shares), so that a step equals one process's on all those micro-batches (the mean loss over
 * every sample). Call after pdde_strategy_data_parallel; shares[i] >= 1, n of them. */
pdde_status pdde_strategy_data_parallel_shares(pdde_graph *g, const pdde_mesh *mesh, const char *axis, const int *shares);
/* Data parallelism in groups: the batch split over axis (pdde_strategy_data_parallel) inside each
 * group, the groups along group_axis each training on a batch of its own (each writes its own inputs).
 * The graph's tensors are a group's: replicated along group_axis in their layout, holding that group's
 * values, and whatever reduces the batch over axis (a loss, a weight gradient, MoE counts) is pending
 * over group_axis too, so gradients are averaged over both axes. A tensor split over axis (MoE experts)
 * is then split inside each group and replicated over the groups: expert parallelism inside data
 * parallelism. */
pdde_status pdde_strategy_data_parallel_groups(pdde_graph *g, const pdde_mesh *mesh, const char *group_axis, const char *axis);
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
 * two layouts of the ranks on the devices, micro-batch counts, interleaved stages, ZeRO stages, f32 or
 * bf16 collectives, recompute per layer (the fewest layers of each stage that make it fit) and, where
 * data-parallel indices' devices differ in speed, uneven batch shares (pdde_plan.shares), where
 * each rank has a second device (place_*), the middle layers placed on it (in every stage), cuts the
 * layers (ids of pdde_graph_set_layer) into pipeline stages sized by each stage's devices, and
 * predicts each candidate's step time and per-device memory from the graph's work per layer and the
 * devices' speeds, memories and links. Reads the symbolic graph only (build it at any size).
 * pdde_plan_auto / pdde_plan_apply (after the cluster object) are a program's entry points: choose, then run. */
#define PDDE_PLAN_MAX_STAGES 64
#define PDDE_PLAN_MAX_SHARES 16 /* data-parallel degrees a plan may give uneven shares */

typedef struct {
    int n_devices;
    const double *flops;        /* [n] effective FLOP/s of each device on the model's GEMMs */
    const double *mem_bw;       /* [n] B/s of each device's memory (the other ops) */
    const double *memory;       /* [n] bytes each device may use */
    const int *host;            /* [n] host id of each device; NULL = one host */
    double intra_bw, intra_lat; /* a link between devices of one host: B/s, s (bandwidth 0: none) */
    double inter_bw, inter_lat; /* between hosts (bandwidth 0: none) */
    const double *op_latency;   /* [n] s: the least time any op takes there (dispatch, launch); NULL = 0 */
    /* Device placement (place_flops NULL: none): a second device each rank may run layers on, beside
     * its own (a host's OpenCL or GPU device next to the CPU, as gpt --blocks-on uses it): its FLOP/s,
     * B/s and bytes ([n]; flops 0: that rank has none), its backend (what a plan's place names) and
     * the link the copies at the placement's boundaries cross (B/s, s). The search then also tries
     * plans whose middle layers (all but the first and the last) run there, in each stage that holds them. */
    const double *place_flops, *place_mem_bw, *place_memory;
    char place_backend[16];
    double place_bw, place_lat;
    /* [n] each device's backend ("cpu", "opencl", "cuda", "level_zero": pdde_device_spec.backend); NULL =
     * every one "cpu". What lowering does differs by it: ZeRO-3's gathers on CUDA and Level Zero memory
     * stay blocking unless PDDE_ZERO3_PREFETCH=1, so the search hides them behind compute only where
     * lowering prefetches them. */
    const char *const *backend;
    /* [n] each device's index among the cluster's devices (in machine order) where several stand for
     * copies of one (pdde_plan_devices_init_machine: the ranks' devices); NULL: device i is the i-th */
    const int *cluster_device;
} pdde_plan_devices;

struct pdde_plan;
struct pdde_cluster;
typedef struct {
    int64_t batch;       /* the global batch the graph was built with (required) */
    int n_layers;        /* layer ids 0..n_layers-1; 0 = from the graph */
    int tp_divisor;      /* tensor-parallel degrees must divide this (e.g. attention heads); 0 = any */
    int max_micro;       /* 0 = 64 */
    int no_tp, no_pp, no_zero, no_recompute; /* 1 leaves a dimension out of the search */
    int overlap_dp;      /* 1: data-parallel gradient reductions overlap backward (spare cores, GPUs) */
    int use_all_devices; /* 1: only plans on every device (a job whose ranks are all started) */
    int no_interleave, no_bf16_comm, no_stage_blocks; /* 1 leaves interleaved stages, bf16 collectives,
                                                       * the stage-block layout out of the search */
    /* Simulation of the plans' real programs (planner/simulate.c) instead of the analytic estimate,
     * when both are set: cluster holds the devices of pdde_plan_devices (in its order; one device of a
     * one-machine cluster may stand for every rank), and build builds a plan's training graph into an
     * empty graph (annotated and completed, as its sessions compile it; e.g. gpt_plan_build).
     * pdde_plan_evaluate then simulates the plan (every rank lowered, the cluster's measured curves and
     * collectives, memory as the sessions allocate it); pdde_plan_search ranks the best plans its
     * estimate finds (max_plans of them) by simulation. */
    const struct pdde_cluster *cluster;
    pdde_status (*build)(pdde_graph *g, const struct pdde_plan *plan, void *user);
    void *build_user;
} pdde_plan_params;
#define PDDE_PLAN_PARAMS_INIT {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, NULL, NULL, NULL}

/* A plan: dp x tp x pp ranks on a [dp, tp, pp] mesh (pp innermost: mesh rank r on the r-th device used,
 * in the devices' order, unless stage_blocks), micro-batches per step, ZeRO stage over dp, recompute,
 * interleaved runs per stage, the layers of each stage, the schedule and what collectives carry. */
typedef struct pdde_plan {
    int dp, tp, pp, micro, zero, recompute, chunks; /* recompute: 1 = every layer (else recompute_layers) */
    int stage_first[PDDE_PLAN_MAX_STAGES + 1]; /* stage s runs layers [stage_first[s], stage_first[s+1]) */
    double step_s;      /* predicted step time (for a rejected plan: had it fitted) */
    double bubble_s;    /* of which the pipeline fills and drains */
    double peak_bytes;  /* predicted memory of the fullest device */
    int peak_device;
    char why[160];      /* a rejected plan: why it does not fit ("out of memory on device 3 ..."); else "" */
    pdde_pipeline_schedule schedule; /* 1F1B (default) or GPipe (never faster, more memory: not searched) */
    pdde_dtype comm_dtype;           /* what the collectives carry: PDDE_F32 (0) or PDDE_BF16 */
    /* with recompute 0: stage s recomputes its first recompute_layers[s] layers in backward (the
     * search picks the fewest that make the stage fit); chunks > 1: 0 or all */
    int recompute_layers[PDDE_PLAN_MAX_STAGES];
    /* 1: stage s runs on the s-th block of dp x tp devices (in the devices' order; mesh rank
     * ((d * tp) + t) * pp + s is the process on device s * dp * tp + d * tp + t), so that on a cluster
     * of mixed machines a stage's devices are alike; 0: pp innermost (mesh rank r on device r) */
    int stage_blocks;
    /* uneven data parallelism (devices of different speeds): dp index i runs shares[i] x micro
     * micro-batches per step (pdde_strategy_data_parallel_shares), each of batch / (micro x the sum
     * of shares) rows; all 0 = equal shares (every dp index micro micro-batches of batch / (dp x micro)).
     * With stages, each pipeline runs its count. ZeRO 2 and 3 reduce or gather in every micro-batch: a
     * smaller share first runs phantom micro-batches of those collectives only (one stage, whole steps) */
    int shares[PDDE_PLAN_MAX_SHARES];
    /* device placement in each rank: layers [place_first, place_last) run on the rank's device of
     * backend place ("opencl"; "" = none: every layer on the rank's own device), with copies at the
     * boundaries; with stages each stage places those of its layers; place_last 0 = all but the first
     * and the last layer (a model's blocks between its embedding and its head). Text: place=opencl
     * (the blocks), place=opencl:1-4 (layers 1..4). No chunks, no recompute, equal shares. */
    char place[16];
    int place_first, place_last;
    /* Mixture-of-Experts models (pdde_moe_*): the experts split over ep ranks (ep = dp with tp 1: the
     * dp axis, tokens exchanged all-to-all; ep dividing dp: groups of ep consecutive dp ranks, the
     * tokens over all dp ranks, pdde_strategy_data_parallel_groups, each expert split over tp if
     * ep < dp, ep != tp; ep = tp: the tp axis); 0 or 1 =
     * every rank holds every expert. The search tries each where it divides the experts, by
     * pdde_moe_cost_estimate on params->cluster (without one: ep 1 only). Text: ep=2; ep=tp (the tp
     * axis); ep=dp:2 (dp ranks even where 2 = tp). */
    int ep;
    int ep_dp; /* 1: ep = tp > 1 counts dp ranks (groups of ep of them beside tp), not the tp axis */
} pdde_plan;

/* Fills plans[0..*n_fit) with the fastest plans that fit, fastest first, then
 * plans[*n_fit..*n_fit + *n_rejected) with the fastest that do not fit and why. PDDE_ERR_NO_PLAN
 * (with the closest plan's reason in the message) when nothing fits. */
pdde_status pdde_plan_search(pdde_graph *g, const pdde_plan_devices *devices, const pdde_plan_params *params,
                             pdde_plan *plans, int max_plans, int *n_fit, int *n_rejected);
/* Predicts one plan (plan->stage_first all 0: an even cut), on its dp*tp*pp fastest devices, as the
 * search would, with its schedule, comm_dtype, recompute (or recompute_layers), layout and placement
 * (place: devices must have a second device of that backend; no chunks, no recompute): fills
 * step_s, bubble_s, peak_bytes, peak_device and why ("" when it fits). */
pdde_status pdde_plan_evaluate(pdde_graph *g, const pdde_plan_devices *devices, const pdde_plan_params *params, pdde_plan *plan);
/* Re-planning after the devices changed (a device lost or added; elasticity): the best plan for g on
 * every one of `devices` (the changed set), as pdde_plan_search finds it. The old plan (NULL: none)
 * is kept, evaluated anew, when it uses exactly that many devices, fits and is within 1% of the best
 * (changing plans costs resharding the state). PDDE_ERR_NO_PLAN when nothing fits. */
pdde_status pdde_plan_replan(pdde_graph *g, const pdde_plan_devices *devices, const pdde_plan_params *params, const pdde_plan *old,
                             pdde_plan *out);
/* "dp=2,tp=1,pp=2,mb=4,zero=1,recompute=0[,chunks=2][,stages=3:3][,rc=1:0][,comm=bf16][,sched=gpipe]
 * [,blocks=1][,shares=3:1][,place=opencl[:1-5]][,ep=2|tp|dp:2]" (rc: layers recomputed per stage, written when some but
 * not all are; shares: micro-batch shares of the dp indices, dp of them; ep=N equal to tp > 1 reads as ep=tp);
 * returns what snprintf would (-1 and buf empty when p is NULL, or buf NULL with n > 0). */
int pdde_plan_str(const pdde_plan *p, char *buf, size_t n);
/* Parses that form (keys in any order, missing ones 1 or 0 / f32 / 1f1b; stages = layers per stage).
 * PDDE_ERR_INVALID_ARG on bad text, with out->why naming the key and what it expected ("plan text:
 * zero: want 0, 1, 2 or 3, got '5'"; the rest of *out zero), also for NULL text. */
pdde_status pdde_plan_parse(const char *text, pdde_plan *out);

/* The planner for a program, in two calls. pdde_plan_auto: the fastest plan that fits for training g
 * (a forward graph built at params->batch, the global batch, whose repeated blocks carry layer ids)
 * on the cluster's devices, timed at g's largest GEMM; PDDE_ERR_NO_PLAN names why nothing fits.
 * pdde_plan_apply: runs a plan on g, built again for one micro-batch (batch / plan->micro rows; the
 * same graph when micro is 1; with shares, dp x batch / (micro x the sum of shares) rows, dp index i
 * running shares[i] x micro of them): annotates it (a [dp, tp, pp] mesh; data parallel; in each layer the
 * GEMMs with a 2-D weight parameter alternately column- and row-parallel with their biases; the
 * stage cuts or interleaved runs; recompute per layer), appends backward (of loss) and AdamW (opt,
 * grad_accum_steps = plan->micro), ZeRO, completes it and, with out, compiles it with params (its
 * world has the plan's dp x tp x pp ranks) under the plan's schedule and comm_dtype. */
pdde_status pdde_plan_auto(pdde_graph *g, const struct pdde_cluster *cluster, const pdde_plan_params *params, pdde_plan *plan);
/* How a program runs a plan (pdde_plan_apply does; a program annotating its graph itself, as
 * examples/gpt.h does, calls them). pdde_plan_process_of_rank: the process (the device in the order the plan
 * was made for) running rank mesh_rank of the plan's [dp, tp, pp] mesh: mesh_rank itself, or with
 * stage_blocks the member of stage s's block (-1: no such rank). pdde_plan_layer_recomputed: 1 when the plan
 * recomputes layer `layer` of the n_layers it cuts into stages (stage_first, or an even cut when it has
 * none): every layer with recompute 1, else the first recompute_layers[s] of stage s. */
int pdde_plan_process_of_rank(const pdde_plan *p, int mesh_rank);
int pdde_plan_layer_recomputed(const pdde_plan *p, int n_layers, int layer);
/* 1 when the plan places layer `layer` (of n_layers) on each rank's device of backend p->place. */
int pdde_plan_layer_on_device(const pdde_plan *p, int n_layers, int layer);
pdde_status pdde_plan_apply(pdde_graph *g, const pdde_plan *plan, pdde_tensor *loss, const pdde_optimizer_params *opt,
                            const pdde_session_params *params, pdde_session **out);


/* ---------------------------------------------------------------------------------------------------
 * Unified cluster object (planner/cluster.c). Machines ->
 * devices -> links, heterogeneous by default: every device names a spec (its model's measured speed),
 * and machines may differ in device kind, count, memory and speed. Units are SI: bytes, seconds, B/s,
 * FLOP/s. The JSON schema is in planner/README.md; pdde-bench measures a machine and writes one.
 *
 *     pdde_cluster *c;  pdde_cluster_load(ctx, "cluster.json", &c);   (or pdde_cluster_detect)
 *     pdde_cluster_save(ctx, c, "copy.json");                         (the same bytes back)
 *     pdde_cluster_free(c);
 *
 * The struct is public (tools and the planner read it; a program may build one with the _add calls).
 * Its arrays are owned by the cluster and freed by pdde_cluster_free. */

/* Op classes of the cost model: each has its own measured time curve on a device. */
typedef enum {
    PDDE_OPCLASS_GEMM = 0,    /* matmul: a FLOP/s table by (m, n, k) */
    PDDE_OPCLASS_ELEMENTWISE, /* add, gelu, dropout, casts, copies, ...: seconds by bytes touched */
    PDDE_OPCLASS_ROW,         /* layernorm, softmax, cross-entropy, reductions: seconds by bytes */
    PDDE_OPCLASS_ATTENTION,   /* the causal softmax of attention scores and its backward: seconds by bytes */
    PDDE_OPCLASS_EMBEDDING,   /* lookups and their scatter-add backward: seconds by bytes */
    PDDE_OPCLASS_OPTIMIZER,   /* update ops and the gradient norm: seconds by bytes */
    /* Ops whose time is not their bytes on a CPU; without a curve of their own a class times its ops
     * by the curve in brackets (cluster files from before these classes predict as they did). */
    PDDE_OPCLASS_LOSS,           /* cross-entropy and its backward: an exp per logit, 3-4 passes a row [row] */
    PDDE_OPCLASS_GELU,           /* the GELU family: a tanh per element [elementwise] */
    PDDE_OPCLASS_ROW_BACKWARD,   /* layernorm / rmsnorm backward and their gamma gradients: 2-3 passes a row [row] */
    PDDE_OPCLASS_FUSED_ATTENTION, /* the non-GEMM work of a CPU fused attention, by its softmax bytes [attention] */
    PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD, /* that of its backward, which recomputes the probabilities and runs
                                              their gradient, by its softmax bytes [fused_attention] */
    /* An accelerator's whole fused attention with bf16/f16 q, k, v (its tiled kernels: the GEMMs inside),
     * by its softmax bytes; measured up to T = 1024 [the two above] */
    PDDE_OPCLASS_FUSED_ATTENTION_HALF,
    PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD,
    /* A parameter-server table's calls, by pdde_cost_ps_bytes (pdde-bench times the in-process table):
     * a batch's pull (its ids made unique, hash probes into a table larger than the caches, the rows
     * copied out) [embedding] and its push (the probes and the optimizer's row updates) [optimizer] */
    PDDE_OPCLASS_PS_PULL,
    PDDE_OPCLASS_PS_PUSH,
    PDDE_OPCLASS_COUNT
} pdde_op_class;
const char *pdde_op_class_name(pdde_op_class c); /* "gemm", "elementwise", "row", ... */
/* The class the cost model times a node with (communication ops, and node NULL: elementwise). */
pdde_op_class pdde_op_class_of(const pdde_tensor *node);
/* Floating-point operations of a fused attention node (its causal half of the score and value
 * GEMMs: 2*B*H*T*T*D forward, 5*B*H*T*T*D backward; under a window W, pdde_attention_window, about
 * T*W pairs instead of T*T/2), 0 for other ops. */
double pdde_attention_flops(const pdde_tensor *node);

#define PDDE_CLUSTER_MAX_GEMM 96   /* measured GEMM shapes per device spec */
#define PDDE_CLUSTER_MAX_CURVE 24  /* points per op-class curve */

typedef struct {
    pdde_dtype dtype;
    int64_t m, n, k;
    double flops;            /* FLOP/s measured at this shape (2mnk / seconds) */
} pdde_gemm_point;

typedef struct {
    double bytes;            /* bytes an op of the class reads and writes */
    double seconds;          /* its measured time */
} pdde_curve_point;

/* What one model of device does. Times between measured points are interpolated (GEMM: inverse-distance
 * weighting in log m, n, k; curves: linear in bytes, the last point's bandwidth beyond it, the first
 * point's time below it). Without measurements the cost model falls back to peak_flops and
 * mem_bandwidth (and says so: pdde_cost_result.uncalibrated). */
typedef struct {
    char name[64];           /* the model: "NVIDIA H100 80GB HBM3", "cpu:AMD EPYC 7B13 x2 threads" */
    pdde_device_kind kind;
    char backend[16];        /* "cpu", "opencl", "cuda", "level_zero", ... */
    double peak_flops;       /* f32 FLOP/s; 0 = unknown */
    double mem_bandwidth;    /* B/s; 0 = unknown */
    int n_gemm;
    pdde_gemm_point gemm[PDDE_CLUSTER_MAX_GEMM];
    int n_curve[PDDE_OPCLASS_COUNT];
    pdde_curve_point curve[PDDE_OPCLASS_COUNT][PDDE_CLUSTER_MAX_CURVE];
    /* How much slower an op of class k runs when every core of its machine runs one (memory bandwidth
     * and caches shared; pdde-bench measures a GEMM, elementwise and row op); 0 = not measured. A class
     * not measured takes its broader class's figure (GEMM: fused attention; row: attention, loss, row
     * backward; elementwise: the rest), else 1. Only CPU devices' are read. */
    double contention[PDDE_OPCLASS_COUNT];
} pdde_device_spec;

typedef struct {
    int id;                  /* unique in the cluster (not an index: nothing assumes device 0 is typical) */
    int spec;                /* index into pdde_cluster.specs */
    uint64_t memory;         /* bytes the device can give a training job */
} pdde_cluster_device;

typedef enum { PDDE_LINK_SHM = 0, PDDE_LINK_PCIE, PDDE_LINK_NVLINK, PDDE_LINK_NET } pdde_link_kind;
const char *pdde_link_kind_name(pdde_link_kind k);

typedef struct {
    int a, b;                /* device ids (an explicit link); unused in a machine's defaults */
    pdde_link_kind kind;
    double bandwidth;        /* B/s, one direction */
    double latency;          /* s */
    int group;               /* links with the same group >= 0 share one bandwidth (a NIC, a PCIe
                                switch): flows on them at once divide it; -1 = not shared */
} pdde_cluster_link;

typedef struct {
    int id;                  /* unique in the cluster */
    char name[64];           /* host name */
    int cores;               /* physical cores (hwloc); 0 = unknown. The cost model shares them among the
                                ranks computing on the machine's CPU devices at each moment */
    int numa_nodes;
    uint64_t host_memory;    /* bytes */
    uint64_t l3_cache;       /* bytes, all L3 caches together */
    pdde_cluster_link intra; /* between two devices of this machine when no explicit link says otherwise */
    pdde_cluster_link nic;   /* to other machines: every flow leaving or entering the machine shares it */
    int n_devices;
    pdde_cluster_device *devices;
} pdde_cluster_machine;

/* A measured collective: t(bytes) = latency + bytes / bandwidth (bytes: the buffer of one rank, the
 * whole of an allreduce, the gathered result of an allgather or the input of a reduce-scatter). Used
 * in place of the alpha-beta model for the same op, algorithm and rank count within one machine
 * (intra = 1) or across machines (0). */
typedef enum {
    PDDE_COLL_ALLREDUCE = 0, PDDE_COLL_ALLGATHER, PDDE_COLL_REDUCE_SCATTER, PDDE_COLL_ALLTOALL,
    PDDE_COLL_SENDRECV, PDDE_COLL_COUNT
} pdde_collective;
const char *pdde_collective_name(pdde_collective c);
typedef struct {
    pdde_collective op;
    pdde_comm_algo algo;     /* AUTO: what pdde's collectives choose by themselves */
    int ranks;
    int intra;
    double latency, bandwidth;
} pdde_collective_calib;

typedef struct pdde_cluster {
    char name[64];
    int n_specs;
    pdde_device_spec *specs;
    int n_machines;
    pdde_cluster_machine *machines;
    int n_links;
    pdde_cluster_link *links;          /* explicit device-to-device links (override the defaults) */
    int n_calibs;
    pdde_collective_calib *calibs;
} pdde_cluster;

/* An empty cluster named name. */
pdde_status pdde_cluster_init(const char *name, pdde_cluster **out);
void pdde_cluster_free(pdde_cluster *c);
/* Append a copy (the machine's devices are copied too); the index of the new entry, or a status < 0. */
int pdde_cluster_add_spec(pdde_cluster *c, const pdde_device_spec *spec);
int pdde_cluster_add_machine(pdde_cluster *c, const pdde_cluster_machine *m);
int pdde_cluster_add_device(pdde_cluster *c, int machine, const pdde_cluster_device *d);
int pdde_cluster_add_link(pdde_cluster *c, const pdde_cluster_link *l);
int pdde_cluster_add_calib(pdde_cluster *c, const pdde_collective_calib *k);
/* Checks ids (unique, >= 0), spec indices, numbers (finite, >= 0), a device's memory (> 0), a machine's
 * devices (at least one), links (between two different devices that exist, one per pair, one bandwidth
 * per group), GEMM figures and collective measurements (one per shape, one per op/algo/ranks/intra).
 * ctx gets a message naming the field path ("machines[1].devices[3].memory: ..."). */
pdde_status pdde_cluster_validate(pdde_context *ctx, const pdde_cluster *c);
/* JSON: read with cJSON where the build finds it, else with pdde's own strict reader (the same files
 * read the same, the same errors); writing (save, to_json) needs nothing, byte for byte the same. Load errors are PDDE_ERR_CORRUPT
 * with the field path and what was expected; save writes the canonical form, which load reads back to
 * the same bytes (save(load(f)) == f for every file save wrote, and for tools/clusters/). */
pdde_status pdde_cluster_load(pdde_context *ctx, const char *path, pdde_cluster **out);
pdde_status pdde_cluster_parse(pdde_context *ctx, const char *json, pdde_cluster **out);
pdde_status pdde_cluster_save(pdde_context *ctx, const pdde_cluster *c, const char *path);
/* *out is malloc'ed (free()). */
pdde_status pdde_cluster_to_json(pdde_context *ctx, const pdde_cluster *c, char **out);
/* This machine: one machine with ctx's devices (pdde_device_get_props), cores, NUMA nodes and caches
 * from hwloc (when built with it). Specs carry the backends' peak figures only; pdde-bench measures. */
pdde_status pdde_cluster_detect(pdde_context *ctx, pdde_cluster **out);
int pdde_cluster_device_count(const pdde_cluster *c);
/* The device with this id (NULL if none); *machine gets its machine's index (may be NULL). */
const pdde_cluster_device *pdde_cluster_find_device(const pdde_cluster *c, int id, int *machine);
/* The link data flows over between devices a and b (explicit, the machine's intra link, or across
 * machines the slower NIC with the two latencies added). PDDE_ERR_NOT_FOUND for an unknown id. */
pdde_status pdde_cluster_link_between(const pdde_cluster *c, int a, int b, pdde_cluster_link *out);

/* The planner search's view of a cluster (pdde_plan_search): each device's FLOP/s from its GEMM table
 * at (m, n, k) (0, 0, 0 = 4096^3; the peak without a table), its memory bandwidth (the largest
 * elementwise point's, else the spec's), its memory and machine; the links are the slowest machine's
 * (intra) and the slowest NIC (inter), since pdde_plan_devices has one of each, or where the cluster
 * has a measured allreduce (algo AUTO, within a machine or across) the link that reproduces it in the
 * search's ring formula at the most ranks measured. Devices in the cluster's order. The arrays are malloc'ed: pdde_plan_devices_free. */
pdde_status pdde_plan_devices_init(pdde_context *ctx, const pdde_cluster *c, int64_t m, int64_t n, int64_t k,
                                      pdde_plan_devices *out);
void pdde_plan_devices_free(pdde_plan_devices *d);
/* The same, with each device's figures timed on the nodes of g (build it with its backward and
 * optimizer) as one of `ranks` data-parallel ranks runs them (GEMM rows and other nodes' bytes divided
 * by ranks): FLOP/s = the GEMMs' FLOPs (a fused attention's and a grouped expert GEMM's own) over their predicted
 * times (the attention's with its softmax), bandwidth = the other nodes' bytes
 * over theirs (each at least the first point of its class's curve: what small nodes cost). A device
 * lacking a figure a node needs keeps pdde_plan_devices_init' (at 4096^3). A single shape's rate
 * misjudges a model whose GEMMs are tall, skinny or batched per attention head. */
pdde_status pdde_plan_devices_init_graph(pdde_context *ctx, const pdde_cluster *c, const pdde_graph *g, int ranks,
                                            pdde_plan_devices *out);


/* ---------------------------------------------------------------------------------------------------
 * Cost model (planner/cost.c): simulates one training step of per-rank programs on a cluster: each
 * compute op timed from its device's measured curves, each collective from the topology and its
 * algorithm (alpha-beta per link, flows on a shared link dividing it, bf16/f16 halving the bytes) or a
 * measured calibration, a compute stream and a communication stream per rank (asynchronous
 * collectives overlap compute until their WAIT), send/recv pairs across pipeline stages, ranks on a
 * machine's CPU sharing its cores (only those computing at each moment, each slowed by its op class's
 * measured contention while several compute: planner/README.md "Cost model"), and memory
 * (persistent bytes + the activations alive at each point, freed after their last use).
 *
 * A program is what a rank runs, in order. Programs are built with pdde_cost_program_add (tests,
 * analytic models) or from a graph (pdde_cost_program_from_graph: one rank, no distribution). */
typedef enum {
    PDDE_COST_COMPUTE = 0,
    PDDE_COST_COLLECTIVE,    /* coll over group; async = runs on the comm stream until a WAIT */
    PDDE_COST_SEND,          /* to peer (a rank), on the comm stream: the compute stream goes on */
    PDDE_COST_RECV,          /* from peer: blocks until the matching SEND (same tag) has arrived */
    PDDE_COST_WAIT,          /* blocks until the async collective at index `wait` of this rank is done */
} pdde_cost_op_kind;

typedef struct {
    pdde_cost_op_kind kind;
    char name[32];           /* for the timeline ("F3 layer 2", "allreduce grads") */
    pdde_phase phase;
    int micro;               /* micro-batch, -1 = none */
    /* compute */
    pdde_op_class op_class;
    int64_t m, n, k;         /* GEMM shape (batch folded into m) */
    double flops;            /* 0 with a GEMM shape: 2mnk (x gemms) */
    double bytes;            /* bytes the op reads and writes */
    /* communication */
    pdde_collective coll;
    pdde_comm_algo algo;     /* AUTO: as pdde's collectives choose */
    int group;               /* pdde_cost_program_group index */
    int peer, tag;           /* send/recv */
    int async;
    int wait;                /* WAIT: index of the async collective in this rank's program */
    int64_t count;           /* elements communicated (the buffer of one rank, see pdde_collective_calib) */
    pdde_dtype dtype;        /* on the wire (comm_dtype) */
    /* memory: out_bytes are allocated when the op starts and freed after op `last_use` (an index
     * in this rank's program; < the op's own index: freed at the end of the step) */
    double out_bytes;
    int last_use;
    int placed;              /* compute: 1 = runs on placed_device (a placement target), not on its rank's device */
    int placed_device;       /* with placed: the cluster device id */
    double softmax_bytes;    /* a fused attention: bytes of the causal softmax over its scores (and in the
                                backward its gradient) it runs between its GEMMs, timed on the attention curve */
    int softmax_backward;    /* 1: softmax_bytes are an attention backward's, timed on the fused_attention_backward
                                curve (0: the forward's, on the fused_attention curve) */
    int64_t gemms;           /* a grouped GEMM: this many GEMMs of m x n x k (the experts'; flops: all of them); 0 = one.
                                A CPU runs their row tiles one a thread at once (as a GEMM of threads x the tile's rows) */
} pdde_cost_op;

typedef struct pdde_cost_program pdde_cost_program;
pdde_status pdde_cost_program_init(int n_ranks, pdde_cost_program **out);
void pdde_cost_program_free(pdde_cost_program *p);
/* Rank r runs on cluster device `device_id`; persistent bytes: parameters, gradients, optimizer state,
 * communication buffers (alive the whole step). */
pdde_status pdde_cost_program_set_rank(pdde_cost_program *p, int rank, int device_id, double persistent_bytes);
/* A communication group (its ranks in ring order); returns its index or a status < 0. */
int pdde_cost_program_group(pdde_cost_program *p, int n, const int *ranks);
/* Appends op to rank's program; returns its index or a status < 0. */
int pdde_cost_program_add(pdde_cost_program *p, int rank, const pdde_cost_op *op);
int pdde_cost_program_op_count(const pdde_cost_program *p, int rank);
const pdde_cost_op *pdde_cost_program_op(const pdde_cost_program *p, int rank, int index);
/* One rank running g's step (every node that reaches a loss, an output or an update, in order) on
 * cluster device device_id: each node a compute op with its class, GEMM shape, bytes and liveness. With
 * a fusion of lowering's on (PDDE_FUSE_*, PDDE_ATT_LOWP, PDDE_BF16_*) for the context's device 0 (the CPU,
 * as a session with the default device), the nodes its session runs. */
pdde_status pdde_cost_program_from_graph(const pdde_graph *g, int device_id, pdde_cost_program **out);
/* The same, lowered with the fusions a device of cluster c's device_id's backend runs by default (its spec's
 * backend: lowering's fusions are on by default on "cuda" in a bf16 graph, README section 4). */
pdde_status pdde_cost_program_from_graph_on(const pdde_graph *g, const pdde_cluster *c, int device_id, pdde_cost_program **out);
/* Every rank of a plan's real programs (planner/simulate.c): g annotated and completed as its sessions
 * compile it, sp what they pass (world not read; NULL = defaults), each rank lowered as pdde_lower_dump
 * does and its step turned into what the executor does: each node computed on the device it is placed
 * on, reshard collectives on their axis' group with their real size and dtype (comm_dtype), blocking or
 * started early and completed at their COMM_WAIT, sends and receives paired by tag, the vocab-parallel
 * cross-entropy's row reductions, the micro-batch passes in the schedule's order, the update and the
 * step's loss allreduce. A rank's persistent bytes are its whole memory plan (pdde_predict_memory:
 * allocated_bytes + transfer_bytes), so the simulated peak is what its session allocates. */
typedef struct {
    int world_size;           /* ranks (0 = one process) */
    const int *rank_devices;  /* [max(world_size, 1)]: the cluster device id of each rank; NULL = the
                                 cluster's devices in order (all on the first when it has fewer) */
    const int *local_devices; /* [n_local_devices]: the cluster device id of each local device index nodes
                                 are placed on (sp->layer_devices); NULL, or -1 = the rank's device */
    int n_local_devices;
} pdde_cost_plan;
pdde_status pdde_cost_program_from_plan(const pdde_cluster *c, const pdde_graph *g, const pdde_session_params *sp,
                                        const pdde_cost_plan *plan, pdde_cost_program **out);
/* The same for a plan text's plan: g built for it (gpt_plan_build), rank r on cluster device
 * rank_devices[r] (NULL: the cluster's devices in order), and its place= layers on the first device of
 * that backend on rank 0's machine (PDDE_ERR_NOT_FOUND where this process or that machine has none:
 * lowering for it needs one here). */
pdde_status pdde_plan_cost_program(const pdde_cluster *c, const pdde_graph *g, const pdde_plan *plan, const int *rank_devices,
                                   pdde_cost_program **out);

typedef struct {
    int rank, op;
    double start, end;
    int lane;                /* 0 = compute stream, 1 = communication (a transfer, or a wait on one) */
} pdde_cost_event;

typedef struct {
    double step_time;        /* s: the last rank's end */
    int n_ranks;
    double *peak_memory;     /* bytes per rank: persistent + the activation peak */
    double *compute_time;    /* s per rank: busy on the compute stream */
    double *comm_wait;       /* s per rank: blocked on communication (recv, sync collective, wait) */
    double *idle;            /* s per rank: the rest of the step (pipeline bubbles, waiting for peers) */
    int n_events;
    pdde_cost_event *events;
    int uncalibrated;        /* ops timed from peak figures (no measured curve for their class) */
} pdde_cost_result;

pdde_status pdde_cost_simulate(pdde_context *ctx, const pdde_cluster *c, const pdde_cost_program *p,
                               pdde_cost_result **out);
void pdde_cost_result_free(pdde_cost_result *r);
/* Seconds for one compute op on device id (NaN with a message in ctx when the device is unknown or
 * has neither a curve nor a peak figure for the op's class). */
double pdde_cost_compute_time(pdde_context *ctx, const pdde_cluster *c, int device_id, const pdde_cost_op *op);
/* Seconds for one collective of count elements of dtype over devices[0..n) (ring order); algo AUTO as
 * pdde's collectives choose. NaN (message in ctx) on unknown devices. */
double pdde_cost_collective_time(pdde_context *ctx, const pdde_cluster *c, pdde_collective coll,
                                 pdde_comm_algo algo, const int *devices, int n, int64_t count, pdde_dtype dtype);
/* The timeline as text: a lane per rank, `width` columns ('#' compute, '=' communication, '.' idle). */
void pdde_cost_timeline_text(const pdde_cost_result *r, FILE *f, int width);
/* The timeline as SVG (a lane per rank, compute and communication coloured, bubbles blank). */
pdde_status pdde_cost_timeline_svg(pdde_context *ctx, const pdde_cost_result *r, const pdde_cost_program *p,
                                   const char *path);
/* The timeline as a Chrome/Perfetto trace: {"traceEvents":[{"name","cat":"compute"|"comm","ph":"X",
 * "ts":us,"dur":us,"pid":rank,"tid":0 compute stream | 1 communication}]}, as measured runs write it. */
pdde_status pdde_cost_timeline_trace(pdde_context *ctx, const pdde_cost_result *r, const pdde_cost_program *p,
                                     const char *path);

/* ---------------------------------------------------------------------------------------------------
 * Parameter server (comm/ps.c): sparse tables keyed by 64-bit feature ids, served by server ranks to
 * worker ranks in sync, async (bounded staleness) or geo mode. Compiled with the communication layer.
 *
 * A table holds rows of `dim` floats created on first touch (so memory grows with the ids seen, not
 * the id space), each with its own optimizer state. A new row's values are normal(0, init_std) drawn
 * from a hash of (seed, id, column), so every shard, process and run creates the same row. */
typedef enum { PDDE_PS_SGD = 0, PDDE_PS_ADAGRAD, PDDE_PS_ADAM } pdde_ps_optimizer;

typedef struct {
    int dim;                     /* row width C (required) */
    pdde_ps_optimizer optimizer; /* applied per row on the server */
    float lr;                    /* 0 = 0.01 */
    float beta1, beta2;          /* Adam; 0 = 0.9, 0.999 */
    float eps;                   /* Adagrad, Adam; 0 = 1e-8 */
    float init_std;              /* new rows ~ normal(0, init_std); 0 = zeros */
    uint64_t seed;
    int admit_after;             /* an id gets a row once pulled this many times (0, 1: at once); until
                                    then pulls read zeros and pushes to it are dropped */
    int64_t evict_after;         /* rows not touched for this many table steps are dropped; 0 = never */
} pdde_ps_table_params;
#define PDDE_PS_TABLE_PARAMS_INIT {0, PDDE_PS_SGD, 0, 0, 0, 0, 0, 0, 0, 0}

typedef struct pdde_ps_table pdde_ps_table;
typedef struct {
    int64_t rows;                /* rows held */
    int64_t step;                /* table steps: optimizer applications (a push, or a sync round) */
    int64_t evicted;             /* rows dropped by eviction so far */
    int64_t not_admitted;        /* ids seen but not (yet) admitted */
    size_t bytes;                /* heap bytes the table holds (rows, state, index, admission counts) */
} pdde_ps_table_stats;

pdde_status pdde_ps_table_init(pdde_context *ctx, const pdde_ps_table_params *p, pdde_ps_table **out);
void pdde_ps_table_free(pdde_ps_table *t);
/* Copies the rows of ids[0..n) into out[n * dim], creating (admitted) rows on first touch. */
pdde_status pdde_ps_table_pull(pdde_ps_table *t, size_t n, const uint64_t *ids, float *out);
/* One optimizer step: row ids[i] is updated with gradient scale * grads[i * dim ..]; an id given twice
 * gets the sum of its gradients. Ids without a row (not admitted) are skipped. */
pdde_status pdde_ps_table_push(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *grads, float scale);
/* Adds deltas to the rows (geo mode's merge; no optimizer, rows created as in pull). */
pdde_status pdde_ps_table_add(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *deltas);
/* Reads a row without creating it: PDDE_ERR_NOT_FOUND when the table has none. */
pdde_status pdde_ps_table_get(const pdde_ps_table *t, uint64_t id, float *out);
/* Sets rows (created if absent, admission aside) to vals [n, dim] with fresh optimizer state; not a step. */
pdde_status pdde_ps_table_set(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *vals);
void pdde_ps_table_stats_get(const pdde_ps_table *t, pdde_ps_table_stats *out);
/* Atomic save (path.tmp, fsync, rename; a crc32 at the end) and load (replaces the contents; a
 * mismatching dim/optimizer or a corrupt file changes nothing) of the rows and the admission counts. */
pdde_status pdde_ps_table_save(const pdde_ps_table *t, const char *path);
pdde_status pdde_ps_table_load(pdde_ps_table *t, const char *path);
/* The server an id belongs to among n_servers (a hash of the id, not id % n). */
int pdde_ps_shard_of(uint64_t id, int n_servers);
/* The cost model's price (planner/cost.c) of a pdde_sparse_batch_pull (push = 0) or _push (1, the table
 * optimizer opt) of n ids of rows of dim floats: the bytes its curve is read at (ids, rows read and
 * written, optimizer state), and its seconds on device id by the ps_pull / ps_push curve, else the
 * embedding / optimizer one (NaN as pdde_cost_compute_time). */
double pdde_cost_ps_bytes(int push, double n, int dim, pdde_ps_optimizer opt);
double pdde_cost_ps_time(pdde_context *ctx, const pdde_cluster *c, int device_id, int push, double n, int dim, pdde_ps_optimizer opt);

/* Jobs: ranks [0, n_servers) of a world communicator are servers, the rest workers. Every worker
 * pushes to every server once a step (an empty push when it has no rows there), so a server knows
 * each worker's clock.
 *  - SYNC: a server applies a step once every worker's push of it has arrived (the mean of their
 *    gradients: W workers each with a mean loss over B samples train like one with B x W), and only
 *    then acknowledges the pushes; a worker's next pull sees the whole step.
 *  - ASYNC: pushes are applied as they come; a pull of a worker that is more than `staleness` steps
 *    ahead of the slowest worker waits (stale synchronous parallel), so no worker runs on rows more
 *    than `staleness` steps older than its own.
 *  - GEO: workers train a local copy of their rows with SGD (lr of the table) and every `geo_steps`
 *    pushes send the change since the last exchange (a delta the server adds), then refresh. */
typedef enum { PDDE_PS_SYNC = 0, PDDE_PS_ASYNC, PDDE_PS_GEO } pdde_ps_mode;

typedef struct {
    pdde_ps_mode mode;
    int n_servers;               /* 0 = 1 */
    int staleness;               /* ASYNC: k */
    int geo_steps;               /* GEO: push deltas every k steps; 0 = 1 */
    pdde_ps_table_params table;
    const char *load_dir;        /* servers (and a single-process client): load their shard from here at
                                    start (NULL: empty tables); shards of another count of servers are
                                    re-partitioned (each server keeps the ids it owns) */
    /* Servers: automatic checkpoints of their shard into checkpoint_dir (atomic, as
     * pdde_ps_table_save) after every checkpoint_every steps of the table (a sync round, an async
     * push or a geo delta), before that step is acknowledged, and when the job ends; a server
     * restarted with load_dir = checkpoint_dir serves the rows of its last checkpoint. 0 = never. */
    const char *checkpoint_dir;
    int64_t checkpoint_every;
    /* Servers: threads serving requests at once (pulls read beside each other and beside pushes, pushes
     * to rows of other stripes go in parallel; the staleness bound and the sync rounds are decided one
     * request at a time); 0 = PDDE_PS_SERVER_THREADS from the environment, else 1 (one request at a
     * time: several threads measured faster only with many requests in flight). */
    int server_threads;
} pdde_ps_params;
#define PDDE_PS_PARAMS_INIT {PDDE_PS_SYNC, 0, 0, 0, PDDE_PS_TABLE_PARAMS_INIT, NULL, NULL, 0, 0}

typedef struct {
    pdde_ps_table_stats table;   /* of this server's shard */
    int64_t pushes, pulls;       /* served */
    int64_t max_staleness;       /* ASYNC: the largest (puller's clock - slowest clock) served */
    int64_t deferred_pulls;      /* ASYNC: pulls held back by the staleness bound */
    int64_t checkpoints;         /* automatic checkpoints written */
} pdde_ps_server_stats;

typedef struct pdde_ps_server pdde_ps_server;
/* A server's shard (load_dir read here). Run it on a world communicator with pdde_ps_server_run. */
pdde_status pdde_ps_server_init(pdde_context *ctx, const pdde_ps_params *p, int server_index, pdde_ps_server **out);
void pdde_ps_server_free(pdde_ps_server *s);
/* Serves the workers of comm until every one has said goodbye (PDDE_OK) or the world fails (its
 * error). A push is applied only when all of it has arrived, so a worker dying mid-push changes
 * nothing; the shard stays usable (run again on a new world, or save). */
pdde_status pdde_ps_server_run(pdde_ps_server *s, pdde_comm *comm);
pdde_ps_table *pdde_ps_server_table(pdde_ps_server *s);
void pdde_ps_server_stats_get(const pdde_ps_server *s, pdde_ps_server_stats *out);
/* The shard file of server `index` of n in dir. */
int pdde_ps_shard_path(char *buf, size_t n, const char *dir, int index, int n_servers);

typedef struct pdde_ps_client pdde_ps_client;
/* A worker's client. comm NULL: a single-process client over an in-process table (same API, the
 * reference for distributed runs). Thread-safe: threads' pulls and pushes are in flight at once (up to 8
 * requests; PDDE_PS_LANES=k: k, 1 = one at a time), except a sync worker's pushes, which go one at a
 * time; geo's calls read and update the local copy at once and its exchanges go one at a time. A lost or
 * silent server fails the waiting calls within the world's timeout. */
pdde_status pdde_ps_client_init(pdde_context *ctx, pdde_comm *comm, const pdde_ps_params *p, pdde_ps_client **out);
/* Says goodbye to the servers (not in a failed world) and frees. */
void pdde_ps_client_free(pdde_ps_client *c);
pdde_status pdde_ps_client_pull(pdde_ps_client *c, size_t n, const uint64_t *ids, float *out);
/* One step's gradients of the rows (the worker's mean-loss gradient; the servers combine workers). */
pdde_status pdde_ps_client_push(pdde_ps_client *c, size_t n, const uint64_t *ids, const float *grads);
/* GEO: sends the pending deltas now (also done by free). No-op in other modes. */
pdde_status pdde_ps_client_flush(pdde_ps_client *c);
/* pdde_ps_table_set on the servers (not a push: no clock, no sync round). */
pdde_status pdde_ps_client_set(pdde_ps_client *c, size_t n, const uint64_t *ids, const float *vals);
/* Every server saves its shard to dir (atomically); returns when all are written. */
pdde_status pdde_ps_client_save(pdde_ps_client *c, const char *dir);
/* The stats of server `index` (of the local table when comm is NULL). */
pdde_status pdde_ps_client_server_stats(pdde_ps_client *c, int index, pdde_ps_server_stats *out);


/* The worker side of a sparse table in a graph (core/ps_worker.c). Each sample has `fields` bags of `bag`
 * ids (multi-hot; PDDE_SPARSE_NO_ID marks an empty slot). A step's batch is pulled as its unique ids
 * into a local table [U, dim] (U = batch x fields x bag + 1: room for every id and one zero row for
 * empty slots), the ids remapped to local rows, and the ordinary embedding op looks them up and pools
 * each bag (sum, or mean over its non-empty slots): the output is [batch, fields, dim], so the dense
 * part of a recommender is an ordinary graph. After a forward + backward the local table's gradient
 * rows are pushed. The four stages are separate calls so that a pipeline can run them on different
 * threads (pull and push on CPU threads, the graph on an accelerator) with several batches in flight:
 *     e = sparse embedding of the graph;   b = pdde_sparse_batch_init(e)
 *     pdde_sparse_batch_pull(b, client, ids)  ->  pdde_sparse_batch_feed(b, session)  ->
 *     pdde_session_run(FORWARD_BACKWARD)  ->  pdde_sparse_batch_collect(b, session)  ->
 *     pdde_sparse_batch_push(b, client) */
#define PDDE_SPARSE_NO_ID UINT64_MAX
typedef enum { PDDE_POOL_SUM = 0, PDDE_POOL_MEAN } pdde_pooling;
typedef struct pdde_sparse_embedding pdde_sparse_embedding;
typedef struct pdde_sparse_batch pdde_sparse_batch;

/* Appends the local table (a PDDE_TENSOR_SPARSE parameter), the ids input and the pooling to g; NULL
 * and a graph error on bad arguments. *out is freed by pdde_sparse_embedding_free (after the graph's
 * sessions are done with it). */
pdde_tensor *pdde_sparse_embedding_init(pdde_graph *g, const char *name, int64_t batch, int fields, int bag, int dim,
                                       pdde_pooling pool, pdde_sparse_embedding **out);
void pdde_sparse_embedding_free(pdde_sparse_embedding *e);
pdde_status pdde_sparse_batch_init(const pdde_sparse_embedding *e, pdde_sparse_batch **out);
void pdde_sparse_batch_free(pdde_sparse_batch *b);
/* ids: batch x fields x bag (row-major); dedups, remaps and pulls the rows. */
pdde_status pdde_sparse_batch_pull(pdde_sparse_batch *b, pdde_ps_client *c, const uint64_t *ids);
/* Writes the rows of the local table the batch reads (its unique ids' rows, then the empty slots' zero row),
 * the local ids (and mean weights) into s; the rows past those, which no id refers to, keep what earlier
 * batches left there. */
pdde_status pdde_sparse_batch_feed(pdde_sparse_batch *b, pdde_session *s);
/* After a forward + backward of s: reads the rows' gradients and zeroes the accumulator. */
pdde_status pdde_sparse_batch_collect(pdde_sparse_batch *b, pdde_session *s);
pdde_status pdde_sparse_batch_push(pdde_sparse_batch *b, pdde_ps_client *c);
int64_t pdde_sparse_batch_unique_count(const pdde_sparse_batch *b);
/* Dense parameters held on the servers (instead of data-parallel over the workers): from now on the
 * batch also pulls every non-sparse parameter of s that has a gradient (as rows of the table: ids
 * PDDE_PS_DENSE_IDS | parameter << 32 | row, the last row of each zero-padded; sparse ids must stay
 * out of that range), feed writes them into s, collect reads and zeroes their gradients, and push
 * sends them with the sparse rows in one push, so the servers' table optimizer (and the mode: sync
 * means over the workers, async, geo) updates them like rows. The graph then has no optimizer.
 * seed: first set the servers' rows to s's current values (one worker does, before any worker's
 * first pull: the others wait on a barrier; not when the servers loaded a checkpoint). */
#define PDDE_PS_DENSE_IDS (0xFEull << 56)
pdde_status pdde_sparse_batch_hold_dense(pdde_sparse_batch *b, pdde_session *s, pdde_ps_client *c, int seed);
/* Data parallelism of the dense part over the workers: averages the gradient accumulators of every
 * parameter of s except sparse ones over comm (one allreduce), between FORWARD_BACKWARD and OPTIMIZER. */
pdde_status pdde_sparse_allreduce_dense(pdde_session *s, pdde_comm *comm);

/* ---------------------------------------------------------------------------------------------------
 * Asynchronous pipeline (core/pipeline.c): the heterogeneous pipeline of recommender training as a library
 * object. A batch passes through n stages in order, each a function the caller gives (e.g. 1: read,
 * parse and pull the batch's rows on CPU threads; 2: the dense forward and backward on an
 * accelerator's session; 3: push the rows' gradients); each stage runs on its own worker threads;
 * bounded queues between stages hold the batches in flight, so while one batch trains the next is
 * pulled and the one before pushed, and every device keeps busy. A batch lives in a caller's slot
 * (its buffers: samples, pulled rows, gradients), handed from stage to stage; n_slots bounds the
 * batches in flight (with the sparse rows of a batch pulled up to n_slots - 1 pushes before it is
 * trained: the staleness of async mode). Each wait gives up after timeout_s with an error naming the
 * stage; a stage's error stops every stage and is returned (its message, naming the stage and batch,
 * raised on the calling thread once every worker has joined: the message the stage's own call raised,
 * or a note that it raised none, never another stage's).
 * Sizing: a stage with workers = 0 gets its worker count from the stage times: predicted_s when every
 * stage has one (from the cost model, pdde_cost_simulate of the stage's graph), else a balance
 * measured on the first calibrate_batches batches, run stage after stage on the calling thread (they
 * are real batches: nothing is wasted; each stage's fastest batch counts). Threads then go, one at a time, to the stage with the longest
 * time per worker, up to max_threads in all; the choice and its reasons are logged (context
 * log_level >= 1) and kept in the stats' sizing text. */
#define PDDE_PIPELINE_MAX_STAGES 8
/* Runs batch `index` of the run through one stage in `slot`; `worker` (0..workers-1) says which of
 * the stage's threads runs it (e.g. to pick a per-worker session or device). */
typedef pdde_status (*pdde_pipeline_fn)(void *user, void *slot, int64_t index, int worker);
typedef struct {
    const char *name;        /* for the log and errors */
    pdde_pipeline_fn fn;
    void *user;
    int workers;             /* threads of the stage; 0 = sized (see above) */
    int max_workers;         /* 0 = no limit (a stage that drives one session: 1) */
    double predicted_s;      /* seconds per batch on one worker; 0 = unknown */
} pdde_pipeline_stage;

typedef struct {
    int n_stages;
    const pdde_pipeline_stage *stages;
    void **slots;            /* the caller's batch buffers */
    int n_slots;             /* >= 1; 1 runs the stages strictly in turn */
    int queue_depth;         /* batches waiting between two stages; 0 = n_slots */
    int max_threads;         /* stage workers in all, for sizing; 0 = the context's thread count */
    int calibrate_batches;   /* for a measured balance; 0 = 3 */
    double timeout_s;        /* every wait; 0 = 60 */
} pdde_pipeline_params;
#define PDDE_PIPELINE_PARAMS_INIT {0, NULL, NULL, 0, 0, 0, 0, 0}

typedef struct {
    int workers;
    int64_t batches;
    double predicted_s;      /* per batch and worker: what sizing used (measured or given); 0 = not sized */
    double busy_s;           /* wall time inside the stage function, summed over its workers */
    double cpu_s;            /* CPU time of the stage's threads (kernels on a session's pool threads not included) */
    double starved_s;        /* waiting for a batch from the stage before */
    double blocked_s;        /* waiting for room in the queue after */
} pdde_pipeline_stage_stats;

typedef struct {
    int n_stages;
    pdde_pipeline_stage_stats stage[PDDE_PIPELINE_MAX_STAGES];
    int64_t batches;
    double wall_s;           /* in pdde_pipeline_run, summed over calls */
    double process_cpu_s;    /* the whole process's CPU time over those calls: minus the stages' own, what
                                pool threads and device runtimes used */
    char sizing[512];        /* how the stages were sized */
} pdde_pipeline_stats;

typedef struct pdde_pipeline pdde_pipeline;
pdde_status pdde_pipeline_init(pdde_context *ctx, const pdde_pipeline_params *p, pdde_pipeline **out);
void pdde_pipeline_free(pdde_pipeline *pl);
/* Runs batches first .. first + n - 1 through every stage; returns when the last one has left the
 * last stage, or at the first error (every thread joined; the slots are free again either way). */
pdde_status pdde_pipeline_run(pdde_pipeline *pl, int64_t first, int64_t n);
/* Sizes the stages from their predicted_s (every stage needs one) without running a batch, as the
 * first run would: pdde_pipeline_stats_get then gives each stage's workers and the sizing text (a
 * planner's prediction of the pipeline). Once sized (given workers, or run), it changes nothing. */
pdde_status pdde_pipeline_size(pdde_pipeline *pl);
void pdde_pipeline_stats_get(const pdde_pipeline *pl, pdde_pipeline_stats *out);
/* Zeroes the counters (after warm-up batches); the sizing stays. */
void pdde_pipeline_stats_reset(pdde_pipeline *pl);

/* ---------------------------------------------------------------------------------------------------
 * A rank's device (core/device_select.c), as torchrun users expect: rank r of a host trains on that
 * host's r-th device of the backend the user names; pass choice.device as pdde_session_params.device
 * and the whole step (embedding, head, loss, optimizer) runs there.
 *
 *     pdde_device_select_params dp = PDDE_DEVICE_SELECT_PARAMS_INIT;  dp.backend = "cuda";
 *     pdde_device_choice c;  pdde_device_select(ctx, &dp, &c);   sp.device = c.device;
 *
 * The local rank comes from the launcher: PDDE_LOCAL_RANK (pdde-run), OMPI_COMM_WORLD_LOCAL_RANK
 * (Open MPI), SLURM_LOCALID (Slurm); 0 without one. More local ranks than devices is an error naming
 * the count, unless the ranks may share devices (local rank mod count; the CPU is every rank's). A named backend that is
 * missing is PDDE_ERR_UNAVAILABLE naming what is missing (the driver library, or no device); an
 * unknown name PDDE_ERR_INVALID_ARG. "auto" takes the CPU or, of every other family, this local
 * rank's device: the one the cost model predicts fastest for graph where it can time them all
 * (cluster's measured figures, or peak figures), else a GPU (or an accelerator of its own) over the
 * CPU; a device computing on the host's own CPU cores (PoCL) is not taken over the CPU without a
 * measurement saying it is faster, nor one that does not run graph's in-place nodes (its optimizer
 * updates: they cannot go to the CPU). choice.why says how the device was chosen, in one line. */
typedef struct {
    const char *backend;          /* "cuda", "opencl", "level_zero", "cpu", a plugin's family, BACKEND:INDEX (that
                                     device, whatever the local rank) or "auto"; NULL = $PDDE_DEVICE, else "auto" */
    const int *local_rank;        /* this process's index among its host's ranks; NULL = the launcher's */
    int share;                    /* 1: ranks may share devices; 0 = only when $PDDE_DEVICE_SHARE is 1 */
    const pdde_graph *graph;      /* auto: the training step (forward, backward, optimizer) the cost model
                                     times on each candidate; NULL = by kind */
    const pdde_cluster *cluster;  /* auto: measured figures (pdde-bench's file of this machine: the k-th device of
                                     a family is its first machine's k-th of that backend); NULL = the backends' peak figures */
} pdde_device_select_params;
#define PDDE_DEVICE_SELECT_PARAMS_INIT {NULL, NULL, 0, NULL, NULL}

typedef struct {
    int device;                   /* global index (pdde_device_count): pdde_session_params.device */
    int local_rank;               /* the local rank it was chosen for */
    int index, count;             /* its index among its family's devices on this host, and their count */
    int shared;                   /* 1: other local ranks take it too */
    char backend[16];
    char name[128];
    char why[384];                /* one line: how it was chosen */
} pdde_device_choice;
pdde_status pdde_device_select(pdde_context *ctx, const pdde_device_select_params *params, pdde_device_choice *out);

/* The devices `ranks` processes of a job on a one-machine cluster c train on, for the planner search
 * (entry r: local rank r's, each timed on g as pdde_plan_devices_init_graph does): where the cost model
 * predicts the machine's first accelerator (a device that is not a CPU) faster than its CPU for g, or
 * there is no CPU (and this process's device of that backend, where it has one, runs g's in-place
 * nodes: pdde_device_select gives a rank no other), rank r on the r-th accelerator as pdde_device_select gives it, ranks beyond them
 * on the CPU (extra data-parallel ranks: the search gives them their share or leaves them out), and
 * the CPU a placement target beside each accelerator (place_*: the search places layers there where
 * that pays); else every rank on the CPU and the first accelerator a placement target they share.
 * A device's speed, memory bandwidth and memory are divided among the ranks on it (a CPU's figures
 * are all its threads', as pdde-bench measures them; pdde-run gives each rank a share of the cores).
 * A device no rank takes that the cost model cannot time (a failed calibration) fails the call with
 * PDDE_ERR_NO_PLAN and the reason. Free with pdde_plan_devices_free. */
pdde_status pdde_plan_devices_init_machine(pdde_context *ctx, const pdde_cluster *c, const pdde_graph *g, int ranks,
                                           pdde_plan_devices *out);

/* ---------------------------------------------------------------------------------------------------
 * Mixture-of-Experts. A token x[n] [C] goes to k of E experts; the expert FFNs run as grouped GEMMs
 * over an expert-ordered buffer of token rows whose per-expert counts vary from step to step while
 * every shape stays static:
 *
 *     logits = x @ router                                 [N, E]
 *     idx    = pdde_moe_topk(g, logits, bias, k, flags)   i32 [N, k]
 *     w      = pdde_moe_gate(g, logits, idx, flags)       [N, k], softmax over the k chosen (or sigmoid)
 *     xe     = pdde_moe_dispatch(g, x, idx, E, cap)       [R, C]: rows grouped by expert
 *     he     = pdde_moe_grouped_matmul(g, xe, w1, idx, cap, 0)   w1 [E, C, F]
 *     ye     = pdde_moe_grouped_matmul(g, gelu(he), w2, idx, cap, 0)
 *     y      = pdde_moe_combine(g, ye, idx, w, E, cap)    [N, C]: the k outputs weighted and summed
 *
 * cap = 0 is dropless (R = N*k: no token is dropped); cap > 0 gives each expert cap rows (R = E*cap)
 * and drops the tokens past them (in token order): their outputs are 0 and pdde_moe_dropped counts
 * them. Every op has its gradient; the routing choice itself (top-k) has none. The ops run on the
 * CPU (devices: through the CPU fallback); tokens split over a mesh axis (data parallelism) keep
 * their rows on their rank. */
#define PDDE_MOE_SIGMOID 1u      /* scores sigmoid(logit) (DeepSeek-V3), not softmax */
#define PDDE_MOE_NO_NORMALIZE 2u /* weights are the chosen scores, not divided by their sum (Switch) */
/* The k best experts by score + bias (bias [E] or NULL: DeepSeek's balancing bias, it changes the
 * choice only, never the weights); ties go to the lower expert id. */
pdde_tensor *pdde_moe_topk(pdde_graph *g, pdde_tensor *logits, pdde_tensor *bias, int k, unsigned flags);
pdde_tensor *pdde_moe_gate(pdde_graph *g, pdde_tensor *logits, pdde_tensor *idx, unsigned flags);
/* i32 [E]: how many of the N*k choices picked each expert. */
pdde_tensor *pdde_moe_counts(pdde_graph *g, pdde_tensor *idx, int experts);
pdde_tensor *pdde_moe_dispatch(pdde_graph *g, pdde_tensor *x, pdde_tensor *idx, int experts, int64_t capacity);
/* The same rows as [E, capacity, C], one block of capacity rows an expert (capacity >= 1; rows past an
 * expert's tokens zero): the layout for expert parallelism. pdde_moe_grouped_matmul on it (ids may be
 * NULL) multiplies every row of each block, pdde_moe_combine takes it back. Weights [E, ...] split over
 * a mesh axis that also splits the tokens make completion exchange the blocks by all-to-all (each
 * rank's tokens' rows to the rank of their experts and back) and reduce-scatter the experts'
 * gradients. A capacity of N (every token) drops nothing. Under data parallelism each rank's buffer
 * holds its tokens (capacity / ranks of them an expert). The rows of zeros (past each expert's tokens)
 * are skipped by the grouped GEMM and stay home: the exchange sends each expert's routed rows only,
 * the counts first (pdde_session_exchanged_rows). */
pdde_tensor *pdde_moe_dispatch_experts(pdde_graph *g, pdde_tensor *x, pdde_tensor *idx, int experts, int64_t capacity);
pdde_tensor *pdde_moe_grouped_matmul(pdde_graph *g, pdde_tensor *x, pdde_tensor *w, pdde_tensor *idx, int64_t capacity, int trans_b);
pdde_tensor *pdde_moe_combine(pdde_graph *g, pdde_tensor *ye, pdde_tensor *idx, pdde_tensor *weights, int experts, int64_t capacity);
/* Switch/GShard's load-balancing loss E * sum_e f_e P_e (f_e: the share of the N*k choices that went
 * to e, held constant; P_e: the mean softmax probability of e): 1 when balanced, E when every token
 * picks one expert. A scalar [1] (PDDE_OP_MOE_AUX_LOSS). Under data parallelism f counts every rank's
 * tokens and P is each rank's mean, averaged as the cross-entropy is. */
pdde_tensor *pdde_moe_aux_loss(pdde_graph *g, pdde_tensor *logits, pdde_tensor *idx, int experts);
/* Rows per expert for a capacity factor (ceil(factor * N * k / E)); factor <= 0: 0 (dropless). */
int64_t pdde_moe_capacity(int64_t tokens, int k, int experts, float factor);
/* The tokens a capacity drops, from the counts of pdde_moe_counts: sum_e max(0, counts[e] - capacity). */
int64_t pdde_moe_dropped(const int32_t *counts, int experts, int64_t capacity);

/* The cost of the MoE layers under expert parallelism (ep ranks share the experts; n_ranks / ep
 * replicate them, data parallel): what ep changes per rank and step. The token exchange: an alltoall
 * before and after the experts, forward and backward, each of tokens x k x width x dtype (the routed
 * rows only), in groups of ep consecutive devices, each pair's bytes over its link and every group's
 * bytes leaving a machine through its NIC at once (CPU ranks beyond a machine's cores share them, in
 * their compute and their collectives); the busiest rank's grouped GEMMs at the GEMM rate of the rows one expert gets (its share of the routing
 * skew: measured counts, or a stated max/mean) and the passes over the experts' buffers (with ep > 1
 * blocks of S rows an expert, S = ep x a rank's tokens dropless); the experts' gradient reduction over their
 * data-parallel replicas (ZeRO-3: and each layer's parameter gathers, prefetched as lowering runs them
 * on these devices); the experts' memory (f32 parameters and gradients, AdamW state; ZeRO stages split
 * them over the data-parallel replicas). */
typedef struct {
    int64_t tokens;          /* per step, all ranks (global batch x context) */
    int width, ffn, experts, topk, layers;   /* layers: the MoE ones */
    float capacity_factor;   /* 0 = dropless */
    double skew;             /* the busiest expert's tokens over the mean; 0 = 1 (even) */
    const int32_t *counts;   /* or tokens per expert as a router measured them ([experts]); NULL = skew */
    pdde_dtype dtype;        /* of the exchanged activations */
    pdde_dtype compute_dtype;/* of the expert GEMMs */
    int zero;                /* ZeRO stage over the data-parallel replicas of the experts */
    double memory_budget;    /* bytes a rank may give the experts; 0 = the device's memory */
    int grads_over_ep;       /* 1: the experts' gradients are summed over the ep group too (a reduce-scatter of
                                all experts' into each rank's: pdde's expert parallelism, whose weight
                                gradient sums the rows where the tokens are split) */
} pdde_moe_cost_params;
#define PDDE_MOE_COST_PARAMS_INIT {0, 0, 0, 0, 0, 0, 0, 0, NULL, PDDE_F32, PDDE_F32, 0, 0, 0}
typedef struct {
    int ep;
    double alltoall_bytes;     /* leaving one rank in a step, all MoE layers */
    double alltoall_s;         /* its time */
    int alltoall_hier;         /* 1: the exchange priced in the communicator's hierarchical form (several machines) */
    double cross_host_share;   /* of a rank's exchanged bytes, the share to other machines (the most of any rank) */
    double expert_gemm_s;      /* the busiest rank's expert GEMMs, forward and backward */
    double expert_buffer_s;    /* the passes over the experts' rows beside the GEMMs: the activation, and with ep > 1
                                  the buffer by expert's padded rows (zeroed, scanned, activated) */
    double dp_sync_s;          /* the experts' gradients over their data-parallel replicas (ZeRO-3: and what the
                                  step waits of each layer's parameter gathers, forward and backward: all of
                                  them blocking, or prefetched where lowering prefetches them on these
                                  devices, the first layer's of a pass and what outlasts the layer before) */
    double imbalance;          /* the busiest rank's rows over the mean */
    double gemm_efficiency;    /* the GEMM rate at one expert's rows over the rate at all the rank's rows */
    double expert_param_bytes, expert_optimizer_bytes; /* a rank's: parameters + gradients (ZeRO-3: with the
                                  gathered layer, and the next one prefetched), AdamW state */
    double step_s;             /* alltoall_s + expert_gemm_s + expert_buffer_s + dp_sync_s */
    int fits;                  /* the experts' memory within the budget */
} pdde_moe_cost;
pdde_status pdde_moe_cost_estimate(pdde_context *ctx, const pdde_cluster *c, const int *devices, int n_ranks,
                                   const pdde_moe_cost_params *p, int ep, pdde_moe_cost *out);
/* The ep (every one dividing the ranks and the experts: 1, groups of ep consecutive ranks, all ranks)
 * of the least step_s among those that fit (*best); every one tried, ep ascending, into
 * all[0..*n_all) when all is not NULL. PDDE_ERR_NO_PLAN when none fits (*best: the smallest memory). */
pdde_status pdde_moe_choose_ep(pdde_context *ctx, const pdde_cluster *c, const int *devices, int n_ranks, const pdde_moe_cost_params *p,
                               pdde_moe_cost *best, pdde_moe_cost *all, int max_all, int *n_all);

/* ---------------------------------------------------------------------------------------------------
 * Sharded checkpoints and in-memory snapshots (resharding on load).
 *
 * A snapshot is one rank's blocks of what a checkpoint keeps (parameters, optimizer state, the loss
 * scale) copied to host memory, with its own index: for each block the tensor's name, dtype, global
 * shape and dist attr, the block's box in the global tensor (start and extent per dim) and a CRC-32,
 * and the step (the optimizer's step count), the data position, the learning-rate schedule. Its
 * serialized form is the bytes of a shard file. A sharded checkpoint is a directory: shard files
 * (s<generation>-r<rank>.shard, one per rank holding a block no lower rank holds) and one text
 * manifest ("manifest": every tensor's global shape, dtype and dist attr, which file holds which
 * block at which offset with its CRC, the step, the data position, the schedule; its own CRC last).
 * Restoring a session, under any plan, reads for each block this rank holds only the saved blocks
 * that overlap it, each checked against its CRC: any dp/tp/pp/ZeRO/shares layout to any other, any
 * world size. A missing or damaged shard is refused naming the file and the tensor.
 *
 * pdde_checkpoint_save/_load pick the format by path: a directory (an existing one, or a path ending
 * in '/') is a sharded checkpoint, anything else the single file above. Sharded, both are collective
 * over the session's world: every rank writes its shard file in parallel and fsyncs it, rank 0 then
 * fsyncs the directory, writes the manifest to manifest.tmp, fsyncs it and renames it over manifest,
 * fsyncs the directory again and removes the previous generation's shards. Until that rename the
 * previous checkpoint stays whole and loadable; a crash at any moment leaves one of the two. A load
 * fails on every rank when it fails on one (the message names what and where). */
typedef struct pdde_snapshot pdde_snapshot;

typedef struct {
    /* 0: the blocks no lower rank holds (over all ranks, every block once: a checkpoint's shards);
     * 1: every block this rank holds, replicas too (the survivors' snapshots then still cover the
     * blocks of a lost rank that some survivor held a copy of) */
    int replicas;
} pdde_snapshot_params;
#define PDDE_SNAPSHOT_PARAMS_INIT {0}

/* Copies this rank's blocks to host memory (p may be NULL; extra: the data position to keep, may be
 * NULL). Local: no communication; every rank takes one at the same step boundary for a set. Taking
 * is a copy only: the CRCs are computed when first needed (pdde_snapshot_data, a save, on its writer
 * thread, or a restore), on whichever thread needs them. */
pdde_status pdde_snapshot_take(pdde_session *s, const pdde_snapshot_params *p, const pdde_checkpoint_extra *extra, pdde_snapshot **out);
void pdde_snapshot_free(pdde_snapshot *sn);
/* Its serialized form (a shard file's bytes, to send to a peer or keep): valid until it is freed;
 * NULL (and *nbytes 0) when its CRCs cannot be computed (out of memory). */
const void *pdde_snapshot_data(const pdde_snapshot *sn, size_t *nbytes);
/* A snapshot of serialized bytes (copied): header and index are checked now, block CRCs on restore. */
pdde_status pdde_snapshot_from_data(pdde_context *ctx, const void *data, size_t nbytes, pdde_snapshot **out);
int64_t pdde_snapshot_step(const pdde_snapshot *sn);
/* The world rank that took it (0 for one process) and that world's size. */
int pdde_snapshot_rank(const pdde_snapshot *sn);
int pdde_snapshot_world_size(const pdde_snapshot *sn);
/* Restores session s, under its own plan, from a set of snapshots of one step (any plan, any world
 * size, replicas allowed: e.g. the survivors' own and their copies of lost ranks'): every block this
 * rank holds is assembled from the overlapping blocks of the set, each checked against its CRC; then
 * the step, schedule and loss scale, and extra (may be NULL) as pdde_checkpoint_load fills it. Local:
 * no communication. Refused, naming the tensor and the missing box, when the set does not cover a
 * block this rank needs; nothing is written then. */
pdde_status pdde_snapshot_restore(pdde_session *s, const pdde_snapshot *const *set, int n, pdde_checkpoint_extra *extra);
/* Writes snapshots as a sharded checkpoint into directory dir (created if missing): collective over
 * world (NULL: one process). Each rank passes its own snapshot of the same step (taken with or
 * without replicas: the manifest lists every block once, from the lowest rank holding it); the
 * atomic protocol of pdde_checkpoint_save. Usable from a thread of its own (on a communicator the
 * training step does not use) to write a checkpoint in the background. */
pdde_status pdde_snapshot_save(const pdde_snapshot *sn, pdde_comm *world, const char *dir);

/* A sharded save in the background (so that steps need not wait for the disk): start copies this
 * rank's state to host memory (pdde_snapshot_take), agrees on the save with the other ranks and
 * leaves the shard file to a thread of its own; the session may run steps meanwhile. finish (at a
 * later step boundary, on every rank) waits for the file, then makes the checkpoint visible as
 * pdde_checkpoint_save does (collective over the session's world) and frees the writer. Until then
 * the previous checkpoint is the one that loads. _start_snapshot saves a snapshot the caller keeps
 * alive until finish (over world: NULL for one process). */
typedef struct pdde_checkpoint_writer pdde_checkpoint_writer;
pdde_status pdde_checkpoint_writer_start(pdde_session *s, const char *dir, const pdde_checkpoint_extra *extra, pdde_checkpoint_writer **out);
pdde_status pdde_checkpoint_writer_start_snapshot(const pdde_snapshot *sn, pdde_comm *world, const char *dir, pdde_checkpoint_writer **out);
pdde_status pdde_checkpoint_writer_finish(pdde_checkpoint_writer *w);

/* Checks a checkpoint (a sharded directory or a single file) without a session: the manifest's and
 * every shard's CRCs, every block's CRC, and that the blocks cover every tensor exactly once. */
pdde_status pdde_checkpoint_verify(pdde_context *ctx, const char *path);
/* Converts a sharded checkpoint directory into a single file, or a single file into a sharded
 * directory (one shard, whole tensors), by what `from` is; `to` is replaced atomically. */
pdde_status pdde_checkpoint_convert(pdde_context *ctx, const char *from, const char *to);
/* Prints what a checkpoint holds (step, data position, schedule, files; each tensor's dtype, shape,
 * dist attr and blocks) to out. */
pdde_status pdde_checkpoint_print(pdde_context *ctx, const char *path, FILE *out);

/* ---------------------------------------------------------------------------------------------------
 * Elastic training (core/elastic.c): a job that loses a rank (killed, frozen, cut off) or changes size
 * at a step boundary goes on in the surviving processes, which keep their state. Under
 * `pdde-run --elastic` (or any launcher giving PDDE_RANK, PDDE_WORLD_SIZE and PDDE_STORE_ADDR):
 *
 *     pdde_elastic *el;  pdde_elastic_init(ctx, NULL, &el);    world = pdde_elastic_world(el)
 *     build:  graph and session for pdde_comm_size(world) ranks (sp.world = world)
 *             if (pdde_elastic_generation(el) > 0) pdde_elastic_restore(el, s, plan_text, &data_pos)
 *     each step:  pdde_elastic_step_begin(el, s, data_pos, &change)    (snapshot; planned changes)
 *                 st = pdde_elastic_step_end(el, s, pdde_session_run(s, PDDE_RUN_STEP))
 *                 on PDDE_ERR_PEER_LOST or change == PDDE_ELASTIC_CHANGE: free the session (and all
 *                 that uses the world), pdde_elastic_recover(el, &c), re-plan for c.world_size, build
 *                 on PDDE_ELASTIC_LEAVE: stop; PDDE_ELASTIC_STOP (all leave, or too few would stay): save a checkpoint, stop
 *     a SIGTERM handler:  pdde_elastic_request_leave(el, sig)    (this rank leaves at the next boundary)
 *
 * Snapshots are taken in host memory at step boundaries (every snapshot_every steps; the last two are
 * kept): replicated tensors whole, tensors split over the data-parallel ranks (ZeRO's state) as this
 * rank's block plus a copy of the previous rank's, sent around the ring at the boundary and awaited in
 * step_end; restoring makes split tensors whole from the survivors' blocks and copies (two neighbours
 * lost together lose a block: the job stops). Under tensor or pipeline parallelism a snapshot is every
 * block the rank holds (pdde_snapshot_take), its copy goes to the next rank the same way, and a restore
 * hands the survivors' snapshots and copies to every member, which restores under its new plan. A
 * failure loses at most the steps since the last complete snapshot.
 * Membership lives in the store: each member has a death notice with a lease of peer_timeout_s (a killed member is known at once, a frozen one within peer_timeout_s); the survivors
 * of generation G announce themselves, the lowest one writes generation G+1's members and the step to
 * resume at, once; a member left out (it was frozen, or came back late) is fenced: recover returns
 * PDDE_ERR_STATE and it must stop. A member lost while the next world forms makes the others form the
 * one after. Ranks started later with PDDE_ELASTIC_JOIN=1 (pdde-run --join) are
 * taken in at the members' next step boundary while the world is below max_ranks; they get the state
 * from rank 0 by broadcast. Errors that would repeat (a non-finite loss, a bad configuration,
 * too few ranks, more failures than max_restarts) end the job instead; departures at a step boundary (planned, or
 * asked by a signal) that would leave fewer than min_ranks stop every member there (PDDE_ELASTIC_STOP) so it can save. */
typedef struct pdde_elastic pdde_elastic;
/* etcd (v3.4 or later) as the store, through its v3 JSON gateway ("http://host:port"): put, range,
 * transactions (compare_set, add), watches (wait), leases as death notices (set_liveness: a lease of
 * lease_s, at least etcd's 2 s, kept alive by ping; once it ends, a get of the notice's key finds the
 * notice). Retries the first request for up to timeout_s (a refused connection: etcd may be starting);
 * PDDE_ERR_INVALID_ARG at once for an endpoint that can never work (no HOST:PORT with a port 1..65535, a
 * host that does not resolve). Unauthenticated: keep etcd on 127.0.0.1 or
 * a network only the job's hosts reach. PDDE_ERR_UNAVAILABLE when pdde was built without libcurl.
 * Elastic jobs use it for their membership with PDDE_RDZV=etcd://host:port (pdde-run --rdzv
 * etcd://host:port/JOB); their worlds still meet through the built-in store, whose address pdde-run
 * keeps in etcd (pdde_store_etcd_set_leased) for joiners. */
pdde_status pdde_store_etcd_connect(pdde_context *ctx, const char *endpoint, double timeout_s, pdde_store **out);
/* Puts key = val on the lease this etcd client holds (pdde_store_set_liveness first): etcd deletes the
 * key when the lease ends (the process died, froze past the lease, or closed). pdde-run keeps an etcd
 * job's store address so, for pdde-run --join. PDDE_ERR_STATE without a lease, PDDE_ERR_INVALID_ARG on
 * a store that is not etcd. */
pdde_status pdde_store_etcd_set_leased(pdde_store *s, const char *key, const void *val, size_t len);
/* Deletes every key of etcd that starts with prefix, and the death notices registered for them (range
 * deletes). pdde-run clears an elastic run's keys so (elastic/JOB/RUN/). PDDE_ERR_INVALID_ARG on a store
 * that is not etcd or an empty prefix. */
pdde_status pdde_store_etcd_remove_prefix(pdde_store *s, const char *prefix);
typedef struct {
    const char *job;          /* the job's name in the store; NULL = PDDE_ELASTIC_JOB (pdde-run sets it) */
    int min_ranks;            /* fewer survivors stop the job; 0 = PDDE_ELASTIC_MIN or 1 */
    int max_ranks;            /* 0 = PDDE_ELASTIC_MAX or the starting world size */
    int max_restarts;         /* failures recovered from, at most; 0 = PDDE_ELASTIC_MAX_RESTARTS or 10; < 0 no limit */
    int snapshot_every;       /* steps between snapshots; 0 = PDDE_ELASTIC_SNAPSHOT_EVERY or 1 */
    double peer_timeout_s;    /* failure detection bound; 0 = PDDE_PEER_TIMEOUT or 5 */
    double timeout_s;         /* forming a world, blocking collectives; 0 = PDDE_ELASTIC_TIMEOUT or 300 */
} pdde_elastic_params;
#define PDDE_ELASTIC_PARAMS_INIT {NULL, 0, 0, 0, 0, 0, 0}
/* What pdde_elastic_step_begin's change says. */
#define PDDE_ELASTIC_CHANGE 1 /* the world changes at this boundary: free the session, recover */
#define PDDE_ELASTIC_LEAVE 2  /* this rank leaves at this boundary: stop (cleanly) */
#define PDDE_ELASTIC_STOP 3   /* every member leaves at this boundary, or departures would leave fewer than min_ranks
                               * (every member stops, not only the leavers): the job ends here (the world is whole until
                               * pdde_elastic_free: save a checkpoint now if the job is to go on later) */
typedef struct {
    int generation;           /* 0 at the start, +1 per change */
    int rank, world_size, old_world_size;
    int64_t resume_step;      /* the step the snapshot restores */
    int planned;              /* 1: a change at a step boundary, 0: a failure */
    char what[400];           /* "rank 3 lost (SIGKILL) at step 412" */
} pdde_elastic_change;

/* Joins generation 0 of the job: the store at PDDE_STORE_ADDR, the world of PDDE_WORLD_SIZE ranks. */
pdde_status pdde_elastic_init(pdde_context *ctx, const pdde_elastic_params *params, pdde_elastic **out);
void pdde_elastic_free(pdde_elastic *e);
/* The current generation's world communicator (owned by e; changes at each recover). */
pdde_comm *pdde_elastic_world(const pdde_elastic *e);
int pdde_elastic_generation(const pdde_elastic *e);
/* At a step boundary, before the step's batch is read: snapshots s with the caller's word user (a data
 * position) when due. *change: 0, PDDE_ELASTIC_CHANGE, PDDE_ELASTIC_LEAVE or PDDE_ELASTIC_STOP
 * (PDDE_ELASTIC_LEAVE "id@step,..." in the environment makes member id leave at that step: a planned
 * shrink; pdde_elastic_request_leave the same at the next boundary). Members that leave write a note in
 * the store: pdde-run counts them as departed, not lost, whatever their exit status. */
pdde_status pdde_elastic_step_begin(pdde_elastic *e, pdde_session *s, uint64_t user, int *change);
/* Asks that this member leave at the next step boundary, as a planned departure: every member learns it
 * there (one small sum over the world at each boundary), the others re-form without it from that
 * boundary's snapshot (no step lost), and if every member asked, all get PDDE_ELASTIC_STOP. sig: the
 * signal it was asked for (a scheduler's SIGTERM preempting one node; 0: none): at a PDDE_ELASTIC_STOP
 * every member learns the largest (pdde_elastic_stop_reason), so all can exit alike (128 + it). Only
 * sets flags: safe to call from a signal handler. */
pdde_status pdde_elastic_request_leave(pdde_elastic *e, int sig);
/* After PDDE_ELASTIC_STOP, why the job stops: *sig the largest signal a member asked to leave for (0: none, planned
 * departures only); *below_min 1 when not every member left but fewer than min_ranks would have remained. */
pdde_status pdde_elastic_stop_reason(const pdde_elastic *e, int *sig, int *below_min);
/* Classifies a step's status: PDDE_OK; PDDE_ERR_PEER_LOST when the world lost a member (a lost peer, a
 * timeout, an abort: recover); any other error is returned with a message saying it would repeat.
 * Call it after every step_begin that returned no change, before the session is freed: the snapshot
 * step_begin started is copied while the step runs (until the step's first update, or here). */
pdde_status pdde_elastic_step_end(pdde_elastic *e, pdde_session *s, pdde_status run_status);
/* Re-forms the world with the members that remain (the caller has freed everything using the old
 * one); blocks until the new generation is agreed (bounded by about 2 x peer_timeout_s + 2 s). */
pdde_status pdde_elastic_recover(pdde_elastic *e, pdde_elastic_change *out);
/* Writes the agreed snapshot into s (compiled for the new world), sets its step and schedule, gives
 * back the snapshot's user word, and (rank 0) logs one line: "elastic: rank 3 lost (SIGKILL) at step
 * 412; re-plan 4 -> 3 ranks: <plan>; resumed at step 412 in 1.80 s". */
pdde_status pdde_elastic_restore(pdde_elastic *e, pdde_session *s, const char *plan, uint64_t *user);
/* The last transition's log line ("" before any). */
const char *pdde_elastic_last_change(const pdde_elastic *e);
typedef struct {
    int64_t snapshots;        /* taken so far */
    double snapshot_s;        /* the time the caller's thread spent on them (setting up, waiting for a copy) */
    double copy_s;            /* the time the copies took (in the background where the devices are host memory) */
    size_t snapshot_bytes;    /* of the last one */
    int changes;              /* transitions completed (restores) */
    double last_recover_s;    /* the last one: from noticing the change to the state restored */
} pdde_elastic_stats;
pdde_status pdde_elastic_stats_get(const pdde_elastic *e, pdde_elastic_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* PDDE_H */
