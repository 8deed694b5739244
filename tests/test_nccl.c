/* test_nccl — pdde_nccl_collectives (comm/nccl.c), NCCL loaded at run time, on 2 forked ranks around a
 * store server on 127.0.0.1:
 *  - without libnccl (PDDE_NCCL_LIB naming a file that does not exist; here, where there is no
 *    libnccl, also the default search) every rank's init says PDDE_ERR_UNAVAILABLE and names what it
 *    tried, at once (no rank is left waiting in the bootstrap);
 *  - two ranks on one GPU (NCCL refuses them) are found from the group's device UUIDs before
 *    ncclCommInitRank (pdde_device_ids_shared, on made-up UUIDs here);
 *  - PDDE_DEVICE_COLLECTIVES (nccl or none) with another value is a clear error at the session's setup;
 *  - a data-parallel session given it trains all the same through host memory (its buckets staged),
 *    equal bit for bit to the run without it (on PoCL, the implementation offered for "opencl" so that
 *    the session asks it);
 *  - where a CUDA device and libnccl exist: allreduce (sum, avg), reduce-scatter and allgather on
 *    device buffers on the device's stream, against the sums computed here: on 2 ranks with 2 GPUs or
 *    more; NCCL refuses two ranks on one GPU, so with one GPU the group is 1 rank (bootstrap, the
 *    non-blocking init, the calls and the stream), and the 2-rank part is skipped saying so; and 2
 *    ranks on GPU 0 are declined by every rank at once, naming the two, before NCCL's init. */
#define _GNU_SOURCE
#include "pdde.h"
#include "pdde_extension.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    printf("SKIP ucx: pdde was built without comm (no UCX)\n0 passed, 0 failed, 1 skipped\n");
    return 0;
}
#else
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const pdde_store_server *g_server;

/* ---- unavailable ---- */

static void unavailable_rank(pdde_context *ctx, pdde_comm *comm, void *arg) {
    const char *lib = arg; /* PDDE_NCCL_LIB, or NULL: the default search */
    int me = pdde_comm_rank(comm);
    if (lib) setenv("PDDE_NCCL_LIB", lib, 1);
    else unsetenv("PDDE_NCCL_LIB");
    const pdde_backend_iface *be = NULL;
    void *dev = NULL;
    CHECK(pdde_device_backend(ctx, 0, &be, &dev) == PDDE_OK && be, "rank %d: device 0's backend: %s", me, pdde_last_error(ctx));
    const pdde_device_collectives_iface *dc = pdde_nccl_collectives();
    CHECK(dc && !strcmp(dc->name, "nccl") && !strcmp(dc->backend, "cuda") && dc->reduce_scatter && dc->allgather, "the NCCL iface's slots");
    pdde_device_collectives_params p = {ctx, comm, be, dev, 10};
    void *impl = (void *)1;
    double t0 = test_now();
    pdde_status st = dc->init(&p, &impl);
    const char *msg = pdde_last_error(ctx);
    char want[300];
    if (lib) snprintf(want, sizeof want, "nccl: rank %d: libnccl.so.2 not found (tried PDDE_NCCL_LIB=%s)", me, lib);
    else snprintf(want, sizeof want, "nccl: rank %d: ", me);
    CHECK(st == PDDE_ERR_UNAVAILABLE && impl == NULL && strstr(msg, want), "rank %d: init gave %s (%s), want unavailable with '%s'", me,
          pdde_status_str(st), msg, want);
    /* by default: libnccl is missing, or (where it exists) this device is no CUDA device */
    CHECK(lib || strstr(msg, "libnccl.so.2 not found (tried libnccl.so.2 on the loader's path") || strstr(msg, "NCCL serves CUDA devices only"),
          "rank %d: the default search: %s", me, msg);
    CHECK(test_now() - t0 < 5, "rank %d: unavailable after %.1f s", me, test_now() - t0);
    /* the group goes on working */
    int32_t one = 1, sum = 0;
    CHECK(pdde_comm_allreduce(comm, &one, &sum, 1, PDDE_I32, PDDE_REDUCE_SUM) == PDDE_OK && sum == 2, "rank %d: allreduce after: %d", me, sum);
}

