/* test_amp — mixed precision (pdde_graph_set_compute_dtype).
 *
 * 1. bf16 golden: the small GPT of tests/data/gpt_golden_bf16.bin, which tools/gen_golden.py --bf16
 *    wrote from 10 AdamW steps of torch under torch.autocast("cpu", bfloat16). pdde's bf16 run must
 *    follow torch's bf16 run more closely than torch's own f32 run does (gpt_golden.bin): so a bf16
 *    path that silently computed in f32, or rounded more than bf16 does, fails. The f32 result is
 *    test_gpt_golden's, unchanged.
 * 2. The graph: every matmul reads bf16, every weight is converted once per step, norms, softmax,
 *    the loss and the optimizer stay f32; the activation arena shrinks.
 * 3. f16 dynamic loss scaling: an overflow (an input beyond f16's range at one step) skips exactly
 *    that step, halves the scale and changes no parameter; training then goes on and the loss falls;
 *    a scale too large for the gradients is halved step by step until they fit; 2000 good steps double
 *    it; a checkpoint keeps the scale and the f32 masters.
 * 4. f16 loss scaling on 4 ranks (dp 2 x pp 2, forked around a store as pdde-run starts them): an
 *    overflow injected on one stage of one data-parallel rank (its loss scale set far too large, so
 *    its backward overflows) makes every rank skip the same steps with the same scale on every rank,
 *    and no rank changes a parameter in the skipped step; training then goes on, the loss falling.
 * 5. f16 loss scaling with a pipeline stage that has no parameters (no update node, so it never
 *    reaches the check before the update): the loss head alone on the last stage, or an input
 *    transform alone on the first; 2 ranks under pdde-run: the job completes, an overflow on the
 *    other stage is skipped by both ranks together, with one scale. */
#define _GNU_SOURCE /* usleep, unsetenv (comm_test_util.h) */
#include "tests/gpt_golden.h"
#include "tests/test_util.h"
#ifdef PDDE_HAVE_UCX /* the ranks test (4.) */
#include "tests/comm_test_util.h"
#endif
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Tolerances against torch's autocast run (measured with oneDNN; printed each run). torch rounds every
 * matmul output to bf16 and runs softmax in bf16 where pdde keeps f32 (autocast's CPU op lists), so the
 * two bf16 runs differ by about as much as either differs from f32 on this small-signal model (losses
 * 1.4e-4 apart): the golden comparison bounds the error, and the bf16 path is told from an f32 one by
 * the graph checks below and by the bf16 losses differing from pdde's own f32 ones. */
#define TOL_LOSS_BF16 1e-3    /* |pdde bf16 - torch bf16| over the 10 losses; measured 1.9e-4 */
#define TOL_LOGITS_BF16 2e-2  /* step 0, relative to the largest logit; measured 3.5e-3 */
#define TOL_GRAD_BF16 5e-2    /* step 0, worst parameter gradient, relative to its largest; measured 8.6e-3 */
#define MIN_BF16_SHIFT 1e-5   /* pdde bf16 vs pdde f32 losses: bf16 rounding moves them; measured 8.2e-5 */

static double max_abs_diff(const float *a, const float *b, int n) {
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= worst)) worst = d; /* NaN counts as huge */
    }
    return worst;
}

/* Runs the fixture's 10 steps under dt; losses[] gets each step's loss, step 0's logits and gradient
 * errors against fx are returned through the pointers. */
static void golden_run(pdde_context *ctx, const golden_fixture *fx, pdde_dtype dt, float *losses, double *logit_err, double *grad_err) {
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    gpt_model m = {0};
    pdde_status st = golden_session(ctx, fx, dt, &g, &m, &s);
    CHECK(st == PDDE_OK, "%s model: %s", pdde_dtype_name(dt), pdde_last_error(ctx));
    *logit_err = *grad_err = INFINITY;
    if (st == PDDE_OK && (st = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD)) == PDDE_OK) {
        float *logits = malloc((size_t)fx->BT * fx->cfg.vocab * 4);
        pdde_session_read(s, m.logits, logits, (size_t)fx->BT * fx->cfg.vocab * 4);
        *logit_err = golden_rel_err(logits, fx->logits, (int64_t)fx->BT * fx->cfg.vocab);
        free(logits);
        *grad_err = 0;
        for (uint32_t i = 0; i < fx->n_params; i++) {
            pdde_tensor *t = pdde_graph_find(g, fx->grads[i].name);
            float *gb = malloc((size_t)fx->grads[i].n * 4);
            pdde_session_read(s, t->grad, gb, (size_t)fx->grads[i].n * 4);
            double e = golden_rel_err(gb, fx->grads[i].data, fx->grads[i].n);
            if (!(e <= *grad_err)) *grad_err = e;
            free(gb);
        }
        losses[0] = pdde_session_loss(s);
        st = pdde_session_run(s, PDDE_RUN_OPTIMIZER);
        for (int k = 1; k < fx->n_steps && st == PDDE_OK; k++) {
            st = pdde_session_run(s, PDDE_RUN_STEP);
            losses[k] = pdde_session_loss(s);
        }
    }
    CHECK(st == PDDE_OK, "%s run: %s", pdde_dtype_name(dt), pdde_last_error(ctx));
    pdde_session_free(s);
    pdde_graph_free(g);
}

