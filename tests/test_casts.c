/* test_casts — the casts a mixed-precision (bf16) GPT step runs. Each weight's bf16 copy is kept by its
 * AdamW update (PDDE_TENSOR_SHADOW), which rewrites it from the new values in the same pass, so after the
 * first step no weight is cast again; and the layernorms and the bias_gelu whose only reader is a cast
 * write bf16 themselves (lowering folds the cast in). What is left per layer and step: the attention's
 * packed qkv input and its output (2) and the gradient into each of the 4 matmuls (4): at most
 * CASTS_PER_LAYER (13 with neither); outside the layers none (the final norm's output and the logits' gradient, from
 * cross_entropy_back, folded; the tied wte kept): CASTS_OUTSIDE.
 * Counted from the nodes the session ran (pdde_session_op_runs), on the CPU and on every other device
 * (PoCL's OpenCL device in CI; CUDA where there is one), for 2 and 4 layers (per layer: the difference / 2);
 * and with PDDE_FOLD_CASTS=0 (every cast as autocast wrote it: 13 a layer, 3 outside), whose losses must be the same bits; also
 * with every block recomputed in backward, where the weights' copies are not cast again either.
 * Neither may change a number: the losses equal, bit for bit, those of a session that writes a
 * parameter back before every step (a write makes the copies stale, so its casts run each step as
 * before), with a weight changed by a write after step 3 in both (the next step must see it), and
 * those of a session whose layernorm and gelu outputs are marked outputs (then nothing is folded).
 * On 2 ranks (data parallel with ZeRO-1 and ZeRO-2, where an update writes only its shard and the copy
 * is cast each step again; tensor parallel) the losses are those of PDDE_FOLD_CASTS=0, bit for bit.
 * And the bf16 losses follow the f32 ones within 1% (bf16 operands carry 8 significant bits: a relative
 * rounding of 2^-9 per operand, which over these 6 steps of a 2-4 layer model moves the loss by about
 * 1e-3 relative; 1% is ten times that, and far below what training in the wrong dtype would give). */
#define _GNU_SOURCE /* setenv */
#include "pdde.h"
#include "backends/op_params.h" /* (PDDE_P_CE_DLOGITS) */
#include "examples/gpt.h"
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include "tests/gpt_test_steps.h"
#include <stdlib.h>
#include <string.h>

#define STEPS 6
#define WRITE_AFTER 3 /* steps before the weight is changed by a write */
#define CASTS_PER_LAYER 6
#define CASTS_OUTSIDE 0

#define CASTS_PER_LAYER_FUSED 5 /* PDDE_FUSE_EPILOGUE=1: q, k, v's bias add and cast folded into their matmul */
#define ADDS_FUSED_PER_LAYER 5  /* ...and the bias adds of the qkv, proj and fcproj linears and the 2 residual adds */
#define MATMULS_FUSED_PER_LAYER 4 /* PDDE_FUSE_GRAD=1: the 4 weight-gradient matmuls run inside their accumulations */
#define ADDS_LN_FUSED_PER_LAYER 2 /* PDDE_FUSE_ADD_LN=1: the residual gradient added in the 2 layernorms' backward */
#define ADDS_LN_FWD_PER_LAYER 2   /* ...and the 2 residual adds before the layernorms in them (without PDDE_FUSE_EPILOGUE, which takes those) */
#define CASTS_PER_LAYER_GRADS 2 /* PDDE_BF16_GRADS=1, PDDE_FUSE_EPILOGUE=1 and PDDE_FUSE_ADD_LN=1: the attention's output and input gradient */
#define CASTS_PER_LAYER_ATT 0   /* ...and PDDE_ATT_LOWP=1: the attention writes both rounded copies beside its f32 results */

typedef struct {
    float loss[STEPS];
    double casts_per_step, adds_per_step, matmuls_per_step, gelus_per_step;
    int ce_fused, ce_backs; /* the session's cross-entropies that write dlogits (PDDE_FUSE_CE), its backwards that compute */
    int64_t casts_after_write;
} run_result;

static pdde_tensor *named(pdde_graph *g, const char *name) {
    for (int i = 0; i < pdde_graph_tensor_count(g); i++)
        if (!strcmp(pdde_graph_tensor(g, i)->name, name)) return (pdde_tensor *)pdde_graph_tensor(g, i);
    return NULL;
}

/* rewrite: wte read and written back before every step (its value unchanged, every copy stale);
 * unfold: the layernorms' and bias_gelus' outputs marked outputs (the casts after them stay);
 * recompute (unfold = 2): every block recomputed in backward */
