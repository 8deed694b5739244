/* test_device_buckets — gradient buckets of device memory (PoCL here): a data-parallel MLP whose
 * every tensor lives on the OpenCL device trains on 2 ranks with its gradients read into host
 * buckets through the device's stream, reduced in one collective a bucket (started in backward, or
 * at the update) and written back. Bucketing changes what travels together, not the arithmetic (a sum
 * of 2 ranks is the same bits in any buffer), and the model's kernels add in a fixed order (no
 * embedding: PoCL's embedding backward adds with atomics), so every bucketed run must equal the
 * unbucketed one (each gradient staged alone) bit for bit: every step's loss and every parameter
 * after the last step. The same for ZeRO-1 (reduce-scatters of rank-major blocks, gathers of the
 * updated shards). A run that lost a rank mid-step is test_dp's (dev_lost). The device path
 * (pdde_device_collectives_iface, NCCL's shape) with an implementation that relays through host memory:
 * the allreduce buckets gathered into device buffers by the backend's copies, reduced through it and
 * scattered back equal the unbucketed run bit for bit, and it served every bucket of the step; so do
 * ZeRO-1's reduce-scatter and gather buckets and ZeRO-2's (its reduce-scatters of each micro-batch's
 * gradients too, each bucket's members one bucket later) through its reduce_scatter and allgather,
 * in the host buckets' rank-major layout on the device. pdde_predict_memory equals what each run
 * holds. A rank killed inside the device path's reduce-scatter (a real SIGKILL, mid-bucket: ZeRO-1's
 * at the update, ZeRO-2's in backward) fails the other's step within the peer timeout.
 * PDDE_TEST_DEVICE=cuda runs it all on a CUDA device, with PDDE_COPY_STREAM=1 (the host buckets'
 * copies on its second stream, as OpenCL's are by default) where a config does not set it to 0. */
#define _GNU_SOURCE
#include "pdde.h"
#include "pdde_extension.h"
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define STEPS 6
#define B 16
#define IN 32
#define HID 64
#define OUT 16
static const pdde_store_server *g_server;

typedef struct {
    const char *name, *plan;
    int64_t bucket_bytes; /* gradient_bucket_bytes: -1 none, 0 one (25 MiB), else the cap */
    int at_update;        /* 1: overlap_gradients -1 (the buckets run at the update), else 1 (started in backward) */
    int device_path;      /* 1: the buckets through relay_collectives (device buffers) */
    int one_stream;       /* 1: PDDE_COPY_STREAM=0 (the host buckets' copies on the device's stream) */
    int kill;             /* 1: rank 1 dies (SIGKILL) inside the device path's reduce-scatter of step KILL_STEP */
} config;
#define KILL_STEP 3

typedef struct {
    float losses[STEPS];
    uint64_t param_hash;       /* FNV-1a of every parameter's bytes after the last step */
    int gradient_collectives, early, on_device, ok, relayed, streams, stream_copies;
    int one_rank_plan_refused; /* pdde_plan_apply of dp=1 with a world of 2: refused, naming both */
    int calls[3], buckets[3];  /* the relay's allreduces, reduce-scatters, gathers; the program's buckets of each */
    int overlapped;            /* reduce-scatter buckets of backward with backward's kernels between their start and members */
    int failed_step, status;   /* (kill) the step that failed on rank 0, its status, seconds into it */
    double failed_after;
    int64_t host_syncs;        /* the host's waits for the device over the steps */
    size_t transfer_bytes;     /* pdde_session_memory's: host buffers for transfers (the buckets') */
    size_t allocated_bytes;    /* ... and the backends' buffers */
    size_t predicted_transfer, predicted_allocated; /* pdde_predict_memory's for this rank */
    char error[200];
} result;

/* A device-collectives implementation as NCCL's would be used, its collective relayed through host
 * memory: the device buffer read through the backend, pdde_comm's allreduce, written back. Its init
 * bootstraps as NCCL's does (rank 0's id broadcast to the group). */