static void test_golden_bf16(pdde_context *ctx) {
    golden_fixture bf, f32;
    const char *why = "";
    int ok = golden_load("tests/data/gpt_golden_bf16.bin", &bf, &why);
    CHECK(ok, "tests/data/gpt_golden_bf16.bin: %s", why);
    int ok32 = golden_load("tests/data/gpt_golden.bin", &f32, &why);
    CHECK(ok32, "tests/data/gpt_golden.bin: %s", why);
    if (ok && ok32) {
        float l_bf16[64], l_f32[64];
        double le, ge, le32, ge32;
        golden_run(ctx, &bf, PDDE_BF16, l_bf16, &le, &ge);
        golden_run(ctx, &bf, PDDE_F32, l_f32, &le32, &ge32);
        int n = bf.n_steps;
        double d_bf16 = max_abs_diff(l_bf16, bf.losses, n), d_f32 = max_abs_diff(l_f32, bf.losses, n);
        double torch_gap = max_abs_diff(f32.losses, bf.losses, n);
        printf("losses vs torch bf16 autocast: pdde bf16 %.2g (tolerance %.2g), pdde f32 %.2g, torch f32 %.2g\n", d_bf16,
               TOL_LOSS_BF16, d_f32, torch_gap);
        printf("step 0 vs torch bf16: logits rel err %.2g (f32 run %.2g, tolerance %.2g), worst gradient %.2g (f32 run %.2g, tolerance %.2g)\n",
               le, le32, TOL_LOGITS_BF16, ge, ge32, TOL_GRAD_BF16);
        for (int k = 0; k < n; k++) printf("  step %d loss bf16 %.6f torch bf16 %.6f | f32 %.6f torch f32 %.6f\n", k, l_bf16[k], bf.losses[k], l_f32[k], f32.losses[k]);
        double shift = max_abs_diff(l_bf16, l_f32, n);
        printf("pdde bf16 vs pdde f32 losses: %.2g (at least %.2g)\n", shift, MIN_BF16_SHIFT);
        CHECK(d_bf16 <= TOL_LOSS_BF16, "bf16 losses %.3g from torch's bf16 run (tolerance %.3g)", d_bf16, TOL_LOSS_BF16);
        CHECK(shift >= MIN_BF16_SHIFT, "the bf16 run is %.3g from the f32 run: it computed in f32", shift);
        CHECK(le <= TOL_LOGITS_BF16 && ge <= TOL_GRAD_BF16, "step 0 vs torch bf16: logits %.3g, gradients %.3g", le, ge);
        CHECK(l_bf16[n - 1] < l_bf16[0] - 0.3, "bf16 training does not learn: %.4f -> %.4f", l_bf16[0], l_bf16[n - 1]);
    }
    golden_free(&bf), golden_free(&f32);
}

/* ------------------------------------------------------------------------------------------------ */

static const gpt_config MEM_CFG = {.vocab = 256, .ctx = 64, .layers = 2, .heads = 4, .width = 128, .batch = 8};

static pdde_session *gpt_session(pdde_context *ctx, pdde_dtype dt, pdde_graph **g) {
    gpt_model m;
    gpt_config cfg = MEM_CFG;
    pdde_session *s = NULL;
    pdde_graph_init(ctx, g);
    pdde_graph_set_compute_dtype(*g, dt);
    gpt_build(*g, &cfg, &m);
    pdde_backward(*g, m.loss);
    pdde_optimizer_adamw(*g, NULL);
    CHECK(pdde_session_init(*g, NULL, &s) == PDDE_OK, "%s session: %s", pdde_dtype_name(dt), pdde_last_error(ctx));
    return s;
}