static int train(pdde_context *ctx, int device, int layers, pdde_dtype dt, int rewrite, int unfold, run_result *r) {
    gpt_config cfg = {.vocab = 64, .ctx = 16, .layers = layers, .heads = 2, .width = 32, .batch = 4};
    pdde_graph *g;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    pdde_graph_set_compute_dtype(g, dt);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.weight_decay = 0.1f, op.clip_norm = 1.0f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    int built = gpt_build(g, &cfg, &m);
    for (int l = 1; unfold == 2 && l <= layers; l++) pdde_graph_set_recompute(g, l, 1);
    for (int i = 0; unfold == 1 && i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = (pdde_tensor *)pdde_graph_tensor(g, i);
        if (t->op == PDDE_OP_LAYERNORM || t->op == PDDE_OP_BIAS_GELU) pdde_mark_output(t);
    }
    if (built || pdde_backward(g, m.loss) || pdde_optimizer_adamw(g, &op) || pdde_session_init(g, &sp, &s)) {
        fprintf(stderr, "session: %s\n", pdde_last_error(ctx));
        pdde_graph_free(g);
        return -1;
    }
    pdde_tensor *wte = named(g, "wte"), *w = named(g, "h0.attn.w");
    size_t nw = pdde_tensor_nbytes(w), nwte = pdde_tensor_nbytes(wte);
    float *buf = malloc(nw > nwte ? nw : nwte);
    int rc = buf ? 0 : -1;
    int64_t after_first = 0, before_write = 0, adds_first = 0, adds_before_write = 0, mm_first = 0, mm_before_write = 0, gelu_first = 0,
            gelu_before_write = 0;
    for (int step = 0; step < STEPS && rc == 0; step++) {
        rc |= gpt_test_write_batch(s, &m, step);
        if (step == WRITE_AFTER) { /* a weight changed between steps: the next forward must read it */
            rc |= pdde_session_read(s, w, buf, nw);
            for (size_t i = 0; i < nw / sizeof(float); i++) buf[i] *= 0.5f;
            rc |= pdde_session_write(s, w, buf, nw);
            before_write = pdde_session_op_runs(s, PDDE_OP_CAST), adds_before_write = pdde_session_op_runs(s, PDDE_OP_ADD);
            mm_before_write = pdde_session_op_runs(s, PDDE_OP_MATMUL);
            gelu_before_write = pdde_session_op_runs(s, PDDE_OP_BIAS_GELU) + pdde_session_op_runs(s, PDDE_OP_BIAS_GELU_BACK);
        }
        if (rewrite) rc |= pdde_session_read(s, wte, buf, nwte) || pdde_session_write(s, wte, buf, nwte);
        if (rc || pdde_session_run(s, PDDE_RUN_STEP)) {
            fprintf(stderr, "step %d: %s\n", step, pdde_last_error(ctx));
            rc = -1;
        }
        r->loss[step] = pdde_session_loss(s);
        if (step == 0)
            after_first = pdde_session_op_runs(s, PDDE_OP_CAST), adds_first = pdde_session_op_runs(s, PDDE_OP_ADD),
            mm_first = pdde_session_op_runs(s, PDDE_OP_MATMUL),
            gelu_first = pdde_session_op_runs(s, PDDE_OP_BIAS_GELU) + pdde_session_op_runs(s, PDDE_OP_BIAS_GELU_BACK);
        if (step == WRITE_AFTER) r->casts_after_write = pdde_session_op_runs(s, PDDE_OP_CAST) - before_write;
    }
    r->casts_per_step = (double)(before_write - after_first) / (WRITE_AFTER - 1);
    r->adds_per_step = (double)(adds_before_write - adds_first) / (WRITE_AFTER - 1);
    r->matmuls_per_step = (double)(mm_before_write - mm_first) / (WRITE_AFTER - 1);
    r->gelus_per_step = (double)(gelu_before_write - gelu_first) / (WRITE_AFTER - 1);
    r->ce_fused = r->ce_backs = 0;
    for (int i = 0; i < pdde_session_node_count(s); i++) {
        const pdde_tensor *t = pdde_session_node(s, i);
        r->ce_fused += t->op == PDDE_OP_CROSS_ENTROPY && pdde_op_i32(t, PDDE_P_CE_DLOGITS);
        r->ce_backs += t->op == PDDE_OP_CROSS_ENTROPY_BACK && !pdde_op_i32(t, PDDE_P_CE_DLOGITS);
    }
    free(buf);
    pdde_session_free(s);
    pdde_graph_free(g);
    return rc;
}