typedef struct { pdde_comm *comm; const pdde_backend_iface *be; void *dev; } relay;
static int g_relayed;         /* collectives relayed in this rank (a process) */
static int g_calls[3];        /* of them allreduces, reduce-scatters, gathers */
static int g_die;             /* this rank dies in its next reduce-scatter */
static void *g_streams[16];   /* the streams they came on: each bucket's own (its copies and collective */
static int g_n_streams;       /* beside the backward), not the device's */

static pdde_status relay_init(const pdde_device_collectives_params *p, void **impl) {
    relay *r = calloc(1, sizeof *r);
    uint64_t id = pdde_comm_rank(p->comm) == 0 ? 0x6e63636c ^ (uint64_t)getpid() : 0;
    if (!r || pdde_comm_broadcast(p->comm, &id, 1, PDDE_I64, 0) || !id) return free(r), PDDE_ERR_INVALID_ARG;
    r->comm = p->comm, r->be = p->backend, r->dev = p->dev;
    *impl = r;
    return PDDE_OK;
}

static pdde_status relay_allreduce(void *impl, void *stream, void *handle, size_t offset, size_t count, pdde_dtype t, pdde_reduce_op op) {
    relay *r = impl;
    size_t n = count * pdde_dtype_size(t);
    void *h = malloc(n);
    pdde_status st = !h ? PDDE_ERR_OOM : r->be->read(r->dev, stream, handle, offset, h, n);
    if (!st) st = r->be->stream_sync(r->dev, stream);
    if (!st) st = pdde_comm_allreduce(r->comm, h, h, count, t, op);
    if (!st) st = r->be->write(r->dev, stream, handle, offset, h, n);
    if (!st) st = r->be->stream_sync(r->dev, stream);
    free(h);
    g_relayed += !st, g_calls[0] += !st;
    int seen = 0;
    for (int i = 0; i < g_n_streams; i++) seen |= g_streams[i] == stream;
    if (!seen && g_n_streams < 16) g_streams[g_n_streams++] = stream;
    return st;
}

/* Out of place, as NCCL's: size x recvcount elements of src in, this rank's recvcount out at dst. */
static pdde_status relay_reduce_scatter(void *impl, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset, size_t recvcount,
                                        pdde_dtype t, pdde_reduce_op op) {
    relay *r = impl;
    if (g_die) raise(SIGKILL); /* (mid-bucket: its copies in, its collective not done) */
    size_t n = recvcount * pdde_dtype_size(t), all = n * (size_t)pdde_comm_size(r->comm);
    char *h = malloc(all + n);
    pdde_status st = !h ? PDDE_ERR_OOM : r->be->read(r->dev, stream, src, src_offset, h, all);
    if (!st) st = r->be->stream_sync(r->dev, stream);
    if (!st) st = pdde_comm_reduce_scatter(r->comm, h, h + all, recvcount, t, op);
    if (!st) st = r->be->write(r->dev, stream, dst, dst_offset, h + all, n);
    if (!st) st = r->be->stream_sync(r->dev, stream);
    free(h);
    g_relayed += !st, g_calls[1] += !st;
    return st;
}

static pdde_status relay_allgather(void *impl, void *stream, void *src, size_t src_offset, void *dst, size_t dst_offset, size_t sendcount,
                                   pdde_dtype t) {
    relay *r = impl;
    size_t n = sendcount * pdde_dtype_size(t), all = n * (size_t)pdde_comm_size(r->comm);
    char *h = malloc(n + all);
    pdde_status st = !h ? PDDE_ERR_OOM : r->be->read(r->dev, stream, src, src_offset, h, n);
    if (!st) st = r->be->stream_sync(r->dev, stream);
    if (!st) st = pdde_comm_allgather(r->comm, h, h + n, sendcount, t);
    if (!st) st = r->be->write(r->dev, stream, dst, dst_offset, h + n, all);
    if (!st) st = r->be->stream_sync(r->dev, stream);
    free(h);
    g_relayed += !st, g_calls[2] += !st;
    return st;
}