static void test_graph_and_memory(pdde_context *ctx) {
    pdde_graph *g32, *g16;
    pdde_session *s32 = gpt_session(ctx, PDDE_F32, &g32), *s16 = gpt_session(ctx, PDDE_BF16, &g16);
    if (!s32 || !s16) return;
    int matmuls = 0, lowp = 0, attentions = 0, attentions_lowp = 0, param_casts = 0, f32_others = 0, others = 0;
    int *casts_of = calloc((size_t)pdde_graph_tensor_count(g16), sizeof *casts_of);
    for (int i = 0; i < pdde_graph_tensor_count(g16); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g16, i);
        if (t->op == PDDE_OP_MATMUL) matmuls++, lowp += t->src[0]->dtype == PDDE_BF16 && t->src[1]->dtype == PDDE_BF16 && t->dtype == PDDE_F32;
        else if (t->op == PDDE_OP_ATTENTION || t->op == PDDE_OP_ATTENTION_BACK) { /* a bf16 op of autocast's too */
            int lowp_in = 1, n_in = t->op == PDDE_OP_ATTENTION ? t->nsrc : t->nsrc - 2; /* q, k, v (or qkv packed) */
            for (int k = 0; k < n_in; k++) lowp_in &= t->src[k]->dtype == PDDE_BF16;
            attentions++, attentions_lowp += lowp_in && t->dtype == PDDE_F32;
        }
        else if (t->op == PDDE_OP_CAST && (t->src[0]->flags & PDDE_TENSOR_PARAM)) param_casts++, casts_of[t->src[0]->id]++;
        else if (t->op != PDDE_OP_NONE && t->op != PDDE_OP_CAST && t->op != PDDE_OP_RESHAPE) {
            others++;
            int in_f32 = t->dtype == PDDE_F32;
            for (int k = 0; k < t->nsrc; k++) /* (an update also rewrites its weight's bf16 copy: the cast's output) */
                in_f32 &= t->src[k]->dtype == PDDE_F32 || t->src[k]->dtype == PDDE_I32 ||
                          (t->op == PDDE_OP_ADAMW_UPDATE && k == t->nsrc - 1 && (t->src[k]->flags & PDDE_TENSOR_SHADOW));
            f32_others += in_f32;
        }
    }
    int twice = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g16); i++) twice += casts_of[i] > 1;
    free(casts_of);
    int weights = 1 + 4 * MEM_CFG.layers; /* wte (the tied head) and attn, proj, fc, fcproj of each block */
    printf("bf16 graph: %d of %d matmuls bf16 x bf16 -> f32, %d of %d attention nodes bf16 q, k, v -> f32, %d weight conversions (%d weights), "
           "%d of %d other ops f32\n", lowp, matmuls, attentions_lowp, attentions, param_casts, weights, f32_others, others);
    CHECK(matmuls > 0 && lowp == matmuls, "%d of %d matmuls run in bf16", lowp, matmuls);
    CHECK(attentions == 2 * MEM_CFG.layers && attentions_lowp == attentions, "%d of %d attention nodes read bf16 (want %d)", attentions_lowp,
          attentions, 2 * MEM_CFG.layers);
    CHECK(param_casts == weights && twice == 0, "%d weight conversions (want %d, one per weight; %d converted twice)", param_casts, weights, twice);
    CHECK(f32_others == others, "%d of %d norm/softmax/loss/optimizer/elementwise ops are not all-f32", others - f32_others, others);

    pdde_memory_stats m32, m16;
    pdde_session_memory(s32, &m32), pdde_session_memory(s16, &m16);
    double ratio = (double)m16.activation_peak_bytes / (double)m32.activation_peak_bytes;
    printf("activations alive at the peak: f32 %zu bytes, bf16 %zu bytes (%.2fx; arenas %zu and %zu); parameters %zu / %zu bytes (f32 masters)\n",
           m32.activation_peak_bytes, m16.activation_peak_bytes, ratio, m32.arena_bytes, m16.arena_bytes, m32.param_bytes, m16.param_bytes);
    /* (measured 0.88: the packed attention keeps no f32 copies of q, k, v in the f32 run either) */
    CHECK(ratio < 0.9 && m16.arena_bytes < m32.arena_bytes, "bf16 activations at the peak are %.2fx the f32 ones (arena %zu vs %zu)", ratio,
          m16.arena_bytes, m32.arena_bytes);
    /* f32 masters as in f32, and a bf16 copy of each weight that the matmuls read (kept by its update) */
    size_t copies = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g16); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g16, i);
        if (t->op == PDDE_OP_CAST && (t->src[0]->flags & PDDE_TENSOR_PARAM)) copies += pdde_tensor_nbytes(t);
    }
    CHECK(m16.param_bytes == m32.param_bytes + copies && m16.optimizer_bytes == m32.optimizer_bytes,
          "masters (and their bf16 copies, %zu bytes) or optimizer state changed size: %zu vs %zu bytes", copies, m16.param_bytes, m32.param_bytes);
    /* the memory plan predicted without a session is what the bf16 session allocated */
    pdde_memory_stats lowered;
    CHECK(pdde_predict_memory(g16, NULL, 0, 0, &lowered) == PDDE_OK && lowered.allocated_bytes == m16.allocated_bytes && lowered.arena_bytes == m16.arena_bytes &&
              lowered.activation_bytes == m16.activation_bytes && lowered.n_nodes == m16.n_nodes,
          "bf16: predicted memory %zu bytes (arena %zu), the session's %zu (arena %zu)", lowered.allocated_bytes, lowered.arena_bytes,
          m16.allocated_bytes, m16.arena_bytes);
    pdde_loss_scale_stats sc;
    CHECK(pdde_session_loss_scale(s16, &sc) == PDDE_OK && !sc.enabled && sc.scale == 1.0f, "bf16 scales its loss (enabled %d)", sc.enabled);
    CHECK(pdde_session_set_loss_scale(s16, 2.0f) == PDDE_ERR_STATE, "set_loss_scale on a bf16 session");
    /* the planner's memory model sees the 2-byte activations too */
    double flops = 1e11, bw = 1e10, mem = 1e12;
    pdde_plan_devices dev = {.n_devices = 1, .flops = &flops, .mem_bw = &bw, .memory = &mem};
    pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
    pp.batch = MEM_CFG.batch;
    pdde_plan p32 = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .chunks = 1}, p16 = p32;
    CHECK(pdde_plan_evaluate(g32, &dev, &pp, &p32) == PDDE_OK && pdde_plan_evaluate(g16, &dev, &pp, &p16) == PDDE_OK, "plan: %s",
          pdde_last_error(ctx));
    printf("planner's predicted peak: f32 %.0f bytes, bf16 %.0f bytes (%.2fx)\n", p32.peak_bytes, p16.peak_bytes, p16.peak_bytes / p32.peak_bytes);
    CHECK(p16.peak_bytes < 0.93 * p32.peak_bytes, /* (measured 0.92) */ "the planner predicts %.0f bytes for bf16, %.0f for f32", p16.peak_bytes, p32.peak_bytes);
    pdde_session_free(s32), pdde_session_free(s16);
    pdde_graph_free(g32), pdde_graph_free(g16);

    /* misuse */
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    CHECK(pdde_graph_set_compute_dtype(g, PDDE_I32) == PDDE_ERR_DTYPE && strstr(pdde_last_error(ctx), "i32"), "i32 compute dtype: %s",
          pdde_last_error(ctx));
    /* a region: the matmul built inside it is bf16, the one after it f32, and so are their gradients */
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){4, 5}, 0.1f), *w2 = pdde_param(g, "w2", 2, (int64_t[]){5, 1}, 0.1f);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){3, 4});
    pdde_graph_set_compute_dtype(g, PDDE_BF16);
    /* (w1 read by two matmuls: converted once) */
    pdde_tensor *h = pdde_add(g, pdde_matmul(g, x, w1, 0, 0), pdde_matmul(g, pdde_scale(g, x, 2.0f), w1, 0, 0));
    pdde_graph_set_compute_dtype(g, PDDE_F32);
    pdde_backward(g, pdde_mean(g, pdde_matmul(g, h, w2, 0, 0), -1, 0));
    int n_bf16 = 0, n_f32 = 0, w1_casts = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_MATMUL) n_bf16 += t->src[0]->dtype == PDDE_BF16, n_f32 += t->src[0]->dtype == PDDE_F32;
        w1_casts += t->op == PDDE_OP_CAST && t->src[0] == w1;
    }
    CHECK(n_bf16 == 6 && n_f32 == 3, "region: %d bf16 matmuls (want 2 forward and their 4 gradient GEMMs), %d f32 (want the forward, d h, d w2)",
          n_bf16, n_f32);
    CHECK(w1_casts == 1, "w1, read by two matmuls, is converted %d times", w1_casts);
    CHECK(pdde_graph_set_compute_dtype(g, PDDE_BF16) == PDDE_ERR_STATE, "set_compute_dtype after backward");
    pdde_graph_free(g);
    /* attention of mixed dtypes (outside a region nothing converts them): an error naming the tensors */
    pdde_graph_init(ctx, &g);
    int64_t s4[4] = {1, 2, 3, 4};
    pdde_tensor *q = pdde_cast(g, pdde_input(g, "q", PDDE_F32, 4, s4), PDDE_BF16), *kv = pdde_input(g, "kv", PDDE_F32, 4, s4);
    CHECK(pdde_attention(g, q, kv, kv) == NULL && pdde_graph_status(g) == PDDE_ERR_DTYPE && strstr(pdde_last_error(ctx), "kv f32"),
          "bf16 q with f32 k, v: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
}

/* ------------------------------------------------------------------------------------------------
 * f16 loss scaling on a small classifier: x [N, IN] -> relu(x W1 + b1) W2 -> cross-entropy */

enum { N = 32, IN = 16, HID = 32, OUT = 4 };

typedef struct {
    pdde_graph *g;
    pdde_session *s;
    pdde_tensor *x, *t, *w1, *loss;
    float xs[N * IN];
    int32_t ts[N];
} mlp;