/* fold: PDDE_FOLD_CASTS for the runs with the casts folded (NULL: unset, the device's default) */
static void test_device(pdde_context *ctx, int device, const char *where, const char *fold) {
    run_result kept2, kept4, rewritten, unfolded, f32, before2, before4, rc_before, rc_kept;
    setenv("PDDE_FOLD_CASTS", "0", 1);
    int failed = train(ctx, device, 2, PDDE_BF16, 0, 0, &before2) || train(ctx, device, 4, PDDE_BF16, 0, 0, &before4) ||
                 train(ctx, device, 2, PDDE_BF16, 0, 2, &rc_before);
    if (fold) setenv("PDDE_FOLD_CASTS", fold, 1);
    else unsetenv("PDDE_FOLD_CASTS");
    if (failed || train(ctx, device, 2, PDDE_BF16, 0, 0, &kept2) || train(ctx, device, 4, PDDE_BF16, 0, 0, &kept4) ||
        train(ctx, device, 2, PDDE_BF16, 0, 2, &rc_kept) ||
        train(ctx, device, 2, PDDE_BF16, 1, 0, &rewritten) || train(ctx, device, 2, PDDE_BF16, 0, 1, &unfolded) ||
        train(ctx, device, 2, PDDE_F32, 0, 0, &f32)) {
        CHECK(0, "%s: a run failed", where);
        return;
    }
    double per_layer = (kept4.casts_per_step - kept2.casts_per_step) / 2, outside = kept2.casts_per_step - 2 * per_layer;
    printf("%s: casts per step after the first: %.1f per layer, %.1f outside the layers (2 layers: %.1f, 4 layers: %.1f); "
           "the step after a parameter write: %lld (2 layers); writing a parameter back every step: %.1f; nothing folded: %.1f\n",
           where, per_layer, outside, kept2.casts_per_step, kept4.casts_per_step, (long long)kept2.casts_after_write, rewritten.casts_per_step,
           unfolded.casts_per_step);
    double before_layer = (before4.casts_per_step - before2.casts_per_step) / 2, before_outside = before2.casts_per_step - 2 * before_layer;
    printf("%s: PDDE_FOLD_CASTS=0: %.1f per layer, %.1f outside\n", where, before_layer, before_outside);
    CHECK(before_layer == 13 && before_outside == 3, "%s: PDDE_FOLD_CASTS=0 ran %.1f casts per layer and step, %.1f outside (want 13 and 3)", where,
          before_layer, before_outside);
    test_diff as_before = test_diff_f32(kept2.loss, before2.loss, STEPS, 1e-30);
    CHECK(as_before.worst == 0, "%s: losses differ from PDDE_FOLD_CASTS=0's: step %zu %.9g vs %.9g", where, as_before.index, as_before.got, as_before.want);
    /* recomputed blocks cast their activations again in backward (q, k, v and the attention's output: 4),
     * but not their weights (kept copies) */
    test_diff rc_same = test_diff_f32(rc_kept.loss, rc_before.loss, STEPS, 1e-30);
    printf("%s: recomputed blocks: %.1f casts a step (PDDE_FOLD_CASTS=0: %.1f)\n", where, rc_kept.casts_per_step, rc_before.casts_per_step);
    CHECK(rc_same.worst == 0 && rc_kept.casts_per_step <= (CASTS_PER_LAYER + 4) * 2 + CASTS_OUTSIDE,
          "%s: recomputed: step %zu loss %.9g vs %.9g with PDDE_FOLD_CASTS=0, %.1f casts a step vs %.1f", where, rc_same.index, rc_same.got,
          rc_same.want, rc_kept.casts_per_step, rc_before.casts_per_step);
    CHECK(per_layer <= CASTS_PER_LAYER && outside <= CASTS_OUTSIDE, "%s: %.1f casts per layer and step (at most %d), %.1f outside (at most %d)",
          where, per_layer, CASTS_PER_LAYER, outside, CASTS_OUTSIDE);
    /* a write makes the copies stale: that step casts each weight again (4 a layer and wte) */
    CHECK(kept2.casts_after_write >= kept2.casts_per_step + 4 * 2 + 1 && rewritten.casts_per_step >= kept2.casts_per_step + 4 * 2 + 1,
          "%s: the step after a write ran %lld casts, writing every step %.1f a step (kept: %.1f)", where, (long long)kept2.casts_after_write,
          rewritten.casts_per_step, kept2.casts_per_step);
    test_diff same = test_diff_f32(kept2.loss, rewritten.loss, STEPS, 1e-30);
    CHECK(same.worst == 0, "%s: bf16 losses with kept copies differ from recast ones: step %zu %.9g vs %.9g", where, same.index, same.got, same.want);
    /* 5 casts folded into the 2 layernorms and the gelu of each of 2 layers and the final layernorm */
    test_diff folded = test_diff_f32(kept2.loss, unfolded.loss, STEPS, 1e-30);
    CHECK(folded.worst == 0 && unfolded.casts_per_step == kept2.casts_per_step + 3 * 2 + 1, "%s: folded casts: losses step %zu %.9g vs %.9g unfolded, "
          "%.1f casts a step vs %.1f unfolded", where, folded.index, folded.got, folded.want, kept2.casts_per_step, unfolded.casts_per_step);
    test_diff vs32 = test_diff_f32(kept2.loss, f32.loss, STEPS, 1e-6);
    printf("%s: bf16 vs f32 losses: worst relative difference %.2e (step %zu: %.6f vs %.6f)\n", where, vs32.worst, vs32.index, vs32.got, vs32.want);
    CHECK(vs32.worst < 1e-2 && kept2.loss[STEPS - 1] < kept2.loss[0], "%s: bf16 losses %.6f vs f32 %.6f at step %zu (relative %.2e)", where,
          vs32.got, vs32.want, vs32.index, vs32.worst);
}

/* The fusions of lowering, each switch alone and all together: PDDE_FUSE_EPILOGUE=1 folds bias and residual
 * adds, and the cast after q, k, v's, into their matmuls (1 cast and 5 adds fewer per layer);
 * PDDE_FUSE_GRAD=1 runs the weight-gradient matmuls inside their accumulations (4 matmul nodes fewer per
 * layer); PDDE_FUSE_ADD_LN=1 adds the residual gradient in the layernorms' backward and the residual add
 * before each layernorm in the layernorm (4 adds fewer per layer; 2 with PDDE_FUSE_EPILOGUE=1, which folds
 * those residual adds into their matmuls first). The losses are those without, bit for bit, also with recomputed blocks. */
static const char *const fusion_env[3] = {"PDDE_FUSE_EPILOGUE", "PDDE_FUSE_GRAD", "PDDE_FUSE_ADD_LN"};

static void fused_run(pdde_context *ctx, int device, unsigned on, run_result r[3]) {
    for (int k = 0; k < 3; k++)
        if (on & (1u << k)) setenv(fusion_env[k], "1", 1);
    int failed = train(ctx, device, 2, PDDE_BF16, 0, 0, &r[0]) || train(ctx, device, 4, PDDE_BF16, 0, 0, &r[1]) ||
                 train(ctx, device, 2, PDDE_BF16, 0, 2, &r[2]);
    for (int k = 0; k < 3; k++) setenv(fusion_env[k], "0", 1);
    if (failed) r[0].casts_per_step = -1;
}