/* ---- one GPU a rank: the decision before ncclCommInitRank, on made-up UUIDs ---- */

static void shared_devices(void) {
    unsigned char ids[4][16];
    memset(ids, 0, sizeof ids);
    for (int r = 0; r < 4; r++) ids[r][0] = (unsigned char)(0x10 + r), ids[r][15] = 0xab; /* 4 GPUs */
    int a = -1, b = -1;
    CHECK(!pdde_device_ids_shared(ids, 4, 16, &a, &b), "4 ranks on 4 GPUs: none shared, got ranks %d and %d", a, b);
    memcpy(ids[1], ids[0], 16); /* 2 ranks on GPU 0 (as under CUDA_VISIBLE_DEVICES=0 for both) */
    CHECK(pdde_device_ids_shared(ids, 2, 16, &a, &b) && a == 0 && b == 1, "2 ranks on one GPU: ranks %d and %d, want 0 and 1", a, b);
    memcpy(ids[1], ids[2], 16), ids[1][1] = 1, memcpy(ids[3], ids[1], 16); /* ranks 1 and 3 share, 0 and 2 differ */
    CHECK(pdde_device_ids_shared(ids, 4, 16, &a, &b) && a == 1 && b == 3, "ranks 1 and 3 on one GPU: ranks %d and %d", a, b);
    memset(ids, 0, sizeof ids); /* ids the driver did not give (zeros): unknown, not one device */
    CHECK(!pdde_device_ids_shared(ids, 4, 16, &a, &b), "unknown ids are not one device");
    CHECK(!pdde_device_ids_shared(ids, 1, 16, &a, &b), "one rank shares nothing");
    printf("one GPU a rank: two ranks on one device are found before NCCL's init %s\n", test_failed ? "FAILED" : "ok");
}

/* ---- the session's fallback ---- */

#define STEPS 4
typedef struct {
    float losses[STEPS];
    uint64_t param_hash;
    int ok;
    char error[200];
} result;

static pdde_device_collectives_iface g_nccl_on_opencl; /* NCCL's, offered for OpenCL's devices */

static void train(pdde_context *ctx, pdde_comm *comm, void *arg) {
    int with_nccl = *(int *)arg;
    result *out = test_rank_result;
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_graph_init(ctx, &g);
    pdde_graph_set_layer(g, 0);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){8, 16}), *y = pdde_input(g, "y", PDDE_I32, 1, (int64_t[]){8});
    pdde_tensor *w0 = pdde_param(g, "w0", 2, (int64_t[]){16, 32}, 0.2f), *w1 = pdde_param(g, "w1", 2, (int64_t[]){32, 8}, 0.2f);
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, pdde_gelu(g, pdde_matmul(g, x, w0, 0, 0)), w1, 0, 0), y);
    pdde_plan plan;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-2f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = comm;
    sp.device = pdde_device_find(ctx, "opencl", 0);
    sp.gradient_bucket_bytes = 0; /* one bucket */
    if (with_nccl == 1) sp.device_collectives = &g_nccl_on_opencl;
    setenv("PDDE_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
    float xs[8 * 16];
    int32_t ys[8];
    if (sp.device < 0) { snprintf(out->error, sizeof out->error, "no OpenCL device"); goto done; }
    if (with_nccl == 2) { /* a value the switch does not know: a clear error */
        setenv("PDDE_DEVICE_COLLECTIVES", "nccl2", 1);
        pdde_status st = pdde_plan_parse("dp=2", &plan) ? PDDE_ERR_INVALID_ARG : pdde_plan_apply(g, &plan, loss, &op, &sp, &s);
        out->ok = st == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "PDDE_DEVICE_COLLECTIVES=nccl2: expected nccl or none");
        if (!out->ok) snprintf(out->error, sizeof out->error, "PDDE_DEVICE_COLLECTIVES=nccl2 gave %s: %s", pdde_status_str(st), pdde_last_error(ctx));
        goto done;
    }
    if (pdde_plan_parse("dp=2", &plan) || pdde_plan_apply(g, &plan, loss, &op, &sp, &s)) {
        snprintf(out->error, sizeof out->error, "setup: %s", pdde_last_error(ctx));
        goto done;
    }
    for (int step = 0; step < STEPS; step++) {
        for (int i = 0; i < 8 * 16; i++) xs[i] = (float)((i * 37 + step * 11) % 23) / 23.0f - 0.5f;
        for (int i = 0; i < 8; i++) ys[i] = (i * 5 + step * 3) % 8;
        if (pdde_session_write_global(s, x, xs, sizeof xs) || pdde_session_write_global(s, y, ys, sizeof ys) || pdde_session_run(s, PDDE_RUN_STEP)) {
            snprintf(out->error, sizeof out->error, "step %d: %s", step, pdde_last_error(ctx));
            goto done;
        }
        out->losses[step] = pdde_session_loss(s);
    }
    if (test_session_hash(s, (pdde_tensor *[]){w0, w1}, 2, &out->param_hash)) {
        snprintf(out->error, sizeof out->error, "read: %s", pdde_last_error(ctx));
        goto done;
    }
    out->ok = 1;