static void relay_free(void *impl) { free(impl); }
static pdde_device_collectives_iface relay_collectives = {.api_version = PDDE_DEVICE_COLLECTIVES_API_VERSION, .struct_size = sizeof relay_collectives,
                                                          .name = "relay", .backend = "opencl", .init = relay_init, .allreduce = relay_allreduce,
                                                          .free = relay_free, .reduce_scatter = relay_reduce_scatter, .allgather = relay_allgather};
static const char *g_family = "opencl"; /* the device the ranks train on (PDDE_TEST_DEVICE) */

static void train(pdde_context *ctx, pdde_comm *comm, void *arg) {
    const config *c = arg;
    result *out = test_rank_result;
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){B, IN}), *y = pdde_input(g, "y", PDDE_I32, 1, (int64_t[]){B});
    pdde_tensor *params[6];
    const int64_t dims[4] = {IN, HID, HID, OUT};
    pdde_tensor *h = x;
    for (int l = 0; l < 3; l++) {
        pdde_graph_set_layer(g, l);
        char name[16];
        snprintf(name, sizeof name, "w%d", l);
        params[2 * l] = pdde_param(g, name, 2, (int64_t[]){dims[l], dims[l + 1]}, 0.2f);
        snprintf(name, sizeof name, "b%d", l);
        params[2 * l + 1] = pdde_param(g, name, 1, (int64_t[]){dims[l + 1]}, 0.05f);
        h = pdde_matmul(g, h, params[2 * l], 0, 0);
        h = l < 2 ? pdde_bias_gelu(g, h, params[2 * l + 1]) : pdde_bias_add(g, h, params[2 * l + 1]);
    }
    pdde_tensor *loss = pdde_cross_entropy(g, h, y);
    pdde_plan plan;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-2f, op.weight_decay = 0.1f, op.clip_norm = 1.0f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = comm;
    sp.device = pdde_device_find(ctx, g_family, 0);
    sp.overlap_gradients = c->at_update ? -1 : 1;
    sp.gradient_bucket_bytes = c->bucket_bytes;
    if (c->device_path) sp.device_collectives = &relay_collectives;
    if (c->one_stream) setenv("PDDE_COPY_STREAM", "0", 1); /* (a rank is a process of its own) */
    else if (strcmp(g_family, "opencl")) setenv("PDDE_COPY_STREAM", "1", 1); /* (OpenCL's default; off by default elsewhere) */
    g_relayed = g_n_streams = g_die = 0;
    memset(g_calls, 0, sizeof g_calls);
    float xs[B * IN];
    int32_t ys[B];
    if (sp.device < 0) { snprintf(out->error, sizeof out->error, "no %s device", g_family); goto done; }
    out->one_rank_plan_refused = !pdde_plan_parse("dp=1", &plan) && pdde_plan_apply(g, &plan, loss, &op, &sp, &s) == PDDE_ERR_INVALID_ARG &&
                                 strstr(pdde_last_error(ctx), "the plan has 1 rank") && strstr(pdde_last_error(ctx), "the session's world 2");
    if (pdde_plan_parse(c->plan, &plan) || pdde_plan_apply(g, &plan, loss, &op, &sp, &s)) {
        snprintf(out->error, sizeof out->error, "setup: %s", pdde_last_error(ctx));
        goto done;
    }
    for (int i = 0; i < pdde_session_node_count(s); i++) {
        const pdde_tensor *t = pdde_session_node(s, i);
        out->early += t->phase == PDDE_PHASE_BACKWARD && (t->op == PDDE_OP_ALLREDUCE || t->op == PDDE_OP_REDUCE_SCATTER);
        if (!strncmp(t->name, "bucket.", 7) && t->op >= PDDE_OP_ALLREDUCE && t->op <= PDDE_OP_ALLGATHER)
            out->buckets[t->op == PDDE_OP_ALLREDUCE ? 0 : t->op == PDDE_OP_REDUCE_SCATTER ? 1 : 2]++;
    }
    for (int i = 0; i < pdde_session_node_count(s); i++) { /* (a member reads its bucket last) */
        const pdde_tensor *b = pdde_session_node(s, i);
        if (strncmp(b->name, "bucket.", 7) || b->op != PDDE_OP_REDUCE_SCATTER || b->phase != PDDE_PHASE_BACKWARD) continue;
        int kernels = 0;
        for (int j = i + 1; j < pdde_session_node_count(s); j++) {
            const pdde_tensor *t = pdde_session_node(s, j);
            if (t->nsrc && t->src[t->nsrc - 1] == b) break;
            kernels += t->phase == PDDE_PHASE_BACKWARD && (t->op < PDDE_OP_ALLREDUCE || t->op > PDDE_OP_ALLGATHER) && t->op != PDDE_OP_GRAD_ACCUM;
        }
        out->overlapped += kernels > 0;
    }
    out->on_device = pdde_session_tensor(s, params[0]) && pdde_session_tensor(s, params[0])->device == sp.device;
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < B * IN; i++) xs[i] = (float)((i * 37 + step * 11) % 23) / 23.0f - 0.5f;
        for (int i = 0; i < B; i++) ys[i] = (i * 5 + step * 3) % OUT;
        if (c->kill && step == KILL_STEP && pdde_comm_rank(comm) == 1) g_die = 1;
        double t0 = test_now();
        pdde_status st = pdde_session_write_global(s, x, xs, sizeof xs);
        if (!st) st = pdde_session_write_global(s, y, ys, sizeof ys);
        if (!st) st = pdde_session_run(s, PDDE_RUN_STEP);
        if (st) {
            snprintf(out->error, sizeof out->error, "step %d: %s", step, pdde_last_error(ctx));
            out->failed_step = step, out->status = st, out->failed_after = test_now() - t0;
            goto done;
        }
        out->losses[step] = pdde_session_loss(s);
    }
    out->gradient_collectives = pdde_session_gradient_collectives(s);
    memcpy(out->calls, g_calls, sizeof g_calls);
    out->relayed = g_relayed, out->streams = g_n_streams, out->stream_copies = pdde_session_stream_copies(s);
    out->host_syncs = pdde_session_host_syncs(s);
    pdde_memory_stats ms;
    out->transfer_bytes = pdde_session_memory(s, &ms) == PDDE_OK ? ms.transfer_bytes : (size_t)-1;
    out->allocated_bytes = ms.allocated_bytes;
    /* what lowering predicts for this rank without a session: the same buffers, host and device */
    pdde_memory_stats pm;
    pdde_session_params psp = sp;
    psp.world = NULL;
    if (pdde_predict_memory(g, &psp, pdde_comm_size(comm), pdde_comm_rank(comm), &pm)) {
        snprintf(out->error, sizeof out->error, "predict: %s", pdde_last_error(ctx));
        goto done;
    }
    out->predicted_transfer = pm.transfer_bytes, out->predicted_allocated = pm.allocated_bytes;
    if (test_session_hash(s, params, 6, &out->param_hash)) {
        snprintf(out->error, sizeof out->error, "read: %s", pdde_last_error(ctx));
        goto done;
    }
    out->ok = 1;