static void test_fused(pdde_context *ctx, int device, const char *where) {
    static const unsigned variants[] = {1, 2, 4, 7};
    run_result plain[3], fused[3];
    fused_run(ctx, device, 0, plain);
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        unsigned on = variants[v];
        char name[96] = "";
        for (int k = 0; k < 3; k++)
            if (on & (1u << k)) snprintf(name + strlen(name), sizeof name - strlen(name), "%s%s=1", name[0] ? " " : "", fusion_env[k]);
        fused_run(ctx, device, on, fused);
        if (plain[0].casts_per_step < 0 || fused[0].casts_per_step < 0) {
            CHECK(0, "%s: a run with %s failed", where, name);
            continue;
        }
        double per_layer = (fused[1].casts_per_step - fused[0].casts_per_step) / 2, outside = fused[0].casts_per_step - 2 * per_layer;
        double adds = ((plain[1].adds_per_step - plain[0].adds_per_step) - (fused[1].adds_per_step - fused[0].adds_per_step)) / 2;
        double mms = ((plain[1].matmuls_per_step - plain[0].matmuls_per_step) - (fused[1].matmuls_per_step - fused[0].matmuls_per_step)) / 2;
        printf("%s: %s: %.1f casts per layer, %.1f outside; %.1f adds and %.1f matmuls fewer per layer\n", where, name, per_layer, outside, adds, mms);
        int want_casts = on & 1 ? CASTS_PER_LAYER_FUSED : CASTS_PER_LAYER;
        int want_adds = (on & 1 ? ADDS_FUSED_PER_LAYER : 0) + (on & 4 ? ADDS_LN_FUSED_PER_LAYER + (on & 1 ? 0 : ADDS_LN_FWD_PER_LAYER) : 0),
            want_mms = on & 2 ? MATMULS_FUSED_PER_LAYER : 0;
        CHECK(per_layer == want_casts && outside <= CASTS_OUTSIDE && adds == want_adds && mms == want_mms,
              "%s: %s ran %.1f casts per layer (want %d), %.1f outside, %.1f adds fewer per layer (want %d), %.1f matmuls fewer (want %d)", where,
              name, per_layer, want_casts, outside, adds, want_adds, mms, want_mms);
        test_diff d2 = test_diff_f32(fused[0].loss, plain[0].loss, STEPS, 1e-30), d4 = test_diff_f32(fused[1].loss, plain[1].loss, STEPS, 1e-30);
        test_diff drc = test_diff_f32(fused[2].loss, plain[2].loss, STEPS, 1e-30);
        CHECK(d2.worst == 0 && d4.worst == 0 && drc.worst == 0, "%s: %s losses differ: step %zu %.9g vs %.9g (2 layers), step %zu %.9g vs "
              "%.9g (4), step %zu %.9g vs %.9g (recomputed)", where, name, d2.index, d2.got, d2.want, d4.index, d4.got, d4.want, drc.index,
              drc.got, drc.want);
    }
}

/* PDDE_BF16_LOGITS=1: the head's matmul writes bf16 logits that the loss reads. It changes numbers (each
 * logit rounded: 2^-9 relative), so the losses must differ from the f32 logits' (the switch took effect)
 * by far less than 1% (the bf16 vs f32 bound above); and a device's follow the CPU's within 1e-4 (their
 * GEMMs sum in other orders, so a few logits round the other way). cpu_loss: the CPU's losses (device 0
 * fills it). */
static void test_lowp_logits(pdde_context *ctx, int device, const char *where, float cpu_loss[STEPS]) {
    run_result plain, lowp;
    setenv("PDDE_BF16_LOGITS", "0", 1);
    int failed = train(ctx, device, 2, PDDE_BF16, 0, 0, &plain);
    setenv("PDDE_BF16_LOGITS", "1", 1);
    failed = failed || train(ctx, device, 2, PDDE_BF16, 0, 0, &lowp);
    setenv("PDDE_BF16_LOGITS", "0", 1);
    if (failed) {
        CHECK(0, "%s: a run with PDDE_BF16_LOGITS=1 failed", where);
        return;
    }
    test_diff d = test_diff_f32(lowp.loss, plain.loss, STEPS, 1e-30);
    printf("%s: PDDE_BF16_LOGITS=1: losses within %.2e of f32 logits' (step %zu: %.6f vs %.6f), %.1f casts a step\n", where, d.worst, d.index,
           d.got, d.want, lowp.casts_per_step);
    CHECK(d.worst > 0 && d.worst < 1e-3 && lowp.casts_per_step == plain.casts_per_step,
          "%s: PDDE_BF16_LOGITS=1: losses %.9g vs %.9g at step %zu (relative %.2e: want above 0 and below 1e-3), %.1f casts a step vs %.1f", where,
          d.got, d.want, d.index, d.worst, lowp.casts_per_step, plain.casts_per_step);
    if (device == 0) memcpy(cpu_loss, lowp.loss, sizeof lowp.loss);
    else {
        test_diff c = test_diff_f32(lowp.loss, cpu_loss, STEPS, 1e-30);
        CHECK(c.worst < 1e-4, "%s: PDDE_BF16_LOGITS=1: losses %.9g vs the CPU's %.9g at step %zu (relative %.2e)", where, c.got, c.want, c.index,
              c.worst);
    }
}

/* PDDE_BF16_GRADS=1: the bias_gelu backward writes its gradient in bf16 (the cast into the fc matmuls
 * folded in) and the fc bias's gradient is summed from it; and each layernorm backward writes a bf16 copy
 * of its gradient beside its f32 values, the cast into the matmuls before it a view of that copy: 1 cast
 * fewer per layer, and the final norm's (CASTS_OUTSIDE - 1). With PDDE_FUSE_ADD_LN=1 too every residual
 * gradient is a layernorm backward's, and with PDDE_FUSE_EPILOGUE=1 the qkv matmul writes bf16:
 * CASTS_PER_LAYER_GRADS (the attention's output and its input gradient are left). The copies are the
 * cast's bits; the bf16 bias gradient changes numbers (summed from rounded values, 2^-9 relative each), so
 * the losses must differ from the f32 gradients' by far less than the bf16 vs f32 bound (1e-3 relative),
 * be the same bits with the other switches on and with recomputed blocks, and a device's follow the CPU's
 * within 1e-4 (as PDDE_BF16_LOGITS's). cpu_loss: the CPU's (device 0 fills it). */