/* The classifier's session on `device` (0: the CPU). */
static int mlp_init_on(pdde_context *ctx, mlp *m, pdde_dtype dt, int device) {
    pdde_graph_init(ctx, &m->g);
    pdde_graph *g = m->g;
    pdde_graph_set_compute_dtype(g, dt);
    m->x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){N, IN});
    m->t = pdde_input(g, "t", PDDE_I32, 1, (int64_t[]){N});
    m->w1 = pdde_param(g, "w1", 2, (int64_t[]){IN, HID}, 0.3f);
    pdde_tensor *b1 = pdde_param(g, "b1", 1, (int64_t[]){HID}, 0.0f), *w2 = pdde_param(g, "w2", 2, (int64_t[]){HID, OUT}, 0.3f);
    pdde_tensor *h = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, m->x, m->w1, 0, 0), b1));
    m->loss = pdde_cross_entropy(g, pdde_matmul(g, h, w2, 0, 0), m->t);
    pdde_backward(g, m->loss);
    /* SGD: unlike AdamW's normalised step, its update shows gradients left multiplied by the scale */
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 0.1f, op.momentum = 0.9f;
    pdde_optimizer_sgd(g, &op);
    m->s = NULL;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    CHECK(pdde_session_init(g, &sp, &m->s) == PDDE_OK, "mlp session on device %d: %s", device, pdde_last_error(ctx));
    for (int i = 0; i < N; i++) {
        m->ts[i] = i % OUT;
        for (int j = 0; j < IN; j++) m->xs[i * IN + j] = (j % OUT == m->ts[i] ? 1.0f : 0.0f) + 0.1f * (float)((i * 7 + j * 3) % 5 - 2);
    }
    return m->s != NULL;
}

static int mlp_init(pdde_context *ctx, mlp *m, pdde_dtype dt) { return mlp_init_on(ctx, m, dt, 0); }

static pdde_status mlp_step(mlp *m, float poison) {
    float xs[N * IN];
    memcpy(xs, m->xs, sizeof xs);
    xs[5] *= poison;
    pdde_status st = pdde_session_write(m->s, m->x, xs, sizeof xs);
    if (!st) st = pdde_session_write(m->s, m->t, m->ts, sizeof m->ts);
    return st ? st : pdde_session_run(m->s, PDDE_RUN_STEP);
}

static void mlp_free(mlp *m) { pdde_session_free(m->s), pdde_graph_free(m->g); }

/* One step in f16 moves the parameters as one step in f32 does, up to f16 rounding: the scale is
 * divided out again before the update. */
static void test_f16_step_matches_f32(pdde_context *ctx) {
    mlp a, b;
    float wa[IN * HID], wb[IN * HID], w0[IN * HID];
    if (!mlp_init(ctx, &a, PDDE_F16)) return;
    if (!mlp_init(ctx, &b, PDDE_F32)) { mlp_free(&a); return; }
    pdde_session_read(b.s, b.w1, w0, sizeof w0);
    CHECK(mlp_step(&a, 1.0f) == PDDE_OK && mlp_step(&b, 1.0f) == PDDE_OK, "first steps: %s", pdde_last_error(ctx));
    pdde_session_read(a.s, a.w1, wa, sizeof wa), pdde_session_read(b.s, b.w1, wb, sizeof wb);
    double worst = 0, update = 0;
    for (int i = 0; i < IN * HID; i++) {
        double d = fabs((double)wa[i] - wb[i]), u = fabs((double)wb[i] - w0[i]);
        if (!(d <= worst)) worst = d;
        if (u > update) update = u;
    }
    printf("one f16 step vs one f32 step: w1 differs by %.2g, the update is %.2g\n", worst, update);
    CHECK(update > 0 && worst <= 0.02 * update, "the f16 step moved w1 %.3g away from the f32 step (update %.3g)", worst, update);
    mlp_free(&a), mlp_free(&b);
}