done:
    pdde_session_free(s);
    pdde_graph_free(g);
}

/* ---- on a GPU ---- */

static void gpu_rank(pdde_context *ctx, pdde_comm *comm, void *arg) {
    (void)arg;
    int me = pdde_comm_rank(comm), n = pdde_comm_size(comm);
    const pdde_backend_iface *be = NULL;
    void *dev = NULL, *impl = NULL, *a = NULL, *b = NULL;
    int d = pdde_device_find(ctx, "cuda", me);
    CHECK(d >= 0 && pdde_device_backend(ctx, d, &be, &dev) == PDDE_OK, "rank %d: CUDA device %d: %s", me, me, pdde_last_error(ctx));
    if (test_failed) return;
    const pdde_device_collectives_iface *dc = pdde_nccl_collectives();
    pdde_device_collectives_params p = {ctx, comm, be, dev, 60};
    pdde_status st = dc->init(&p, &impl);
    CHECK(st == PDDE_OK, "rank %d: nccl init: %s", me, pdde_last_error(ctx));
    if (st) return;
    enum { COUNT = 1 << 16 };
    float *h = malloc(COUNT * sizeof *h * (size_t)n), *r = malloc(COUNT * sizeof *r * (size_t)n);
    for (int i = 0; i < COUNT; i++) h[i] = (float)((i % 97) + 100 * me);
    st = be->buffer_alloc(dev, COUNT * sizeof(float) * (size_t)n, &a);
    if (!st) st = be->buffer_alloc(dev, COUNT * sizeof(float) * (size_t)n, &b);
    CHECK(st == PDDE_OK, "rank %d: buffers: %s", me, pdde_last_error(ctx));
    size_t bad = 0;
    /* allreduce, sum: sum over ranks of (i % 97) + 100 r */
    if (!st) st = be->write(dev, NULL, a, 0, h, COUNT * sizeof(float));
    if (!st) st = dc->allreduce(impl, NULL, a, 0, COUNT, PDDE_F32, PDDE_REDUCE_SUM);
    if (!st) st = be->read(dev, NULL, a, 0, r, COUNT * sizeof(float));
    if (!st) st = be->stream_sync(dev, NULL);
    for (int i = 0; i < COUNT && !st; i++) bad += r[i] != (float)(n * (i % 97) + 100 * n * (n - 1) / 2);
    CHECK(st == PDDE_OK && !bad, "rank %d: allreduce sum: %s, %zu wrong", me, pdde_last_error(ctx), bad);
    /* allreduce, avg, at an offset */
    if (!st) st = be->write(dev, NULL, a, 256, h, 1000 * sizeof(float));
    if (!st) st = dc->allreduce(impl, NULL, a, 256, 1000, PDDE_F32, PDDE_REDUCE_AVG);
    if (!st) st = be->read(dev, NULL, a, 256, r, 1000 * sizeof(float));
    if (!st) st = be->stream_sync(dev, NULL);
    for (int i = 0; i < 1000 && !st; i++) bad += r[i] != (float)(i % 97) + 50.0f * (float)(n - 1);
    CHECK(st == PDDE_OK && !bad, "rank %d: allreduce avg: %s, %zu wrong", me, pdde_last_error(ctx), bad);
    /* reduce-scatter of n blocks of COUNT / n, then allgather them back */
    size_t blk = COUNT / (size_t)n;
    if (!st) st = be->write(dev, NULL, a, 0, h, COUNT * sizeof(float));
    if (!st && dc->reduce_scatter) st = dc->reduce_scatter(impl, NULL, a, 0, b, 0, blk, PDDE_F32, PDDE_REDUCE_SUM);
    if (!st && dc->allgather) st = dc->allgather(impl, NULL, b, 0, a, 0, blk, PDDE_F32);
    if (!st) st = be->read(dev, NULL, a, 0, r, COUNT * sizeof(float));
    if (!st) st = be->stream_sync(dev, NULL);
    for (int i = 0; i < (int)(blk * (size_t)n) && !st; i++) bad += r[i] != (float)(n * (i % 97) + 100 * n * (n - 1) / 2);
    CHECK(st == PDDE_OK && !bad, "rank %d: reduce-scatter + allgather: %s, %zu wrong", me, pdde_last_error(ctx), bad);
    printf("rank %d of %d: NCCL allreduce, reduce-scatter, allgather on CUDA device %d: %s\n", me, n, d, st || bad ? "FAILED" : "ok");
    if (a) be->buffer_free(dev, a);
    if (b) be->buffer_free(dev, b);
    dc->free(impl);
    free(h), free(r);
}