static void test_bf16_grads(pdde_context *ctx, int device, const char *where, float cpu_loss[STEPS]) {
    run_result plain, grads[3], all[3], att[3];
    int failed = train(ctx, device, 2, PDDE_BF16, 0, 0, &plain);
    setenv("PDDE_BF16_GRADS", "1", 1);
    failed = failed || train(ctx, device, 2, PDDE_BF16, 0, 0, &grads[0]) || train(ctx, device, 4, PDDE_BF16, 0, 0, &grads[1]) ||
             train(ctx, device, 2, PDDE_BF16, 0, 2, &grads[2]);
    setenv("PDDE_FUSE_EPILOGUE", "1", 1), setenv("PDDE_FUSE_ADD_LN", "1", 1);
    failed = failed || train(ctx, device, 2, PDDE_BF16, 0, 0, &all[0]) || train(ctx, device, 4, PDDE_BF16, 0, 0, &all[1]) ||
             train(ctx, device, 2, PDDE_BF16, 0, 2, &all[2]);
    setenv("PDDE_ATT_LOWP", "1", 1);
    failed = failed || train(ctx, device, 2, PDDE_BF16, 0, 0, &att[0]) || train(ctx, device, 4, PDDE_BF16, 0, 0, &att[1]) ||
             train(ctx, device, 2, PDDE_BF16, 0, 2, &att[2]);
    setenv("PDDE_BF16_GRADS", "0", 1), setenv("PDDE_FUSE_EPILOGUE", "0", 1), setenv("PDDE_FUSE_ADD_LN", "0", 1), setenv("PDDE_ATT_LOWP", "0", 1);
    if (failed) {
        CHECK(0, "%s: a run with PDDE_BF16_GRADS=1 failed", where);
        return;
    }
    double per_layer = (grads[1].casts_per_step - grads[0].casts_per_step) / 2, outside = grads[0].casts_per_step - 2 * per_layer;
    double per_layer_all = (all[1].casts_per_step - all[0].casts_per_step) / 2, outside_all = all[0].casts_per_step - 2 * per_layer_all;
    test_diff d = test_diff_f32(grads[0].loss, plain.loss, STEPS, 1e-30), e = test_diff_f32(all[0].loss, grads[0].loss, STEPS, 1e-30);
    test_diff rc = test_diff_f32(grads[2].loss, grads[0].loss, STEPS, 1e-30), rc_all = test_diff_f32(all[2].loss, grads[0].loss, STEPS, 1e-30);
    printf("%s: PDDE_BF16_GRADS=1: %.1f casts per layer, %.1f outside; with PDDE_FUSE_EPILOGUE=1 PDDE_FUSE_ADD_LN=1: %.1f per layer, %.1f "
           "outside (recomputed blocks: %.1f a step); losses within %.2e of f32 gradients' (step %zu: %.6f vs %.6f)\n", where, per_layer,
           outside, per_layer_all, outside_all, all[2].casts_per_step, d.worst, d.index, d.got, d.want);
    CHECK(per_layer == CASTS_PER_LAYER - 1 && outside == CASTS_OUTSIDE - 1 && per_layer_all == CASTS_PER_LAYER_GRADS &&
              outside_all == CASTS_OUTSIDE && all[2].casts_per_step <= (CASTS_PER_LAYER_GRADS + 4) * 2 + CASTS_OUTSIDE,
          "%s: PDDE_BF16_GRADS=1 ran %.1f casts per layer (want %d), %.1f outside (want %d); with the fusions %.1f per layer (want %d), %.1f "
          "outside (want %d), %.1f a step recomputed", where, per_layer, CASTS_PER_LAYER - 1, outside, CASTS_OUTSIDE - 1, per_layer_all,
          CASTS_PER_LAYER_GRADS, outside_all, CASTS_OUTSIDE, all[2].casts_per_step);
    CHECK(d.worst > 0 && d.worst < 1e-3 && e.worst == 0 && rc.worst == 0 && rc_all.worst == 0,
          "%s: PDDE_BF16_GRADS=1: losses %.9g vs %.9g at step %zu (relative %.2e: want above 0 and below 1e-3); with the fusions "
          "step %zu %.9g vs %.9g, recomputed step %zu %.9g vs %.9g, both step %zu %.9g vs %.9g (want the same bits)", where, d.got, d.want,
          d.index, d.worst, e.index, e.got, e.want, rc.index, rc.got, rc.want, rc_all.index, rc_all.got, rc_all.want);
    /* PDDE_ATT_LOWP=1: the copies are the casts' bits, so the losses are the same bits as without it */
    double per_layer_att = (att[1].casts_per_step - att[0].casts_per_step) / 2, outside_att = att[0].casts_per_step - 2 * per_layer_att;
    test_diff a2 = test_diff_f32(att[0].loss, all[0].loss, STEPS, 1e-30), a4 = test_diff_f32(att[1].loss, all[1].loss, STEPS, 1e-30),
              arc = test_diff_f32(att[2].loss, all[2].loss, STEPS, 1e-30);
    printf("%s: and PDDE_ATT_LOWP=1: %.1f casts per layer, %.1f outside (recomputed blocks: %.1f a step)\n", where, per_layer_att, outside_att,
           att[2].casts_per_step);
    CHECK(per_layer_att == CASTS_PER_LAYER_ATT && outside_att == CASTS_OUTSIDE && att[2].casts_per_step < all[2].casts_per_step &&
              a2.worst == 0 && a4.worst == 0 && arc.worst == 0,
          "%s: PDDE_ATT_LOWP=1 ran %.1f casts per layer (want %d), %.1f outside (want %d), %.1f a step recomputed (vs %.1f); losses step "
          "%zu %.9g vs %.9g (2 layers), step %zu %.9g vs %.9g (4), step %zu %.9g vs %.9g (recomputed): want the same bits", where, per_layer_att,
          CASTS_PER_LAYER_ATT, outside_att, CASTS_OUTSIDE, att[2].casts_per_step, all[2].casts_per_step, a2.index, a2.got, a2.want, a4.index,
          a4.got, a4.want, arc.index, arc.got, arc.want);
    if (device == 0) memcpy(cpu_loss, grads[0].loss, sizeof grads[0].loss);
    else {
        test_diff c = test_diff_f32(grads[0].loss, cpu_loss, STEPS, 1e-30);
        CHECK(c.worst < 1e-4, "%s: PDDE_BF16_GRADS=1: losses %.9g vs the CPU's %.9g at step %zu (relative %.2e)", where, c.got, c.want, c.index,
              c.worst);
    }
}