done:
    pdde_session_free(s);
    pdde_graph_free(g);
}

static void run(const char *addr, const config *c, result *out) {
    result res[2];
    memset(res, 0, sizeof res);
    test_ranks_params tp = {.addr = addr, .prefix = c->name, .timeout_s = 60, .n_threads = 1, .server = g_server, .device_runtimes = 1,
                            .results = res, .result_size = sizeof *res, .peer_timeout_s = c->kill ? 2 : 0, .killed_ok = c->kill ? 2u : 0u};
    test_run_ranks(2, &tp, train, (void *)c, 120);
    *out = res[0];
    if (c->kill) {
        printf("%-18s rank 1 killed in its reduce-scatter at step %d: rank 0 failed %.2f s into step %d: %s\n", c->name, KILL_STEP,
               out->failed_after, out->failed_step, out->error);
        return;
    }
    for (int r = 0; r < 2; r++) CHECK(res[r].ok, "%s rank %d: %s", c->name, r, res[r].error);
    printf("%-18s losses %.6f -> %.6f, %d data-parallel collectives a step, %d started in backward, %d copies on a copy stream, "
           "%lld host waits, parameters %016llx", c->name, out->losses[0], out->losses[STEPS - 1], out->gradient_collectives, out->early,
           out->stream_copies, (long long)out->host_syncs, (unsigned long long)out->param_hash);
    printf(", %zu bytes of host transfer buffers (predicted %zu), %zu allocated (predicted %zu)", out->transfer_bytes, out->predicted_transfer,
           out->allocated_bytes, out->predicted_allocated);
    if (c->device_path)
        printf("; device path: %d allreduces, %d reduce-scatters, %d gathers (buckets a step %d, %d, %d)", out->calls[0], out->calls[1], out->calls[2],
               out->buckets[0], out->buckets[1], out->buckets[2]);
    printf("\n");
}