/* Two ranks on CUDA device 0: every rank's init says unavailable at once, naming the two ranks,
 * without calling ncclCommInitRank (which would fail with "duplicate GPU"). */
static void same_gpu_rank(pdde_context *ctx, pdde_comm *comm, void *arg) {
    (void)arg;
    int me = pdde_comm_rank(comm);
    const pdde_backend_iface *be = NULL;
    void *dev = NULL, *impl = (void *)1;
    int d = pdde_device_find(ctx, "cuda", 0);
    CHECK(d >= 0 && pdde_device_backend(ctx, d, &be, &dev) == PDDE_OK, "rank %d: CUDA device 0: %s", me, pdde_last_error(ctx));
    if (test_failed) return;
    pdde_device_collectives_params p = {ctx, comm, be, dev, 30};
    double t0 = test_now();
    pdde_status st = pdde_nccl_collectives()->init(&p, &impl);
    CHECK(st == PDDE_ERR_UNAVAILABLE && !impl && strstr(pdde_last_error(ctx), "ranks 0 and 1 of the group share one GPU") && test_now() - t0 < 10,
          "rank %d: two ranks on one GPU: %s after %.1f s: %s", me, pdde_status_str(st), test_now() - t0, pdde_last_error(ctx));
    printf("rank %d: two ranks on one GPU: %s\n", me, pdde_last_error(ctx));
}

/* Asked in a child process (device runtimes do not survive fork()): the CUDA devices, and whether
 * libnccl loads (as comm/nccl.c looks for it). */
static int probe(int *n_gpus) {
    int fds[2];
    if (pipe(fds)) return 0;
    pid_t pid = fork();
    if (pid == 0) {
        pdde_context *c;
        pdde_context_init(NULL, &c);
        int k = 0;
        while (pdde_device_find(c, "cuda", k) >= 0) k++;
        const char *env = getenv("PDDE_NCCL_LIB");
        int lib = dlopen(env && *env ? env : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL) != NULL;
        int v[2] = {k, lib};
        if (write(fds[1], v, sizeof v) != (ssize_t)sizeof v) _exit(1);
        _exit(0);
    }
    close(fds[1]);
    int v[2] = {0, 0};
    if (read(fds[0], v, sizeof v) != (ssize_t)sizeof v) v[0] = v[1] = 0;
    close(fds[0]);
    waitpid(pid, NULL, 0);
    *n_gpus = v[0];
    return v[1];
}