/* PDDE_FUSE_GELU=1: each layer's fc matmul adds the bias and applies gelu in its epilogue, keeping X = h + bias,
 * and the matmul before the bias_gelu backward multiplies by gelu'(X): no bias_gelu or bias_gelu_back runs.
 * In f32 (X kept in f32) the losses are unfused's bits, with every other fusion on too and with recomputed
 * blocks; in bf16 X is kept rounded (as cublasLt keeps it, in the output's dtype), so the losses differ
 * from unfused's (the switch took effect) by far less than 1e-3 relative, and a device's follow the CPU's
 * within 1e-4 (as PDDE_BF16_GRADS's). cpu_loss: the CPU's bf16 losses (device 0 fills it). */
static void test_fuse_gelu(pdde_context *ctx, int device, const char *where, float cpu_loss[STEPS]) {
    run_result plain32, plain16, fused32[3], fused16, all32, allf32;
    int failed = train(ctx, device, 2, PDDE_F32, 0, 0, &plain32) || train(ctx, device, 2, PDDE_BF16, 0, 0, &plain16);
    setenv("PDDE_FUSE_EPILOGUE", "1", 1), setenv("PDDE_FUSE_GRAD", "1", 1), setenv("PDDE_FUSE_ADD_LN", "1", 1);
    failed = failed || train(ctx, device, 2, PDDE_F32, 0, 0, &all32);
    setenv("PDDE_FUSE_GELU", "1", 1);
    failed = failed || train(ctx, device, 2, PDDE_F32, 0, 0, &allf32);
    setenv("PDDE_FUSE_EPILOGUE", "0", 1), setenv("PDDE_FUSE_GRAD", "0", 1), setenv("PDDE_FUSE_ADD_LN", "0", 1);
    failed = failed || train(ctx, device, 2, PDDE_F32, 0, 0, &fused32[0]) || train(ctx, device, 4, PDDE_F32, 0, 0, &fused32[1]) ||
             train(ctx, device, 2, PDDE_F32, 0, 2, &fused32[2]) || train(ctx, device, 2, PDDE_BF16, 0, 0, &fused16);
    setenv("PDDE_FUSE_GELU", "0", 1);
    run_result rc32;
    failed = failed || train(ctx, device, 2, PDDE_F32, 0, 2, &rc32);
    if (failed) {
        CHECK(0, "%s: a run with PDDE_FUSE_GELU=1 failed", where);
        return;
    }
    test_diff d32 = test_diff_f32(fused32[0].loss, plain32.loss, STEPS, 1e-30), drc = test_diff_f32(fused32[2].loss, rc32.loss, STEPS, 1e-30),
              dall = test_diff_f32(allf32.loss, all32.loss, STEPS, 1e-30), d16 = test_diff_f32(fused16.loss, plain16.loss, STEPS, 1e-30);
    printf("%s: PDDE_FUSE_GELU=1: %.1f bias_gelu(_back) a step (without: %.1f); bf16 losses within %.2e of unfused (step %zu: %.6f vs %.6f)\n",
           where, fused32[1].gelus_per_step, plain32.gelus_per_step, d16.worst, d16.index, d16.got, d16.want);
    CHECK(fused32[0].gelus_per_step == 0 && fused32[1].gelus_per_step == 0 && fused16.gelus_per_step == 0 && plain32.gelus_per_step == 2 * 2 &&
              fused32[0].matmuls_per_step == plain32.matmuls_per_step &&
              fused16.casts_per_step == plain16.casts_per_step,
          "%s: PDDE_FUSE_GELU=1 ran %.1f, %.1f, %.1f bias_gelu(_back) a step (2, 4 layers, bf16; want 0; unfused %.1f), %.1f casts vs %.1f", where,
          fused32[0].gelus_per_step, fused32[1].gelus_per_step, fused16.gelus_per_step, plain32.gelus_per_step, fused16.casts_per_step,
          plain16.casts_per_step);
    CHECK(d32.worst == 0 && drc.worst == 0 && dall.worst == 0, "%s: PDDE_FUSE_GELU=1 f32 losses differ from unfused: step %zu %.9g vs %.9g, "
          "recomputed step %zu %.9g vs %.9g, with every fusion step %zu %.9g vs %.9g", where, d32.index, d32.got, d32.want, drc.index, drc.got,
          drc.want, dall.index, dall.got, dall.want);
    CHECK(d16.worst > 0 && d16.worst < 1e-3, "%s: PDDE_FUSE_GELU=1 bf16 losses %.9g vs %.9g at step %zu (relative %.2e: want above 0 and below 1e-3)",
          where, d16.got, d16.want, d16.index, d16.worst);
    if (device == 0) memcpy(cpu_loss, fused16.loss, sizeof fused16.loss);
    else {
        test_diff c = test_diff_f32(fused16.loss, cpu_loss, STEPS, 1e-30);
        CHECK(c.worst < 1e-4, "%s: PDDE_FUSE_GELU=1: losses %.9g vs the CPU's %.9g at step %zu (relative %.2e)", where, c.got, c.want, c.index,
              c.worst);
    }
}

/* PDDE_FUSE_CE=1: the loss's forward also writes dlogits (into its backward's memory; the backward computes
 * nothing): the session has one such cross-entropy and no backward that computes (one without). The CPU computes
 * them with the backward's code, so its losses are the same bits, in f32 and bf16 and with recomputed blocks; a
 * device's kernel sums each row's exponentials in another order (a running maximum), so its losses follow the
 * unfused ones on that device within 1e-5 relative and the CPU's within 1e-4 (as above). cpu_loss: the CPU's bf16
 * losses (device 0 fills it). */
