/* test_direct_grads — gradients written straight into their accumulators (lowering's PDDE_DIRECT_GRADS, on
 * unless =0). In a step that starts with zeroed gradients each parameter's gradient is written where it is
 * accumulated and the accumulation is skipped (0 + g is g). Nothing may change a number: on every device (the
 * CPU, and PoCL's OpenCL device in CI) a GPT's losses and final parameters equal, bit for bit, those of
 * PDDE_DIRECT_GRADS=0: in f32; in bf16 with the fusions a CUDA bf16 step runs (the bias gradient written beside
 * the weight's, which then lands in the bias's accumulator, placed past the weight's: PDDE_FUSE_BGRAD); and in
 * f32 with PDDE_FUSE_GRAD=1 (an accumulation that computes its matmul writes the product instead of adding it).
 * No accumulation runs in a step but those, against one a parameter without. Runs that start with gradients
 * left over accumulate instead: two PDDE_RUN_FORWARD_BACKWARD then PDDE_RUN_OPTIMIZER (the gradient read between
 * them too), and a gradient written before a step, give the bits of PDDE_DIRECT_GRADS=0. A step of two micro-batches
 * (the optimizer's grad_accum_steps): the first writes, the second accumulates. On 2 ranks (data parallel: buckets
 * reduced as their gradients are final; ZeRO-1: a sharded update; two micro-batches a step; two pipeline stages of
 * 4 micro-batches, 1F1B, and with 2 chunks a stage) the same. */
#define _GNU_SOURCE /* setenv */
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include "tests/gpt_test_steps.h"
#include <stdlib.h>
#include <string.h>

#define STEPS 5
#define WRITE_BEFORE 2 /* the step before which a gradient is written */

static const char *const cuda_bf16_fusions[] = {"PDDE_FUSE_EPILOGUE", "PDDE_FUSE_GRAD", "PDDE_FUSE_ADD_LN", "PDDE_BF16_LOGITS",
                                                "PDDE_BF16_GRADS",    "PDDE_ATT_LOWP",  "PDDE_FUSE_BGRAD",  "PDDE_FUSE_CE"};
enum { N_FUSIONS = sizeof cuda_bf16_fusions / sizeof cuda_bf16_fusions[0] };

static void set_fusions(int on) {
    for (int i = 0; i < N_FUSIONS; i++) on ? setenv(cuda_bf16_fusions[i], "1", 1) : unsetenv(cuda_bf16_fusions[i]);
}

typedef enum { STEPS_ONLY, TWO_BACKWARDS, GRAD_WRITTEN, MICRO_BATCHES } schedule;

typedef struct {
    float loss[STEPS], grad[64]; /* the losses; the first elements of a gradient read between two backwards */
    uint64_t params;             /* the final parameters' bytes, hashed */
    double accums_per_step;      /* grad_accum nodes run per step after the first */
    int n_params, n_fused;       /* parameters; accumulations that compute their matmul (PDDE_FUSE_GRAD: not written directly) */
} run_result;

static pdde_tensor *named(pdde_graph *g, const char *name) {
    for (int i = 0; i < pdde_graph_tensor_count(g); i++)
        if (!strcmp(pdde_graph_tensor(g, i)->name, name)) return (pdde_tensor *)pdde_graph_tensor(g, i);
    return NULL;
}

static int read_first(pdde_session *s, pdde_tensor *t, float *v, int n);

/* gpt_test_write_batch's batch `batch` as micro-batch `micro` of a step: 0, or -1 */
static int write_micro(pdde_session *s, const gpt_model *m, int micro, int batch) {
    int32_t x[4 * 16], y[4 * 16]; /* (the model's batch x ctx) */
    int n = m->cfg.batch * m->cfg.ctx;
    gpt_test_pattern(x, y, n, m->cfg.vocab, batch);
    return pdde_session_write_micro(s, m->ids, micro, x, (size_t)n * sizeof *x) || pdde_session_write_micro(s, m->targets, micro, y, (size_t)n * sizeof *y)
               ? -1 : 0;
}