static void test_f16_loss_scaling(pdde_context *ctx) {
    mlp m;
    if (!mlp_init(ctx, &m, PDDE_F16)) return;
    pdde_loss_scale_stats sc;
    pdde_session_loss_scale(m.s, &sc);
    CHECK(sc.enabled && sc.scale == PDDE_LOSS_SCALE_INIT && sc.skipped_steps == 0, "f16 session: enabled %d scale %g", sc.enabled, sc.scale);
    pdde_status st = PDDE_OK;
    float first = NAN, w_before[IN * HID], w_after[IN * HID];
    for (int k = 0; k < 5 && st == PDDE_OK; k++) {
        st = mlp_step(&m, 1.0f);
        if (k == 0) first = pdde_session_loss(m.s);
    }
    CHECK(st == PDDE_OK, "f16 steps: %s", pdde_last_error(ctx));
    pdde_session_loss_scale(m.s, &sc);
    CHECK(sc.skipped_steps == 0 && sc.scale == PDDE_LOSS_SCALE_INIT && sc.good_steps == 5, "5 good steps: skipped %lld, scale %g, good %lld",
          (long long)sc.skipped_steps, sc.scale, (long long)sc.good_steps);
    float before_poison = pdde_session_loss(m.s);

    /* an input beyond f16's range (65504): the forward overflows at this step only */
    int64_t step = pdde_session_step(m.s);
    pdde_session_read(m.s, m.w1, w_before, sizeof w_before);
    st = mlp_step(&m, 1e6f);
    pdde_session_read(m.s, m.w1, w_after, sizeof w_after);
    pdde_session_loss_scale(m.s, &sc);
    printf("overflow step: status %s, loss %g, scale %g -> %g, skipped %lld, step %lld -> %lld\n", pdde_status_str(st), pdde_session_loss(m.s),
           (double)PDDE_LOSS_SCALE_INIT, sc.scale, (long long)sc.skipped_steps, (long long)step, (long long)pdde_session_step(m.s));
    CHECK(st == PDDE_OK, "the overflow step fails instead of being skipped: %s", pdde_last_error(ctx));
    CHECK(sc.last_skipped && sc.skipped_steps == 1 && sc.scale == PDDE_LOSS_SCALE_INIT * PDDE_LOSS_SCALE_BACKOFF && sc.good_steps == 0,
          "after the overflow: last_skipped %d, skipped %lld, scale %g", sc.last_skipped, (long long)sc.skipped_steps, sc.scale);
    CHECK(pdde_session_step(m.s) == step, "the skipped step counted: %lld -> %lld", (long long)step, (long long)pdde_session_step(m.s));
    CHECK(memcmp(w_before, w_after, sizeof w_before) == 0, "a parameter changed in the skipped step");

    /* training goes on: no further skip, the loss falls */
    for (int k = 0; k < 30 && st == PDDE_OK; k++) st = mlp_step(&m, 1.0f);
    pdde_session_loss_scale(m.s, &sc);
    float last = pdde_session_loss(m.s);
    printf("f16 loss %.4f -> %.4f (before the overflow %.4f), skipped %lld, step %lld\n", first, last, before_poison, (long long)sc.skipped_steps,
           (long long)pdde_session_step(m.s));
    CHECK(st == PDDE_OK && !sc.last_skipped && sc.skipped_steps == 1 && sc.good_steps == 30, "after the overflow: %s, skipped %lld, good %lld",
          pdde_status_str(st), (long long)sc.skipped_steps, (long long)sc.good_steps);
    CHECK(last < 0.5f * first && last < before_poison, "the loss does not fall: %.4f -> %.4f", first, last);

    /* a scale the gradients overflow at: halved step by step until they fit, then training goes on */
    const float big = 0x1p40f;
    CHECK(pdde_session_set_loss_scale(m.s, big) == PDDE_OK, "set_loss_scale");
    CHECK(pdde_session_set_loss_scale(m.s, NAN) == PDDE_ERR_INVALID_ARG && pdde_session_set_loss_scale(m.s, 0) == PDDE_ERR_INVALID_ARG,
          "a NaN or zero scale accepted");
    int64_t skipped0 = sc.skipped_steps;
    for (int k = 0; k < 40 && st == PDDE_OK; k++) st = mlp_step(&m, 1.0f);
    pdde_session_loss_scale(m.s, &sc);
    int64_t skips = sc.skipped_steps - skipped0;
    printf("scale 2^40: %lld steps skipped, scale now %g, loss %.4f\n", (long long)skips, sc.scale, pdde_session_loss(m.s));
    CHECK(st == PDDE_OK && skips >= 1 && skips < 40 && sc.scale == big * powf(PDDE_LOSS_SCALE_BACKOFF, (float)skips) && !sc.last_skipped,
          "too large a scale: %lld skips, scale %g", (long long)skips, sc.scale);
    CHECK(pdde_session_loss(m.s) <= last * 1.05f, "training did not go on after the skips: loss %.4f", pdde_session_loss(m.s));

    /* growth: PDDE_LOSS_SCALE_INTERVAL good steps double it */
    pdde_session_set_loss_scale(m.s, 1024.0f);
    for (int k = 0; k < PDDE_LOSS_SCALE_INTERVAL && st == PDDE_OK; k++) st = mlp_step(&m, 1.0f);
    pdde_session_loss_scale(m.s, &sc);
    CHECK(st == PDDE_OK && sc.scale == 1024.0f * PDDE_LOSS_SCALE_GROWTH && sc.good_steps == 0, "after %d good steps the scale is %g",
          PDDE_LOSS_SCALE_INTERVAL, sc.scale);

    /* checkpoints keep the f32 masters and the scale */
    char path[64];
    snprintf(path, sizeof path, "/tmp/test_amp_%d.ckpt", (int)getpid());
    pdde_session_set_loss_scale(m.s, 512.0f);
    CHECK(pdde_checkpoint_save(m.s, path, NULL) == PDDE_OK, "save: %s", pdde_last_error(ctx));
    float w_saved[IN * HID], w_loaded[IN * HID];
    pdde_session_read(m.s, m.w1, w_saved, sizeof w_saved);
    mlp_free(&m);
    mlp m2;
    if (mlp_init(ctx, &m2, PDDE_F16)) {
        CHECK(pdde_checkpoint_load(m2.s, path, NULL) == PDDE_OK, "load: %s", pdde_last_error(ctx));
        pdde_session_loss_scale(m2.s, &sc);
        pdde_session_read(m2.s, m2.w1, w_loaded, sizeof w_loaded);
        CHECK(sc.scale == 512.0f, "the loaded scale is %g, saved 512", sc.scale);
        CHECK(memcmp(w_saved, w_loaded, sizeof w_saved) == 0, "the f32 masters did not round-trip");
        CHECK(mlp_step(&m2, 1.0f) == PDDE_OK && isfinite(pdde_session_loss(m2.s)), "a step after loading: %s", pdde_last_error(ctx));
        mlp_free(&m2);
    }
    /* and a run of another precision loads it (without the scale), and the other way round */
    mlp m3;
    if (mlp_init(ctx, &m3, PDDE_F32)) {
        CHECK(pdde_checkpoint_load(m3.s, path, NULL) == PDDE_OK, "f16 checkpoint into an f32 session: %s", pdde_last_error(ctx));
        CHECK(pdde_checkpoint_save(m3.s, path, NULL) == PDDE_OK, "save f32");
        mlp_free(&m3);
    }
    mlp m4;
    if (mlp_init(ctx, &m4, PDDE_F16)) {
        CHECK(pdde_checkpoint_load(m4.s, path, NULL) == PDDE_OK, "f32 checkpoint into an f16 session: %s", pdde_last_error(ctx));
        pdde_session_loss_scale(m4.s, &sc);
        CHECK(sc.scale == PDDE_LOSS_SCALE_INIT, "an f32 checkpoint set the scale to %g", sc.scale);
        mlp_free(&m4);
    }
    unlink(path);

    /* without loss scaling (bf16) the same overflow is an error, as in f32 */
    mlp mb;
    if (mlp_init(ctx, &mb, PDDE_BF16)) {
        CHECK(mlp_step(&mb, 1e38f) == PDDE_OK, "a finite bf16 step");
        CHECK(mlp_step(&mb, INFINITY) == PDDE_ERR_NONFINITE, "an infinite bf16 input is not refused");
        mlp_free(&mb);
    }
}