/* Asked in a child process: device runtimes do not survive fork(). */
static int device_exists(void) {
    pid_t pid = fork();
    if (pid == 0) {
        pdde_context *c;
        pdde_context_init(NULL, &c);
        _exit(pdde_device_find(c, g_family, 0) >= 0 ? 0 : 1);
    }
    int status = 1;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void) {
#if defined(__SANITIZE_ADDRESS__)
    test_skip("asan", "PoCL in forked ranks under AddressSanitizer");
    return test_finish();
#endif
    const char *family = getenv("PDDE_TEST_DEVICE");
    if (family && *family) g_family = relay_collectives.backend = family;
    if (!device_exists()) {
        if (strcmp(g_family, "opencl")) test_skip(g_family, "no %s device (PDDE_TEST_DEVICE)", g_family);
        else test_skip("opencl", "no OpenCL device (PoCL in CI)");
        return test_finish();
    }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    CHECK(srv != NULL, "store server: %s", pdde_last_error(ctx));
    if (test_failed) return test_finish();
    g_server = srv;
    static const config configs[] = {
        {"unbucketed", "dp=2", -1, 0, 0, 0, 0},
        {"unbucketed_again", "dp=2", -1, 0, 0, 0, 0}, /* (the kernels are deterministic: else nothing below can hold) */
        {"one_bucket", "dp=2", 0, 0, 0, 0, 0},        /* the 6 gradients in one bucket, started in backward */
        {"small_buckets", "dp=2", 512, 0, 0, 0, 0},   /* w0, w1, w2 (>= 512 B) a bucket each, the biases in two (b2 b1, b0) */
        {"at_update", "dp=2", 0, 1, 0, 0, 0},
        {"zero1_unbucketed", "dp=2,zero=1", -1, 0, 0, 0, 0},
        {"zero1_buckets", "dp=2,zero=1", 0, 0, 0, 0, 0},
        {"zero1_small", "dp=2,zero=1", 512, 1, 0, 0, 0},
        {"device_path", "dp=2", 0, 0, 1, 0, 0},       /* the one bucket through the device path, started in backward */
        {"device_small", "dp=2", 512, 0, 1, 0, 0},
        {"device_at_update", "dp=2", 0, 1, 1, 0, 0},
        {"small_one_stream", "dp=2", 512, 0, 0, 1, 0}, /* the host buckets' copies on the device's stream */
        {"zero1_one_stream", "dp=2,zero=1", 512, 1, 0, 1, 0},
        {"tp2", "tp=2", 0, 0, 0, 0, 0}, /* pdde_plan_apply on a device: the vocab-parallel loss's layer on the CPU, the rest on OpenCL */
        {"device_zero1", "dp=2,zero=1", 0, 0, 1, 0, 0},       /* 14: ZeRO-1's 3 buckets (the norm's allreduce, reduce-scatter, gather) */
        {"device_zero1_small", "dp=2,zero=1", 512, 1, 1, 0, 0},
        {"zero2_unbucketed", "dp=2,zero=2", -1, 0, 0, 0, 0},  /* 16 */
        {"device_zero2", "dp=2,zero=2", 0, 0, 1, 0, 0},       /* its gathers through the device path */
        {"device_zero1_lost", "dp=2,zero=1", 0, 0, 1, 0, 1}, /* 18: rank 1 killed mid-bucket */
        {"zero2_buckets", "dp=2,zero=2", 0, 0, 0, 0, 0},      /* 19: ZeRO-2's reduce-scatters (each micro-batch's) in one host bucket */
        {"zero2_small", "dp=2,zero=2", 512, 0, 0, 0, 0},      /* ...in 512 B buckets (w0, w1, w2 alone; the biases in two) */
        {"device_zero2_small", "dp=2,zero=2", 512, 0, 1, 0, 0},
        {"device_zero2_lost", "dp=2,zero=2", 0, 0, 1, 0, 1},  /* 22: rank 1 killed in the backward's reduce-scatter bucket */
        {"zero2_small_late", "dp=2,zero=2", 512, 1, 0, 0, 0}, /* no overlap: each bucket's members right after it */
    };
    enum { N = sizeof configs / sizeof *configs };
    result res[N];
    memset(res, 0, sizeof res);
    for (int i = 0; i < N; i++) run(addr, &configs[i], &res[i]);
    CHECK(res[0].on_device, "the parameters live on the OpenCL device");
    CHECK(res[0].one_rank_plan_refused, "a plan of 1 rank applied with a world of 2 is refused, naming both");
    for (int i = 0; i < STEPS; i++) CHECK(isfinite(res[0].losses[i]), "step %d: loss %g", i, res[0].losses[i]);
    CHECK(res[0].losses[STEPS - 1] < res[0].losses[0], "the loss falls: %g -> %g", res[0].losses[0], res[0].losses[STEPS - 1]);
    static const int same[][2] = {{1, 0}, {2, 0}, {3, 0}, {4, 0}, {6, 5}, {7, 5}, {8, 0}, {9, 0}, {10, 0}, {11, 0}, {12, 5}, {14, 5}, {15, 5}, {17, 16}, {19, 16}, {20, 16}, {21, 16}, {23, 16}};
    for (size_t k = 0; k < sizeof same / sizeof *same; k++) {
        const result *a = &res[same[k][0]], *b = &res[same[k][1]];
        if (!a->ok || !b->ok) continue;
        CHECK(!memcmp(a->losses, b->losses, sizeof a->losses), "%s: losses not %s's bit for bit", configs[same[k][0]].name, configs[same[k][1]].name);
        CHECK(a->param_hash == b->param_hash, "%s: parameters not %s's bit for bit", configs[same[k][0]].name, configs[same[k][1]].name);
    }
    const result *tp = &res[13];
    test_diff d = test_diff_f32(tp->losses, res[0].losses, tp->ok ? STEPS : 0, 1e-3);
    CHECK(tp->ok && tp->on_device && d.worst <= 1e-6, "tp=2 on the device: losses within 1e-6 of dp=2's: worst %.3g at step %zu", d.worst, d.index);
    /* what travelled: one collective a gradient, or a bucket; in backward unless at the update */
    CHECK(res[0].gradient_collectives == 6 && res[2].gradient_collectives == 1 && res[3].gradient_collectives == 5 && res[4].gradient_collectives == 1,
          "data-parallel collectives a step: %d, %d, %d, %d; want 6, 1, 5, 1", res[0].gradient_collectives, res[2].gradient_collectives,
          res[3].gradient_collectives, res[4].gradient_collectives);
    CHECK(res[0].early == 0 && res[2].early == 1 && res[3].early == 5 && res[4].early == 0,
          "collectives started in backward: %d, %d, %d, %d; want 0, 1, 5, 0", res[0].early, res[2].early, res[3].early, res[4].early);
    /* the device path served every bucket of every step: 1, 5 and 1 a step */
    CHECK(res[8].relayed == STEPS && res[9].relayed == 5 * STEPS && res[10].relayed == STEPS && res[8].gradient_collectives == 1,
          "allreduces through the device path: %d, %d, %d over %d steps; want 1, 5, 1 a step", res[8].relayed, res[9].relayed, res[10].relayed, STEPS);
    /* the host buckets' copies on the device's second stream (OpenCL's default): a read in and a write
     * out of each gradient (ZeRO-1's 3 buckets: each of the 2 ranks' blocks in and the shard out; each
     * gradient in and out; the shard in and the 2 blocks out), none with PDDE_COPY_STREAM=0 or through
     * the device path */
    CHECK(res[2].stream_copies == 12 && res[3].stream_copies == 12 && res[4].stream_copies == 12 && res[6].stream_copies == 48 &&
          res[7].stream_copies == 48, "copies on the copy stream a step: %d, %d, %d, %d, %d; want 12, 12, 12, 48, 48", res[2].stream_copies,
          res[3].stream_copies, res[4].stream_copies, res[6].stream_copies, res[7].stream_copies);
    CHECK(res[11].stream_copies == 0 && res[12].stream_copies == 0 && res[9].stream_copies == 0 && res[0].stream_copies == 0,
          "no copies on a copy stream unbucketed, with PDDE_COPY_STREAM=0 or through the device path: %d, %d, %d, %d", res[0].stream_copies,
          res[11].stream_copies, res[12].stream_copies, res[9].stream_copies);
    /* the host waits once a bucket for its reads, as it synchronised the device's stream once a bucket
     * before, and no longer once a member for its write-back (6 a step; ZeRO-1's 3 kinds: 18) */
    CHECK(res[3].host_syncs + 6 * STEPS == res[11].host_syncs && res[7].host_syncs + 18 * STEPS == res[12].host_syncs,
          "host waits over %d steps: %lld on a copy stream, %lld without (want 6 a step fewer); ZeRO-1 %lld, %lld (want 18 a step fewer)", STEPS,
          (long long)res[3].host_syncs, (long long)res[11].host_syncs, (long long)res[7].host_syncs, (long long)res[12].host_syncs);
    /* ZeRO through the device path: every bucket of every step served by the implementation (none
     * staged: no copies on a copy stream), of each kind: ZeRO-1 its reduce-scatters and gathers and
     * the norm's allreduces, ZeRO-2 its gathers */
    for (int i = 14; i <= 21; i++) {
        if (i == 16 || (i >= 18 && i <= 20) || !res[i].ok) continue;
        int each = 1;
        for (int k = 0; k < 3; k++) each &= res[i].calls[k] == res[i].buckets[k] * STEPS;
        CHECK(each && res[i].buckets[2] >= 1 && res[i].buckets[1] >= 1 && res[i].stream_copies == 0 &&
              res[i].relayed == res[i].gradient_collectives * STEPS, "%s: the device path served %d allreduces, %d reduce-scatters, %d gathers over %d "
              "steps, %d collectives in all; the program's buckets a step: %d, %d, %d; %d copies on a copy stream", configs[i].name, res[i].calls[0],
              res[i].calls[1], res[i].calls[2], STEPS, res[i].relayed, res[i].buckets[0], res[i].buckets[1], res[i].buckets[2], res[i].stream_copies);
    }
    CHECK(res[14].buckets[0] == 1 && res[14].buckets[1] == 1 && res[14].buckets[2] == 1 && res[15].buckets[1] == 5,
          "ZeRO-1's buckets a step: %d, %d, %d in one of each kind; %d reduce-scatters in 512 B buckets, want 1, 1, 1; 5", res[14].buckets[0],
          res[14].buckets[1], res[14].buckets[2], res[15].buckets[1]);
    /* the device path holds no host buckets (their pinned buffers freed once a bucket has its device
     * buffer); the staged buckets hold at least every gradient's bytes (ZeRO-1: 2 ranks' blocks and the
     * shard, the gradients again, the shard and 2 blocks: 4 times) */
    size_t grads = sizeof(float) * (IN * HID + HID * HID + HID * OUT + HID + HID + OUT);
    CHECK(res[2].transfer_bytes >= grads && res[6].transfer_bytes >= 4 * grads && res[8].transfer_bytes == 0 && res[9].transfer_bytes == 0 &&
          res[14].transfer_bytes == 0 && res[15].transfer_bytes == 0 && res[17].transfer_bytes == 2 * sizeof(float), "host transfer buffers: staged %zu (ZeRO-1 %zu), "
          "want at least %zu (%zu); through the device path %zu, %zu, ZeRO-1 %zu, %zu, want none; ZeRO-2 %zu, want the norm's allreduce's staging %zu", res[2].transfer_bytes,
          res[6].transfer_bytes, grads, 4 * grads, res[8].transfer_bytes, res[9].transfer_bytes, res[14].transfer_bytes, res[15].transfer_bytes,
          res[17].transfer_bytes, 2 * sizeof(float));
    /* a rank lost inside the device path's collective (ZeRO-1's at the update, ZeRO-2's in backward): the
     * other's step fails, naming the bucket, within the peer timeout */
    for (int i = 18; i <= 22; i += 4) {
        const result *lost = &res[i];
        CHECK(!lost->ok && lost->failed_step == KILL_STEP && lost->status == PDDE_ERR_PEER_LOST && lost->failed_after <= 2.0 + 1.0 &&
              strstr(lost->error, "gradient bucket"), "%s: rank 1 killed: rank 0 got %s after %.2f s at step %d: %s", configs[i].name,
              pdde_status_str(lost->status), lost->failed_after, lost->failed_step, lost->error);
    }
    /* ...each started as it fills, its members (and their accumulations) after the next bucket has
     * started: the backward's kernels in between, beside the collective (all but the last of 5) */
    CHECK(res[20].overlapped >= 4 && res[21].overlapped >= 4 && res[23].overlapped == 0, "ZeRO-2's 512 B buckets with backward's kernels "
          "between their start and their members: %d (host), %d (device path) of 5, want at least 4; without overlap %d, want 0",
          res[20].overlapped, res[21].overlapped, res[23].overlapped);
    /* ZeRO-2's reduce-scatters, one a gradient in every micro-batch, travel in buckets like the others:
     * one a step (25 MiB), 5 in 512 B buckets, on the host or through the device path; unbucketed, 6 */
    CHECK(res[16].gradient_collectives == 12 && res[19].gradient_collectives == 2 && res[20].gradient_collectives == 10 &&
          res[17].buckets[1] == 1 && res[21].buckets[1] == 5 && res[19].buckets[1] == 1 && res[20].buckets[1] == 5,
          "ZeRO-2's data-parallel collectives a step: %d unbucketed, %d, %d bucketed, want 12, 2, 10; reduce-scatter buckets a step %d, %d "
          "(device path), %d, %d (host), want 1, 5, 1, 5", res[16].gradient_collectives, res[19].gradient_collectives, res[20].gradient_collectives,
          res[17].buckets[1], res[21].buckets[1], res[19].buckets[1], res[20].buckets[1]);
    /* the prediction covers what every run allocated: host staging and buckets, device buffers and
     * the device path's bucket buffers (equal, byte for byte); tp2 aside: pdde_plan_apply put its
     * loss's layer on the CPU, which its session params do not say */
    for (int i = 0; i < N; i++)
        if (res[i].ok && i != 13)
            CHECK(res[i].predicted_transfer == res[i].transfer_bytes && res[i].predicted_allocated == res[i].allocated_bytes,
                  "%s: pdde_predict_memory %zu host transfer bytes, %zu allocated; the session holds %zu, %zu", configs[i].name,
                  res[i].predicted_transfer, res[i].predicted_allocated, res[i].transfer_bytes, res[i].allocated_bytes);
    /* unbucketed on a device: each collective through the session's one staging buffer, as large as the
     * largest (w1's gradient in and out: 2 x 64 x 64 floats), pinned */
    CHECK(res[0].transfer_bytes == 2 * sizeof(float) * HID * HID, "unbucketed: %zu bytes of host staging, want %zu", res[0].transfer_bytes,
          2 * sizeof(float) * HID * HID);
    CHECK(res[9].streams == 5, "the 5 buckets' collectives on 5 streams of their own, not the device's: %d", res[9].streams);
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