/* A 2-layer GPT on `device` under dt, trained by `sched`, with lowering's PDDE_DIRECT_GRADS=direct */
static int train(pdde_context *ctx, int device, pdde_dtype dt, schedule sched, int direct, run_result *r) {
    setenv("PDDE_DIRECT_GRADS", direct ? "1" : "0", 1);
    /* (width 20: weight gradients of sizes that are not multiples of 256 bytes, so the bias's accumulator starts
     * past the weight's values, where the weight-gradient matmul writes the column sums: pdde_lowp_copy_offset) */
    gpt_config cfg = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 20, .batch = 4};
    pdde_graph *g;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    pdde_graph_set_compute_dtype(g, dt);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.weight_decay = 0.1f, op.clip_norm = 1.0f, op.grad_accum_steps = sched == MICRO_BATCHES ? 2 : 1;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    memset(r, 0, sizeof *r);
    if (gpt_build(g, &cfg, &m) || pdde_backward(g, m.loss) || pdde_optimizer_adamw(g, &op) || pdde_session_init(g, &sp, &s)) {
        fprintf(stderr, "session: %s\n", pdde_last_error(ctx));
        pdde_graph_free(g);
        return -1;
    }
    pdde_tensor *params[64], *read_grad = named(g, "h0.fc.w")->grad, *written = named(g, "h1.attn.b")->grad;
    for (int i = 0; i < pdde_graph_tensor_count(g) && r->n_params < 64; i++)
        if (pdde_graph_tensor(g, i)->flags & PDDE_TENSOR_PARAM) params[r->n_params++] = (pdde_tensor *)pdde_graph_tensor(g, i);
    float bias_grad[96];
    for (int i = 0; i < 96; i++) bias_grad[i] = 0.01f * (float)(i % 7) - 0.03f;
    int rc = 0;
    int64_t first = 0;
    for (int step = 0; step < STEPS && !rc; step++) {
        if (sched == TWO_BACKWARDS) { /* a step of two batches, accumulated by hand */
            rc |= gpt_test_write_batch(s, &m, 2 * step) || pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
            rc |= gpt_test_write_batch(s, &m, 2 * step + 1) || pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD);
            if (step == 1 && !rc) rc |= read_first(s, read_grad, r->grad, 64);
            rc |= pdde_session_run(s, PDDE_RUN_OPTIMIZER);
        } else if (sched == MICRO_BATCHES) { /* a step of two micro-batches (the optimizer's grad_accum_steps) */
            for (int micro = 0; micro < 2 && !rc; micro++) rc |= write_micro(s, &m, micro, 2 * step + micro);
            rc |= pdde_session_run(s, PDDE_RUN_STEP);
        } else {
            if (sched == GRAD_WRITTEN && step == WRITE_BEFORE) rc |= pdde_session_write(s, written, bias_grad, pdde_tensor_nbytes(written));
            rc |= gpt_test_write_batch(s, &m, step) || pdde_session_run(s, PDDE_RUN_STEP);
        }
        if (rc) fprintf(stderr, "step %d: %s\n", step, pdde_last_error(ctx));
        r->loss[step] = pdde_session_loss(s);
        if (step == 0) first = pdde_session_op_runs(s, PDDE_OP_GRAD_ACCUM);
    }
    r->accums_per_step = (double)(pdde_session_op_runs(s, PDDE_OP_GRAD_ACCUM) - first) / (STEPS - 1);
    for (int i = 0; i < pdde_session_node_count(s); i++)
        r->n_fused += pdde_session_node(s, i)->op == PDDE_OP_GRAD_ACCUM && pdde_session_node(s, i)->nsrc == 3;
    if (!rc && test_session_hash(s, params, r->n_params, &r->params)) rc = -1;
    pdde_session_free(s);
    pdde_graph_free(g);
    unsetenv("PDDE_DIRECT_GRADS");
    return rc;
}

/* The first n values of t (a session's f32 tensor) into v: 0, or -1 */
static int read_first(pdde_session *s, pdde_tensor *t, float *v, int n) {
    size_t bytes = pdde_tensor_nbytes(pdde_session_tensor(s, t));
    float *all = malloc(bytes);
    int rc = !all || pdde_session_read(s, t, all, bytes) ? -1 : 0;
    if (!rc) memcpy(v, all, (size_t)n * sizeof *v);
    free(all);
    return rc;
}