/* Every parameter and optimizer state (SGD's momentum) of the classifier, into one buffer. */
static size_t mlp_snapshot(mlp *m, float *out, size_t cap) {
    size_t n = 0;
    for (int i = 0; i < pdde_graph_tensor_count(m->g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(m->g, i);
        size_t k = (size_t)pdde_tensor_numel(t);
        bool state = (t->flags & PDDE_TENSOR_STATE) && !(t->flags & (PDDE_TENSOR_GRAD | PDDE_TENSOR_CONST)); /* (not the scale) */
        if (t->op != PDDE_OP_NONE || !((t->flags & PDDE_TENSOR_PARAM) || state) || n + k > cap) continue;
        if (pdde_session_read(m->s, t, out + n, k * sizeof(float)) == PDDE_OK) n += k;
    }
    return n;
}

/* The overflow on the OpenCL device (PoCL on CI), whose update kernels see it themselves (a squared
 * norm that is not finite makes them do nothing) while the host reads the norm only after the step:
 * the step is skipped with every parameter and the momentum bit-identical, the scale halved and no
 * step counted; a good step waits for the device once, at its end. */
static void test_f16_overflow_on_device(pdde_context *ctx) {
    int device = -1;
    for (int d = 0; d < pdde_device_count(ctx) && device < 0; d++) {
        pdde_device_props p;
        if (pdde_device_get_props(ctx, d, &p) == PDDE_OK && !strcmp(p.backend, "opencl")) device = d;
    }
    if (device < 0) { test_skip("opencl", "f16 overflow on a device: no OpenCL device"); return; }
    mlp m;
    if (!mlp_init_on(ctx, &m, PDDE_F16, device)) { mlp_free(&m); return; }
    int64_t syncs = 0;
    pdde_status st = mlp_step(&m, 1.0f); /* (writing the inputs waits too) */
    for (int k = 0; k < 3 && st == PDDE_OK; k++) {
        int64_t before = pdde_session_host_syncs(m.s);
        st = pdde_session_run(m.s, PDDE_RUN_STEP);
        syncs += pdde_session_host_syncs(m.s) - before;
    }
    pdde_loss_scale_stats sc;
    pdde_session_loss_scale(m.s, &sc);
    CHECK(st == PDDE_OK && sc.skipped_steps == 0 && syncs == 3, "f16 on device %d: 4 good steps (%s), %lld skipped, %lld host waits (want 3)", device,
          pdde_last_error(ctx), (long long)sc.skipped_steps, (long long)syncs);
    float before[2 * (IN * HID + HID + HID * OUT)], after[sizeof before / sizeof *before];
    size_t n = mlp_snapshot(&m, before, sizeof before / sizeof *before);
    int64_t step = pdde_session_step(m.s);
    float scale = sc.scale;
    st = mlp_step(&m, 1e6f);
    pdde_session_loss_scale(m.s, &sc);
    CHECK(st == PDDE_OK && sc.last_skipped && sc.skipped_steps == 1 && sc.scale == scale * PDDE_LOSS_SCALE_BACKOFF && pdde_session_step(m.s) == step,
          "f16 overflow on device %d: %s, skipped %d (%lld), scale %g -> %g, step %lld -> %lld", device, pdde_status_str(st), sc.last_skipped,
          (long long)sc.skipped_steps, scale, sc.scale, (long long)step, (long long)pdde_session_step(m.s));
    CHECK(mlp_snapshot(&m, after, sizeof after / sizeof *after) == n && n == sizeof before / sizeof *before && !memcmp(before, after, n * sizeof(float)),
          "f16 overflow on device %d: a parameter or the momentum changed in the skipped step", device);
    st = mlp_step(&m, 1.0f);
    pdde_session_loss_scale(m.s, &sc);
    printf("f16 on device %d: %lld host waits in 3 good steps; overflow skipped (scale %g -> %g), then loss %.4f\n", device, (long long)syncs, scale,
           scale * PDDE_LOSS_SCALE_BACKOFF, pdde_session_loss(m.s));
    CHECK(st == PDDE_OK && !sc.last_skipped && pdde_session_step(m.s) == step + 1, "f16 on device %d: the step after the overflow: %s", device,
          pdde_last_error(ctx));
    mlp_free(&m);
}

#ifdef PDDE_HAVE_UCX
enum { SCALE_RANKS = 4, SCALE_STEPS = 24, INJECT_AT = 3, DISAGREE_AT = 14 }; /* (the scale stops overflowing by step 10) */
typedef struct {
    int ok;
    char error[160];
    float scale_after, scale_end, loss_first, loss_end;
    long long skipped_after, skipped_end, step_before, step_after, step_end;
    int last_skipped, params_unchanged;
    int disagree_skipped, disagree_unchanged; /* the step where rank 0's scale differs (no overflow anywhere) */
} scale_result;

/* FNV-1a of this rank's blocks of every parameter */
static uint64_t params_hash(pdde_session *s, pdde_graph *g) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i), *local = NULL;
        if (!(t->flags & PDDE_TENSOR_PARAM) || !(local = pdde_session_tensor(s, t))) continue;
        size_t n = pdde_tensor_nbytes(local);
        unsigned char *b = malloc(n);
        if (b && pdde_session_read(s, t, b, n) == PDDE_OK)
            for (size_t k = 0; k < n; k++) h = (h ^ b[k]) * 1099511628211ull;
        free(b);
    }
    return h;
}

static void scale_rank(pdde_context *ctx, pdde_comm *world, void *arg) {
    (void)arg;
    scale_result *out = test_rank_result;
    const gpt_config cfg = {.vocab = 64, .ctx = 8, .layers = 2, .heads = 2, .width = 32, .batch = 8};
    gpt_plan plan = {.dp = 2, .tp = 1, .pp = 2, .micro = 2}; /* dp 2 x pp 2, 2 micro-batches */
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f;
    pdde_graph *g;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = world;
    pdde_status st = pdde_graph_set_compute_dtype(g, PDDE_F16);
    if (!st) st = gpt_build_plan(g, &cfg, &plan, &op, &m);
    if (!st) st = pdde_session_init(g, &sp, &s);
    int rank = pdde_comm_rank(world);
    int32_t x[8 * 8], y[8 * 8];
    for (int step = 0; step < SCALE_STEPS && !st; step++) {
        for (int i = 0; i < 64; i++) x[i] = (i * 5 + step * 3) % 7 + 1, y[i] = (x[i] * 3 + 1) % cfg.vocab;
        for (int k = 0; k < 2 && !st; k++) {
            st = pdde_session_write_micro(s, m.ids, k, x + k * 32, sizeof x / 2);
            if (!st) st = pdde_session_write_micro(s, m.targets, k, y + k * 32, sizeof y / 2);
        }
        /* the injection: mesh rank 1 (dp 0, stage 1, which holds the loss) scales its loss far beyond f16 */
        if (!st && step == INJECT_AT && rank == 1) st = pdde_session_set_loss_scale(s, 1e8f);
        /* a scale set on one rank only (stage 0: not the loss's) makes the ranks disagree: every rank skips,
         * though no gradient overflowed, so no update kernel could have seen it by itself */
        pdde_loss_scale_stats now;
        pdde_session_loss_scale(s, &now);
        if (!st && step == DISAGREE_AT && rank == 0) st = pdde_session_set_loss_scale(s, now.scale * 0.5f);
        uint64_t before = step == INJECT_AT || step == DISAGREE_AT ? params_hash(s, g) : 0;
        if (step == INJECT_AT) out->step_before = pdde_session_step(s);
        if (!st) st = pdde_session_run(s, PDDE_RUN_STEP);
        pdde_loss_scale_stats sc;
        pdde_session_loss_scale(s, &sc);
        if (step == 0) out->loss_first = pdde_session_loss(s);
        if (step == INJECT_AT) {
            out->params_unchanged = params_hash(s, g) == before, out->last_skipped = sc.last_skipped;
            out->scale_after = sc.scale, out->skipped_after = sc.skipped_steps, out->step_after = pdde_session_step(s);
        }
        if (step == DISAGREE_AT) out->disagree_skipped = sc.last_skipped, out->disagree_unchanged = params_hash(s, g) == before;
        out->scale_end = sc.scale, out->skipped_end = sc.skipped_steps, out->loss_end = pdde_session_loss(s);
    }
    out->step_end = s ? pdde_session_step(s) : -1;
    out->ok = st == PDDE_OK;
    if (st) snprintf(out->error, sizeof out->error, "%s", pdde_last_error(ctx));
    pdde_session_free(s);
    pdde_graph_free(g);
}

