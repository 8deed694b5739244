/* test_sparse_device — a sparse table's batches trained on an accelerator (OpenCL: PoCL in CI) equal the
 * same batches on the CPU: the rows pushed after each batch, over batches whose unique ids differ, so
 * a gradient accumulator left holding an earlier batch's rows (the device-side zeroing of
 * pdde_sparse_batch_collect) shows as a wrong push. The batch order is fixed and the table is
 * in-process, so both runs see the same rows; the tolerance is the device's float order (1e-5).
 * pdde_sparse_batch_feed writes only the batch's rows and the empty slots' zero row: the local table
 * holds NaN before the first batch, and each batch's loss equals the one computed here from the rows
 * the table holds for the batch's ids (a row not written, or written in another's place, shows). Two
 * layouts of the same ids: bags of 3 mean-pooled (an empty slot weighs 0) and one id a field (an empty
 * slot reads the zero row itself). */
#include "pdde_extension.h"
#include "tests/test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { B = 4, K = 3, C = 4, SLOTS = B * 2 * K, BATCHES = 4, PROBE = 24 };
static int bag = K; /* ids a bag: K (mean pooling) or 1 (one id a field, summed); fields = SLOTS / B / bag */

/* batch i's ids: overlapping sets of different sizes (the second has fewer unique ids than the first, the
 * third more), empty slots and repeated ids */
static void batch_ids(int i, uint64_t *ids) {
    for (int s = 0; s < SLOTS; s++) {
        uint64_t id = i == 0 ? (uint64_t)s : i == 1 ? (uint64_t)(s % 5) : i == 2 ? (uint64_t)(100 + s) : (uint64_t)(s * 7 % 13);
        ids[s] = s % 5 == 4 ? PDDE_SPARSE_NO_ID : id;
    }
}

/* The loss of the graph below (the mean of the squared pooled bags) for a batch of ids, the rows pulled
 * from the table c holds now, in double. */
static pdde_status expected_loss(pdde_ps_client *c, const uint64_t *ids, double *loss) {
    float row[C];
    double sum = 0;
    for (int b = 0; b < SLOTS / bag; b++) {
        double pooled[C] = {0};
        int n = 0;
        for (int k = 0; k < bag; k++) {
            uint64_t id = ids[b * bag + k];
            if (id == PDDE_SPARSE_NO_ID) continue;
            pdde_status st = pdde_ps_client_pull(c, 1, &id, row);
            if (st) return st;
            for (int j = 0; j < C; j++) pooled[j] += row[j];
            n++;
        }
        for (int j = 0; j < C && n; j++) sum += (pooled[j] / n) * (pooled[j] / n);
    }
    *loss = sum / (SLOTS / bag * C);
    return PDDE_OK;
}

/* Trains BATCHES batches on device `device` (a context device index); rows: PROBE ids' rows after each
 * push ([BATCHES][PROBE][C]); *grad_device: the device of the table's gradient accumulator; *loss_ok:
 * every batch's loss was the expected one. */
static pdde_status train(pdde_context *ctx, int device, float *rows, int *grad_device, int *loss_ok) {
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    pdde_sparse_embedding *e = NULL;
    pdde_sparse_batch *sb = NULL;
    pdde_ps_client *c = NULL;
    pdde_graph_init(ctx, &g);
    pdde_tensor *pooled = pdde_sparse_embedding_init(g, "e", B, SLOTS / B / bag, bag, C, bag > 1 ? PDDE_POOL_MEAN : PDDE_POOL_SUM, &e);
    pdde_tensor *loss = pdde_mean(g, pdde_mul(g, pooled, pooled), -1, 0); /* (a gradient that depends on the rows) */
    pdde_ps_params pp = PDDE_PS_PARAMS_INIT;
    pp.table.dim = C, pp.table.optimizer = PDDE_PS_SGD, pp.table.lr = 5.0f, pp.table.init_std = 0.5f, pp.table.seed = 3;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device, sp.no_cpu_fallback = 1;
    pdde_status st = pdde_graph_status(g);
    if (!st) st = pdde_backward(g, loss);
    if (!st) st = pdde_session_init(g, &sp, &s);
    if (!st) st = pdde_ps_client_init(ctx, NULL, &pp, &c);
    if (!st) st = pdde_sparse_batch_init(e, &sb);
    if (!st) {
        pdde_tensor *table = pdde_graph_find(g, "e.rows");
        const pdde_tensor *grad = table && table->grad ? pdde_session_tensor(s, table->grad) : NULL;
        *grad_device = grad ? grad->device : -2;
        static float nan_rows[(SLOTS + 1) * C]; /* (what feed does not write stays NaN) */
        for (int i = 0; i < (SLOTS + 1) * C; i++) nan_rows[i] = NAN;
        st = pdde_session_write(s, table, nan_rows, sizeof nan_rows);
    }
    *loss_ok = 1;
    uint64_t ids[SLOTS], probe[PROBE];
    for (int i = 0; i < PROBE; i++) probe[i] = i < 12 ? (uint64_t)i : (uint64_t)(100 + i - 12);
    for (int i = 0; i < BATCHES && !st; i++) {
        batch_ids(i, ids);
        st = pdde_sparse_batch_pull(sb, c, ids);
        if (!st) st = pdde_sparse_batch_feed(sb, s);
        if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
        double want = 0;
        if (!st) st = expected_loss(c, ids, &want);
        if (!st && !test_close(pdde_session_loss(s), want, 1e-5, 1e-7)) {
            printf("batch %d on device %d: loss %.9g, from the table's rows %.9g\n", i, device, (double)pdde_session_loss(s), want);
            *loss_ok = 0;
        }
        if (!st) st = pdde_sparse_batch_collect(sb, s);
        if (!st) st = pdde_sparse_batch_push(sb, c);
        if (!st) st = pdde_ps_client_pull(c, PROBE, probe, rows + (size_t)i * PROBE * C);
    }
    pdde_sparse_batch_free(sb);
    pdde_ps_client_free(c);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_sparse_embedding_free(e);
    return st;
}