static int opencl_exists(void) {
    pid_t pid = fork();
    if (pid == 0) {
        pdde_context *c;
        pdde_context_init(NULL, &c);
        _exit(pdde_device_find(c, "opencl", 0) >= 0 ? 0 : 1);
    }
    int status = 1;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int main(void) {
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    if (!srv) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    g_server = srv;

    shared_devices();
    /* unavailable: a named file that does not exist, then the default search */
    static const char *libs[] = {"/nonexistent/libnccl.so.2", NULL};
    for (int k = 0; k < 2; k++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "unavail%d", k);
        test_ranks_params tp = {.addr = addr, .prefix = prefix, .timeout_s = 30, .peer_timeout_s = 5, .server = srv};
        setenv("PDDE_BACKENDS", "cpu", 1);
        test_run_ranks(2, &tp, unavailable_rank, (void *)libs[k], 60);
        unsetenv("PDDE_BACKENDS");
    }
    printf("unavailable: every rank says so at once %s\n", test_failed ? "FAILED" : "ok");

    /* the session's fallback to host memory, on PoCL */
    if (!opencl_exists()) {
        test_skip("opencl", "no OpenCL device (PoCL in CI): the session's fallback is not run");
    } else {
        g_nccl_on_opencl = *pdde_nccl_collectives();
        g_nccl_on_opencl.backend = "opencl";
        result res[3][2];
        memset(res, 0, sizeof res);
        for (int with = 0; with < 3; with++) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "session%d", with);
            test_ranks_params tp = {.addr = addr, .prefix = prefix, .timeout_s = 60, .n_threads = 1, .server = srv, .device_runtimes = 1,
                                    .results = res[with], .result_size = sizeof(result)};
            test_run_ranks(2, &tp, train, &with, 120);
            for (int r = 0; r < 2; r++) CHECK(res[with][r].ok, "session %s, rank %d: %s", with == 2 ? "with PDDE_DEVICE_COLLECTIVES wrong" : with ? "with NCCL" : "without NCCL", r, res[with][r].error);
        }
        int finite = 1;
        for (int i = 0; i < STEPS; i++) finite &= isfinite(res[0][0].losses[i]);
        CHECK(finite && res[0][0].losses[STEPS - 1] < res[0][0].losses[0], "the loss falls: %g -> %g", res[0][0].losses[0], res[0][0].losses[STEPS - 1]);
        CHECK(res[1][0].ok && !memcmp(res[1][0].losses, res[0][0].losses, sizeof res[0][0].losses) && res[1][0].param_hash == res[0][0].param_hash,
              "with NCCL unavailable the session's losses and parameters equal those without it bit for bit");
        printf("session given NCCL where it is unavailable: losses %.6f -> %.6f, as without it: %s\n", res[1][0].losses[0],
               res[1][0].losses[STEPS - 1], res[1][0].param_hash == res[0][0].param_hash ? "ok" : "FAILED");
    }

    /* on a GPU */
    int n_gpus = 0, have_nccl = probe(&n_gpus);
    if (!n_gpus || !have_nccl) {
        test_skip("gpu", n_gpus ? "no libnccl.so.2 (PDDE_NCCL_LIB names one)" : "no CUDA device");
    } else {
        int n = n_gpus >= 2 ? 2 : 1;
        test_ranks_params tp = {.addr = addr, .prefix = "gpu", .timeout_s = 60, .peer_timeout_s = 10, .server = srv, .device_runtimes = 1};
        test_run_ranks(n, &tp, gpu_rank, NULL, 120);
        if (n == 1) test_skip("nccl-2-ranks", "one GPU: NCCL refuses two ranks on one GPU (duplicate GPU), so the group was 1 rank");
        test_ranks_params ts = {.addr = addr, .prefix = "samegpu", .timeout_s = 60, .peer_timeout_s = 10, .server = srv, .device_runtimes = 1};
        test_run_ranks(2, &ts, same_gpu_rank, NULL, 60);
    }
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
#endif