static void test_f16_loss_scaling_ranks(pdde_context *ctx) {
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    if (!srv) { CHECK(0, "store: %s", pdde_last_error(ctx)); return; }
    scale_result res[SCALE_RANKS];
    memset(res, 0, sizeof res);
    test_ranks_params tp = {.addr = addr, .prefix = "amp-scale", .timeout_s = 60, .n_threads = 1, .server = srv, .results = res,
                            .result_size = sizeof *res};
    CHECK(test_run_ranks(SCALE_RANKS, &tp, scale_rank, NULL, 300) == 0, "the 4 ranks exit cleanly");
    for (int r = 0; r < SCALE_RANKS; r++) {
        scale_result *q = &res[r];
        printf("rank %d: injected step: skipped %d (%lld), scale %g, step %lld -> %lld; end: scale %g, skipped %lld, step %lld, loss %.4f -> %.4f\n", r,
               q->last_skipped, q->skipped_after, q->scale_after, q->step_before, q->step_after, q->scale_end, q->skipped_end, q->step_end,
               q->loss_first, q->loss_end);
        CHECK(q->ok, "rank %d: %s", r, q->error);
        CHECK(q->last_skipped && q->skipped_after == 1 && q->step_after == q->step_before && q->params_unchanged,
              "rank %d skips the injected step without changing a parameter (skipped %d, %lld in all, step %lld -> %lld, unchanged %d)", r,
              q->last_skipped, q->skipped_after, q->step_before, q->step_after, q->params_unchanged);
        CHECK(q->disagree_skipped && q->disagree_unchanged, "rank %d skips the step where the ranks' scales differ without changing a parameter (skipped %d, unchanged %d)",
              r, q->disagree_skipped, q->disagree_unchanged);
        CHECK(q->scale_after == res[0].scale_after && q->scale_end == res[0].scale_end && q->skipped_end == res[0].skipped_end &&
                  q->step_end == res[0].step_end,
              "rank %d: scale %g then %g, %lld skipped, step %lld; rank 0: %g then %g, %lld, %lld", r, q->scale_after, q->scale_end,
              q->skipped_end, q->step_end, res[0].scale_after, res[0].scale_end, res[0].skipped_end, res[0].step_end);
    }
    CHECK(res[0].step_end > INJECT_AT + 1 && res[0].scale_end < 1e8f && res[0].loss_end < res[0].loss_first,
          "training goes on after the skips: %lld steps taken, scale %g, loss %.4f -> %.4f", res[0].step_end, res[0].scale_end, res[0].loss_first,
          res[0].loss_end);
    pdde_store_server_free(srv);
}
#endif

#ifdef PDDE_HAVE_UCX
/* ------------------------------------------------------------------------------------------------
 * 5. A pipeline stage without parameters under f16 loss scaling, 2 ranks under pdde-run: the
 *    classifier (x W1 -> relu -> W2, f16 matmuls) on one stage; on the other, bare = 1 the
 *    cross-entropy alone, bare = 0 an input transform (relu(x)) alone */

enum { BARE_STEPS = 8, BARE_POISON_AT = 3 };