/* The rows after each batch on the accelerator of backend fam equal the CPU's (cpu). */
static void compare(pdde_context *ctx, const char *fam, const float *cpu) {
    int at_dev = pdde_device_find(ctx, fam, 0);
    if (at_dev < 0) {
        test_skip(fam, "no %s device: the sparse table on that accelerator", fam);
        return;
    }
    static float dev[BATCHES * PROBE * C];
    int grad_at = -1, loss_ok = 0;
    pdde_status st = train(ctx, at_dev, dev, &grad_at, &loss_ok);
    CHECK(!st, "%s: trains (%s)", fam, pdde_last_error(ctx));
    CHECK(loss_ok, "%s: every batch's loss is the one of its ids' rows (the rows feed writes)", fam);
    CHECK(grad_at == at_dev, "%s: the table's gradient accumulator lives on device %d (%d)", fam, at_dev, grad_at);
    for (int i = 0; i < BATCHES; i++) {
        int ok = !st, at = -1;
        for (int k = 0; k < PROBE * C && ok; k++) {
            size_t j = (size_t)i * PROBE * C + (size_t)k;
            if (!test_close(dev[j], cpu[j], 1e-5, 1e-6)) ok = 0, at = k;
        }
        CHECK(ok, "%s, batch %d: the rows after the push equal the CPU's (id %d: %g vs %g)", fam, i, at < 0 ? -1 : at / C,
              at < 0 ? 0.0 : (double)dev[(size_t)i * PROBE * C + (size_t)at], at < 0 ? 0.0 : (double)cpu[(size_t)i * PROBE * C + (size_t)at]);
    }
}

static void run_layout(void) {
    printf("bags of %d\n", bag);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu,opencl,cuda";
    cp.n_threads = 1;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) { CHECK(0, "context"); return; }
    static float cpu[BATCHES * PROBE * C];
    int grad_at = -1, loss_ok = 0;
    pdde_status st = train(ctx, 0, cpu, &grad_at, &loss_ok);
    CHECK(!st && grad_at == 0, "the CPU run trains, its gradient accumulator on the CPU (%d; %s)", grad_at, pdde_last_error(ctx));
    CHECK(loss_ok, "CPU: every batch's loss is the one of its ids' rows (the rows feed writes)");
    /* the rows move every batch (a push that does nothing would agree too) */
    int moved = !st;
    for (int i = 1; i < BATCHES; i++) moved &= memcmp(cpu + (size_t)i * PROBE * C, cpu + (size_t)(i - 1) * PROBE * C, PROBE * C * sizeof *cpu) != 0;
    CHECK(moved, "every batch changes the probed rows");
    compare(ctx, "opencl", cpu);
    compare(ctx, "cuda", cpu); /* (PDDE_CUDA_ZERO=1: zeroed by the device) */
    /* a backend without the zero slot: the OpenCL backend under another name, its zero slot removed (the
     * session writes zeros from the host) */
    const pdde_backend_iface *ocl = NULL;
    void *dev = NULL;
    int at = pdde_device_find(ctx, "opencl", 0);
    if (at >= 0 && !pdde_device_backend(ctx, at, &ocl, &dev)) {
        static pdde_backend_iface plain;
        plain = *ocl, plain.name = "opencl_plain", plain.zero = NULL;
        const pdde_backend_iface *extra[1] = {&plain};
        pdde_context_params cp2 = cp;
        cp2.backends = "cpu,opencl_plain", cp2.extra_backends = extra, cp2.n_extra_backends = 1;
        pdde_context *ctx2 = NULL;
        CHECK(!pdde_context_init(&cp2, &ctx2), "a context with the OpenCL backend lacking its zero slot");
        if (ctx2) compare(ctx2, "opencl_plain", cpu);
        pdde_context_free(ctx2);
    }
    pdde_context_free(ctx);
}

int main(void) {
    run_layout();
    bag = 1;
    run_layout();
    return test_finish();
}