static void test_fuse_ce(pdde_context *ctx, int device, const char *where, float cpu_loss[STEPS]) {
    run_result plain[3], fused[3];
    setenv("PDDE_FUSE_CE", "0", 1);
    int failed = train(ctx, device, 2, PDDE_F32, 0, 0, &plain[0]) || train(ctx, device, 2, PDDE_BF16, 0, 0, &plain[1]) ||
                 train(ctx, device, 2, PDDE_BF16, 0, 2, &plain[2]);
    setenv("PDDE_FUSE_CE", "1", 1);
    failed = failed || train(ctx, device, 2, PDDE_F32, 0, 0, &fused[0]) || train(ctx, device, 2, PDDE_BF16, 0, 0, &fused[1]) ||
             train(ctx, device, 2, PDDE_BF16, 0, 2, &fused[2]);
    setenv("PDDE_FUSE_CE", "0", 1);
    if (failed) {
        CHECK(0, "%s: a run with PDDE_FUSE_CE=1 failed", where);
        return;
    }
    double bound = device == 0 ? 0 : 1e-5;
    const char *what[3] = {"f32", "bf16", "bf16 recomputed"};
    for (int k = 0; k < 3; k++) {
        test_diff d = test_diff_f32(fused[k].loss, plain[k].loss, STEPS, 1e-30);
        printf("%s: PDDE_FUSE_CE=1 %s: %d fused cross-entropy, %d cross_entropy_back that computes (without: %d, %d), losses within %.2e "
               "of unfused\n", where, what[k], fused[k].ce_fused, fused[k].ce_backs, plain[k].ce_fused, plain[k].ce_backs, d.worst);
        CHECK(fused[k].ce_fused == 1 && fused[k].ce_backs == 0 && plain[k].ce_fused == 0 && plain[k].ce_backs == 1 && d.worst <= bound &&
                  fused[k].casts_per_step == plain[k].casts_per_step,
              "%s: PDDE_FUSE_CE=1 %s: %d fused cross-entropy and %d cross_entropy_back that computes (want 1, 0; unfused %d, %d), %.1f casts "
              "vs %.1f, losses %.9g vs %.9g at step %zu (relative %.2e, want at most %.0e)", where, what[k], fused[k].ce_fused, fused[k].ce_backs,
              plain[k].ce_fused, plain[k].ce_backs, fused[k].casts_per_step, plain[k].casts_per_step, d.got, d.want, d.index, d.worst, bound);
    }
    if (device == 0) memcpy(cpu_loss, fused[1].loss, sizeof fused[1].loss);
    else {
        test_diff c = test_diff_f32(fused[1].loss, cpu_loss, STEPS, 1e-30);
        CHECK(c.worst < 1e-4, "%s: PDDE_FUSE_CE=1: losses %.9g vs the CPU's %.9g at step %zu (relative %.2e)", where, c.got, c.want, c.index,
              c.worst);
    }
}

#ifdef PDDE_HAVE_UCX
enum { RANK_STEPS = 4 };
typedef struct { int ok; char error[160]; float loss[5][RANK_STEPS]; double casts[5]; } rank_result;

/* arg: the gpt_plan; runs it with the casts folded (default) and with PDDE_FOLD_CASTS=0 */
static void rank_train(pdde_context *ctx, pdde_comm *world, void *arg) {
    rank_result *out = test_rank_result;
    const gpt_plan *plan = arg;
    const gpt_config cfg = {.vocab = 64, .ctx = 8, .layers = 2, .heads = 2, .width = 32, .batch = 4};
    pdde_status st = PDDE_OK;
    for (int variant = 0; variant < 5 && !st; variant++) { /* folded (default), PDDE_FOLD_CASTS=0, every fusion, and PDDE_BF16_GRADS,
                                                             and PDDE_ATT_LOWP and PDDE_FUSE_GELU */
        if (variant == 1) setenv("PDDE_FOLD_CASTS", "0", 1);
        if (variant >= 2) setenv("PDDE_FUSE_EPILOGUE", "1", 1), setenv("PDDE_FUSE_GRAD", "1", 1), setenv("PDDE_FUSE_ADD_LN", "1", 1);
        if (variant >= 3) setenv("PDDE_BF16_GRADS", "1", 1);
        if (variant == 4) setenv("PDDE_ATT_LOWP", "1", 1), setenv("PDDE_FUSE_GELU", "1", 1);
        pdde_graph *g;
        pdde_session *s;
        gpt_model m;
        int64_t first = 0;
        st = gpt_test_rank_session(ctx, world, &cfg, plan, PDDE_BF16, &g, &s, &m);
        for (int step = 0; step < RANK_STEPS && !st; step++) {
            st = gpt_test_rank_step(s, &m, plan, world, step);
            out->loss[variant][step] = pdde_session_loss(s);
            if (step == 0) first = pdde_session_op_runs(s, PDDE_OP_CAST);
        }
        out->casts[variant] = (double)(pdde_session_op_runs(s, PDDE_OP_CAST) - first) / (RANK_STEPS - 1);
        pdde_session_free(s);
        pdde_graph_free(g);
        unsetenv("PDDE_FOLD_CASTS");
        setenv("PDDE_FUSE_EPILOGUE", "0", 1), setenv("PDDE_FUSE_GRAD", "0", 1), setenv("PDDE_FUSE_ADD_LN", "0", 1), setenv("PDDE_BF16_GRADS", "0", 1);
        setenv("PDDE_ATT_LOWP", "0", 1), setenv("PDDE_FUSE_GELU", "0", 1);
    }
    out->ok = st == PDDE_OK;
    if (st) snprintf(out->error, sizeof out->error, "%s", pdde_last_error(ctx));
}