static int all_finite(const float *v, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

static void test_device(pdde_context *ctx, int device, const char *where) {
    static const char *const sched_names[] = {"steps", "two backwards a step", "a gradient written", "two micro-batches a step"};
    static const char *const variant_names[] = {"", " (a CUDA step's fusions)", " (PDDE_FUSE_GRAD=1)"};
    /* f32 with the device's defaults; bf16 with a CUDA step's fusions; f32 with the weight-gradient matmuls in their
     * accumulations (which then write, not add, the product), whose losses are those of the first, bit for bit */
    float unfused[MICRO_BATCHES + 1][STEPS];
    for (int variant = 0; variant < 3; variant++) {
        pdde_dtype dt = variant == 1 ? PDDE_BF16 : PDDE_F32;
        set_fusions(variant == 1);
        if (variant == 2) setenv("PDDE_FUSE_GRAD", "1", 1);
        for (schedule sched = STEPS_ONLY; sched <= MICRO_BATCHES; sched++) {
            run_result on, off;
            int failed = train(ctx, device, dt, sched, 1, &on) || train(ctx, device, dt, sched, 0, &off);
            char what[400];
            snprintf(what, sizeof what, "%s, %s%s, %s", where, pdde_dtype_name(dt), variant_names[variant], sched_names[sched]);
            CHECK(!failed, "%s: both sessions train", what);
            if (failed) continue;
            printf("%s: losses %.6f .. %.6f; accumulations a step %.1f (PDDE_DIRECT_GRADS=0: %.1f, %d parameters, %d computing a matmul)\n",
                   what, on.loss[0], on.loss[STEPS - 1], on.accums_per_step, off.accums_per_step, on.n_params, on.n_fused);
            CHECK(all_finite(on.loss, STEPS) && !memcmp(on.loss, off.loss, sizeof on.loss) && on.params == off.params,
                  "%s: the losses (last %.9g vs %.9g) and final parameters are those of PDDE_DIRECT_GRADS=0, bit for bit", what,
                  on.loss[STEPS - 1], off.loss[STEPS - 1]);
            CHECK(on.loss[STEPS - 1] < on.loss[0], "%s: it trains (loss %.6f -> %.6f)", what, on.loss[0], on.loss[STEPS - 1]);
            if (variant == 0) memcpy(unfused[sched], on.loss, sizeof on.loss);
            if (variant == 2)
                CHECK(!memcmp(unfused[sched], on.loss, sizeof on.loss), "%s: the losses of the matmuls apart, bit for bit (last %.9g vs %.9g)", what,
                      on.loss[STEPS - 1], unfused[sched][STEPS - 1]);
            if (sched == STEPS_ONLY)
                CHECK(on.accums_per_step == on.n_fused && off.accums_per_step == on.n_params, "%s: %.1f accumulations a step, those that compute "
                      "their matmul (%d); PDDE_DIRECT_GRADS=0: %.1f, one for each of %d parameters", what, on.accums_per_step, on.n_fused,
                      off.accums_per_step, on.n_params);
            if (sched == MICRO_BATCHES)
                CHECK(on.accums_per_step == on.n_params + on.n_fused && off.accums_per_step == 2 * on.n_params, "%s: %.1f accumulations a "
                      "step, the second micro-batch's (%d) and the first's that compute their matmul (%d); PDDE_DIRECT_GRADS=0: %.1f", what,
                      on.accums_per_step, on.n_params, on.n_fused, off.accums_per_step);
            if (sched == TWO_BACKWARDS) {
                CHECK(all_finite(on.grad, 64) && !memcmp(on.grad, off.grad, sizeof on.grad), "%s: the gradient summed over two backwards "
                      "(h0.fc.w.grad[0] %.9g vs %.9g)", what, on.grad[0], off.grad[0]);
                CHECK(on.accums_per_step > 0 && on.accums_per_step < off.accums_per_step, "%s: the second backward of a step accumulates "
                      "(%.1f accumulations a step, %.1f without)", what, on.accums_per_step, off.accums_per_step);
            }
        }
    }
    set_fusions(0);
}

#ifdef PDDE_HAVE_UCX
enum { RANK_STEPS = 4 };
typedef struct { int ok; char error[160]; float loss[2][RANK_STEPS]; double accums[2]; } rank_result;

/* arg: the gpt_plan; trains it with PDDE_DIRECT_GRADS=1, then =0 */
static void rank_train(pdde_context *ctx, pdde_comm *world, void *arg) {
    rank_result *out = test_rank_result;
    const gpt_plan *plan = arg;
    const gpt_config cfg = {.vocab = 64, .ctx = 8, .layers = 2, .heads = 2, .width = 32, .batch = 4};
    pdde_status st = PDDE_OK;
    for (int off = 0; off < 2 && !st; off++) {
        setenv("PDDE_DIRECT_GRADS", off ? "0" : "1", 1);
        pdde_graph *g;
        pdde_session *s;
        gpt_model m;
        st = gpt_test_rank_session(ctx, world, &cfg, plan, PDDE_F32, &g, &s, &m);
        for (int step = 0; step < RANK_STEPS && !st; step++) {
            st = gpt_test_rank_step(s, &m, plan, world, step);
            out->loss[off][step] = pdde_session_loss(s);
        }
        out->accums[off] = (double)pdde_session_op_runs(s, PDDE_OP_GRAD_ACCUM) / RANK_STEPS;
        pdde_session_free(s);
        pdde_graph_free(g);
    }
    unsetenv("PDDE_DIRECT_GRADS");
    out->ok = st == PDDE_OK;
    if (st) snprintf(out->error, sizeof out->error, "%s", pdde_last_error(ctx));
}

static void test_ranks(pdde_context *ctx) {
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    if (!srv) { CHECK(0, "store: %s", pdde_last_error(ctx)); return; }
    static const struct { const char *name; gpt_plan plan; } plans[] = {
        {"dp 2", {.dp = 2, .tp = 1, .pp = 1, .micro = 1}},
        {"dp 2, ZeRO-1", {.dp = 2, .tp = 1, .pp = 1, .micro = 1, .zero = 1}},
        {"dp 2, 2 micro-batches", {.dp = 2, .tp = 1, .pp = 1, .micro = 2}},
        {"pp 2, 4 micro-batches (1F1B)", {.dp = 1, .tp = 1, .pp = 2, .micro = 4}},
        {"pp 2, 2 chunks a stage, 4 micro-batches", {.dp = 1, .tp = 1, .pp = 2, .micro = 4, .pp_chunks = 2}},
    };
    for (size_t k = 0; k < sizeof plans / sizeof plans[0]; k++) {
        rank_result res[2];
        memset(res, 0, sizeof res);
        test_ranks_params tp = {.addr = addr, .prefix = plans[k].name, .timeout_s = 60, .n_threads = 1, .server = srv, .results = res,
                                .result_size = sizeof *res};
        CHECK(test_run_ranks(2, &tp, rank_train, (void *)&plans[k].plan, 300) == 0, "%s: the 2 ranks exit cleanly", plans[k].name);
        for (int r = 0; r < 2; r++) {
            CHECK(res[r].ok, "%s, rank %d: %s", plans[k].name, r, res[r].error);
            printf("%s, rank %d: losses %.6f .. %.6f; accumulations a step %.1f (PDDE_DIRECT_GRADS=0: %.1f)\n", plans[k].name, r,
                   res[r].loss[0][0], res[r].loss[0][RANK_STEPS - 1], res[r].accums[0], res[r].accums[1]);
            CHECK(res[r].ok && all_finite(res[r].loss[0], RANK_STEPS) && !memcmp(res[r].loss[0], res[r].loss[1], sizeof res[r].loss[0]) &&
                  res[r].accums[0] < res[r].accums[1], "%s, rank %d: the losses of PDDE_DIRECT_GRADS=0, bit for bit (last %.9g vs %.9g), with "
                  "fewer accumulations (%.1f a step vs %.1f)", plans[k].name, r, res[r].loss[0][RANK_STEPS - 1], res[r].loss[1][RANK_STEPS - 1],
                  res[r].accums[0], res[r].accums[1]);
        }
    }
    pdde_store_server_free(srv);
}
#endif

int main(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    setenv("PDDE_CUDA_LT", "0", 1); /* (bit for bit: one GEMM routine for a matmul with and without an epilogue) */
#ifdef PDDE_HAVE_UCX
    /* the ranks first: they are forked, and a device runtime's threads (PoCL's) may be in a sanitizer's allocator,
     * whose lock a child would inherit held (seen under ASan) */
    test_ranks(ctx);
#else
    test_skip("ucx", "pdde built without UCX: direct gradients on 2 ranks");
#endif
    test_device(ctx, 0, "cpu");
    if (pdde_device_count(ctx) < 2) test_skip("opencl", "no device besides the CPU (PoCL in CI): direct gradients on a GPU backend");
    for (int d = 1; d < pdde_device_count(ctx); d++) {
        pdde_device_props props;
        pdde_device_get_props(ctx, d, &props);
        char where[320];
        snprintf(where, sizeof where, "%s (%s)", props.name, props.backend);
        test_device(ctx, d, where);
    }
    pdde_context_free(ctx);
    return test_finish();
}