static int bare_stage_rank(int bare) {
    pdde_context *ctx;
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1;
    if (pdde_context_init(&cp, &ctx)) return 3;
    pdde_comm_params cm = PDDE_COMM_PARAMS_INIT;
    cm.timeout_s = 15; /* a rank left out of a collective fails within this, not the test's limit */
    pdde_comm *world = NULL;
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    pdde_status st = pdde_comm_init(ctx, &cm, &world);
    if (!st) st = pdde_graph_init(ctx, &g);
    if (!st) st = pdde_graph_set_compute_dtype(g, PDDE_F16);
    pdde_graph_set_layer(g, 0);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){N, IN}), *h = bare == 0 ? pdde_relu(g, x) : x;
    pdde_graph_set_layer(g, bare == 0 ? 1 : 0);
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){IN, HID}, 0.3f), *w2 = pdde_param(g, "w2", 2, (int64_t[]){HID, OUT}, 0.3f);
    pdde_tensor *logits = pdde_matmul(g, pdde_relu(g, pdde_matmul(g, h, w1, 0, 0)), w2, 0, 0);
    pdde_graph_set_layer(g, 1);
    pdde_tensor *t = pdde_input(g, "t", PDDE_I32, 1, (int64_t[]){N});
    pdde_tensor *loss = pdde_cross_entropy(g, logits, t);
    pdde_graph_set_layer(g, -1);
    const pdde_mesh *mesh = g ? pdde_mesh_create(g, 1, (int[]){2}, (const char *[]){"pp"}, NULL) : NULL;
    if (!st) st = mesh ? pdde_strategy_pipeline(g, mesh, "pp", 2) : pdde_graph_status(g);
    if (!st) st = pdde_backward(g, loss);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 0.1f, op.grad_accum_steps = 2;
    if (!st) st = pdde_optimizer_sgd(g, &op);
    if (!st) st = pdde_complete_dist_attrs(g);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = world;
    if (!st) st = pdde_session_init(g, &sp, &s);
    int rank = world ? pdde_comm_rank(world) : -1, holds_params = s && pdde_session_tensor(s, w1) != NULL;
    pdde_loss_scale_stats sc = {0}, at_poison = {0};
    long long step_before = -1, step_after = -1;
    int unchanged = 0;
    float xs[N * IN];
    int32_t ts[N];
    for (int i = 0; i < N; i++) {
        ts[i] = i % OUT;
        for (int j = 0; j < IN; j++) xs[i * IN + j] = (j % OUT == ts[i] ? 1.0f : 0.0f) + 0.1f * (float)((i * 7 + j * 3) % 5 - 2);
    }
    for (int step = 0; step < BARE_STEPS && !st; step++) {
        float xp[N * IN];
        memcpy(xp, xs, sizeof xp);
        if (step == BARE_POISON_AT) xp[5] = 1e6f; /* beyond f16 in the first matmul: the gradients overflow */
        for (int k = 0; k < 2 && !st; k++) { /* (the graph is one micro-batch: both get the same rows) */
            st = pdde_session_write_micro(s, x, k, xp, sizeof xp);
            if (!st) st = pdde_session_write_micro(s, t, k, ts, sizeof ts);
        }
        uint64_t before = step == BARE_POISON_AT ? params_hash(s, g) : 0;
        if (step == BARE_POISON_AT) step_before = pdde_session_step(s);
        if (!st) st = pdde_session_run(s, PDDE_RUN_STEP);
        pdde_session_loss_scale(s, &sc);
        if (step == BARE_POISON_AT) at_poison = sc, step_after = pdde_session_step(s), unchanged = params_hash(s, g) == before;
    }
    printf("bare rank %d: status %d params %d poisoned: skipped %d (%lld in all) scale %g step %lld -> %lld unchanged %d; "
           "end: skipped %lld scale %g step %lld (%s)\n", rank, st, holds_params, at_poison.last_skipped, (long long)at_poison.skipped_steps,
           at_poison.scale, step_before, step_after, unchanged, (long long)sc.skipped_steps, sc.scale, s ? (long long)pdde_session_step(s) : -1LL,
           st ? pdde_last_error(ctx) : "ok");
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_comm_free(world);
    pdde_context_free(ctx);
    return st ? 1 : 0;
}

static void test_f16_bare_stage(const char *self, int bare) {
    char dir[512], run[600], cmd[1400], out[8192] = "";
    test_binary_dir(self, dir, sizeof dir);
    snprintf(run, sizeof run, "%s/pdde-run", dir);
    if (access(run, X_OK)) { test_skip("ucx", "no %s (make all builds it): a stage without parameters under pdde-run", run); return; }
    snprintf(cmd, sizeof cmd, "PDDE_BACKENDS=cpu UCX_WARN_UNUSED_ENV_VARS=n timeout -s KILL 120 %s -n 2 %s --bare-stage-rank %d 2>&1", run, self, bare);
    FILE *p = popen(cmd, "r");
    size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[n] = 0;
    int rc = p ? pclose(p) : -1;
    printf("%s", out);
    CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 0, "pdde-run -n 2 with stage %d without parameters: exit status 0x%x", bare, rc);
    struct { int st, params, skipped; long long skipped_n, step_before, step_after, skipped_end, step_end; float scale, scale_end; int unchanged; } r[2];
    memset(r, 0, sizeof r);
    int found = 0;
    for (const char *l = out; (l = strstr(l, "bare rank ")); l++) {
        int k, st, params, skipped, unchanged;
        long long sn, sb, sa, se, te;
        float scale, scale_end;
        if (sscanf(l, "bare rank %d: status %d params %d poisoned: skipped %d (%lld in all) scale %g step %lld -> %lld unchanged %d; end: skipped %lld scale %g step %lld",
                   &k, &st, &params, &skipped, &sn, &scale, &sb, &sa, &unchanged, &se, &scale_end, &te) == 12 && k >= 0 && k < 2) {
            r[k].st = st, r[k].params = params, r[k].skipped = skipped, r[k].skipped_n = sn, r[k].scale = scale, r[k].step_before = sb;
            r[k].step_after = sa, r[k].unchanged = unchanged, r[k].skipped_end = se, r[k].scale_end = scale_end, r[k].step_end = te;
            found |= 1 << k;
        }
    }
    CHECK(found == 3 && r[1 - bare].params && !r[bare].params, "both ranks report; stage %d holds the parameters and stage %d none (ranks %d, params %d %d)",
          1 - bare, bare, found, r[0].params, r[1].params);
    for (int k = 0; k < 2 && found == 3; k++) {
        CHECK(r[k].st == 0, "rank %d: status %d", k, r[k].st);
        CHECK(r[k].skipped && r[k].skipped_n == 1 && r[k].step_after == r[k].step_before && r[k].unchanged &&
                  r[k].scale == PDDE_LOSS_SCALE_INIT * PDDE_LOSS_SCALE_BACKOFF,
              "rank %d skips the poisoned step with the other (skipped %d, %lld in all, step %lld -> %lld, unchanged %d, scale %g)", k,
              r[k].skipped, r[k].skipped_n, r[k].step_before, r[k].step_after, r[k].unchanged, r[k].scale);
        CHECK(r[k].skipped_end == 1 && r[k].step_end == BARE_STEPS - 1 && r[k].scale_end == r[0].scale_end,
              "rank %d at the end: skipped %lld, step %lld (want 1, %d), scale %g (rank 0 %g)", k, r[k].skipped_end, r[k].step_end, BARE_STEPS - 1,
              r[k].scale_end, r[0].scale_end);
    }
}
#endif

int main(int argc, char **argv) {
#ifdef PDDE_HAVE_UCX
    if (argc == 3 && !strcmp(argv[1], "--bare-stage-rank")) return bare_stage_rank(atoi(argv[2]));
#endif
    (void)argc, (void)argv;
    pdde_context *ctx;
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 2;
    if (pdde_context_init(&cp, &ctx) != PDDE_OK) { CHECK(0, "context"); return test_finish(); }
    test_golden_bf16(ctx);
    test_graph_and_memory(ctx);
    test_f16_step_matches_f32(ctx);
    test_f16_loss_scaling(ctx);
    test_f16_overflow_on_device(ctx);
#ifdef PDDE_HAVE_UCX
    test_f16_loss_scaling_ranks(ctx);
    test_f16_bare_stage(argv[0], 1);
    test_f16_bare_stage(argv[0], 0);
#endif
    pdde_context_free(ctx);
    return test_finish();
}