static void test_ranks(pdde_context *ctx) {
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    if (!srv) { CHECK(0, "store: %s", pdde_last_error(ctx)); return; }
    static const struct { const char *name; gpt_plan plan; } plans[] = {
        {"dp 2, ZeRO-1", {.dp = 2, .tp = 1, .pp = 1, .micro = 1, .zero = 1}},
        {"dp 2, ZeRO-2", {.dp = 2, .tp = 1, .pp = 1, .micro = 1, .zero = 2}},
        {"tp 2", {.dp = 1, .tp = 2, .pp = 1, .micro = 1}},
    };
    for (size_t k = 0; k < sizeof plans / sizeof plans[0]; k++) {
        rank_result res[2];
        memset(res, 0, sizeof res);
        test_ranks_params tp = {.addr = addr, .prefix = plans[k].name, .timeout_s = 60, .n_threads = 1, .server = srv, .results = res,
                                .result_size = sizeof *res};
        CHECK(test_run_ranks(2, &tp, rank_train, (void *)&plans[k].plan, 300) == 0, "%s: the 2 ranks exit cleanly", plans[k].name);
        for (int r = 0; r < 2; r++) {
            CHECK(res[r].ok, "%s, rank %d: %s", plans[k].name, r, res[r].error);
            test_diff d = test_diff_f32(res[r].loss[0], res[r].loss[1], RANK_STEPS, 1e-30);
            printf("%s, rank %d: %.1f casts a step (PDDE_FOLD_CASTS=0: %.1f), losses %.6f .. %.6f\n", plans[k].name, r, res[r].casts[0],
                   res[r].casts[1], res[r].loss[0][0], res[r].loss[0][RANK_STEPS - 1]);
            CHECK(res[r].ok && d.worst == 0 && res[r].casts[0] < res[r].casts[1], "%s, rank %d: step %zu loss %.9g vs %.9g with PDDE_FOLD_CASTS=0; "
                  "%.1f casts a step vs %.1f", plans[k].name, r, d.index, d.got, d.want, res[r].casts[0], res[r].casts[1]);
            test_diff f = test_diff_f32(res[r].loss[2], res[r].loss[0], RANK_STEPS, 1e-30);
            CHECK(res[r].ok && f.worst == 0 && res[r].casts[2] <= res[r].casts[0], "%s, rank %d: step %zu loss %.9g vs %.9g with every fusion (PDDE_FUSE_*=1); "
                  "%.1f casts a step vs %.1f", plans[k].name, r, f.index, f.got, f.want, res[r].casts[2], res[r].casts[0]);
            /* PDDE_BF16_GRADS=1 too: the bias gradients from bf16 values (1e-3, as on one process), fewer casts */
            test_diff b = test_diff_f32(res[r].loss[3], res[r].loss[2], RANK_STEPS, 1e-30);
            CHECK(res[r].ok && b.worst > 0 && b.worst < 1e-3 && res[r].casts[3] < res[r].casts[2], "%s, rank %d: PDDE_BF16_GRADS=1: step %zu loss "
                  "%.9g vs %.9g (relative %.2e); %.1f casts a step vs %.1f", plans[k].name, r, b.index, b.got, b.want, b.worst, res[r].casts[3],
                  res[r].casts[2]);
            /* PDDE_ATT_LOWP=1 and PDDE_FUSE_GELU=1 too: the attention's casts gone, X of the gelu kept in bf16 (1e-3, as on one process) */
            test_diff a = test_diff_f32(res[r].loss[4], res[r].loss[3], RANK_STEPS, 1e-30);
            CHECK(res[r].ok && a.worst < 1e-3 && res[r].casts[4] < res[r].casts[3], "%s, rank %d: PDDE_ATT_LOWP=1 PDDE_FUSE_GELU=1: step %zu loss "
                  "%.9g vs %.9g (relative %.2e); %.1f casts a step vs %.1f", plans[k].name, r, a.index, a.got, a.want, a.worst, res[r].casts[4],
                  res[r].casts[3]);
        }
    }
    pdde_store_server_free(srv);
}
#endif

int main(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    unsetenv("PDDE_FOLD_CASTS");
    setenv("PDDE_FUSE_EPILOGUE", "0", 1), setenv("PDDE_FUSE_GRAD", "0", 1), setenv("PDDE_FUSE_ADD_LN", "0", 1), setenv("PDDE_BF16_LOGITS", "0", 1);
    setenv("PDDE_BF16_GRADS", "0", 1), setenv("PDDE_ATT_LOWP", "0", 1), setenv("PDDE_FUSE_GELU", "0", 1), setenv("PDDE_FUSE_CE", "0", 1);
    setenv("PDDE_FUSE_BGRAD", "0", 1);
    /* (the same bits fused and unfused holds where one GEMM routine runs both: cublasLt picks other algorithms for a
     * matmul with an epilogue than for a plain one, so on CUDA these comparisons take cuBLAS's GemmEx and the
     * kernels; cublasLt's fused matmuls are checked within tolerances by test_backend_ops) */
    setenv("PDDE_CUDA_LT", "0", 1);
    test_device(ctx, 0, "cpu", NULL);
    test_fused(ctx, 0, "cpu");
    float cpu_loss[STEPS], cpu_grads_loss[STEPS], cpu_gelu_loss[STEPS], cpu_ce_loss[STEPS];
    test_fuse_ce(ctx, 0, "cpu", cpu_ce_loss);
    test_lowp_logits(ctx, 0, "cpu", cpu_loss);
    test_bf16_grads(ctx, 0, "cpu", cpu_grads_loss);
    test_fuse_gelu(ctx, 0, "cpu", cpu_gelu_loss);
    if (pdde_device_count(ctx) < 2) test_skip("opencl", "no device besides the CPU (PoCL in CI): the casts on a GPU backend");
    for (int d = 1; d < pdde_device_count(ctx); d++) {
        pdde_device_props props;
        pdde_device_get_props(ctx, d, &props);
        char where[320];
        snprintf(where, sizeof where, "%s (%s)", props.name, props.backend);
        test_device(ctx, d, where, NULL);
        unsetenv("PDDE_FOLD_CASTS");
        test_fused(ctx, d, where);
        test_lowp_logits(ctx, d, where, cpu_loss);
        test_bf16_grads(ctx, d, where, cpu_grads_loss);
        test_fuse_gelu(ctx, d, where, cpu_gelu_loss);
        test_fuse_ce(ctx, d, where, cpu_ce_loss);
    }
#ifdef PDDE_HAVE_UCX
    test_ranks(ctx);
#else
    test_skip("ucx", "pdde built without UCX: the casts on 2 ranks");
#endif
    pdde_context_free(ctx);
    return test_finish();
}
