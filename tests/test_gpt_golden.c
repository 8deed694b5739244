/* test_gpt_golden — pdde's GPT and LLaMA-style model against PyTorch (llm.c style). tools/gen_golden.py
 * wrote tests/data/gpt_golden.bin and gpt_golden_llama.bin (RMSNorm, SwiGLU, RoPE, grouped-query
 * attention) with torch: fixed weights and batch, the logits, the loss, every parameter gradient, the
 * losses of 10 AdamW steps and the parameters after them. Tolerances below are stated per quantity;
 * float32 reassociation alone moves results by ~1e-6 relative. With a path: that fixture only. */
#include "tests/gpt_golden.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>

/* Tolerances: about 10x the worst measured (OpenBLAS and the portable GEMM builds; printed each run) */
typedef struct { double logits, loss, grad, param; } golden_tolerances;
static const golden_tolerances gpt_tol = {
    .logits = 2e-6,  /* measured 1.7e-7 */
    .loss = 1.5e-6,  /* measured 1.2e-7 */
    .grad = 7e-6,    /* measured 6.5e-7 */
    .param = 1e-4,   /* measured 5.9e-5 (AdamW divides by small second moments) */
};
static const golden_tolerances llama_tol = {
    .logits = 2e-6,  /* measured 1.5e-7, 2.2e-7 in the portable build */
    .loss = 1.5e-6,  /* measured 1.2e-7 */
    .grad = 7e-6,    /* measured 6.0e-7 */
    .param = 4e-4,   /* measured 4.2e-5 */
};

static void check_fixture(const char *path) {
    const char *why = "";
    golden_fixture fx;
    int ok = golden_load(path, &fx, &why);
    CHECK(ok, "fixture %s: %s", path, why);
    if (!ok) return;
    printf("%s: %s\n", path, gpt_arch_name(fx.cfg.arch));
    const golden_tolerances *tol = fx.cfg.arch == GPT_ARCH_LLAMA ? &llama_tol : &gpt_tol;
    const double TOL_LOGITS = tol->logits, TOL_LOSS = tol->loss, TOL_GRAD = tol->grad, TOL_PARAM = tol->param;
    gpt_config cfg = fx.cfg;
    int n_steps = fx.n_steps, BT = fx.BT;
    uint32_t n_params = fx.n_params;
    const golden_record *grads = fx.grads, *final = fx.final;
    const float *logits_ref = fx.logits, *losses_ref = fx.losses;
    float loss_ref = fx.loss;

    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    gpt_model m = {0};
    CHECK(pdde_context_init(NULL, &ctx) == PDDE_OK, "context");
    CHECK(golden_session(ctx, &fx, PDDE_F32, &g, &m, &s) == PDDE_OK, "model: %s", pdde_last_error(ctx));
    if (test_failed) return;

    /* step 0 in two halves, to look at the gradients before the update */
    CHECK(pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD) == PDDE_OK, "run: %s", pdde_last_error(ctx));
    float *logits = malloc((size_t)BT * cfg.vocab * 4);
    pdde_session_read(s, m.logits, logits, (size_t)BT * cfg.vocab * 4);
    double e = golden_rel_err(logits, logits_ref, (int64_t)BT * cfg.vocab);
    CHECK(e < TOL_LOGITS, "logits differ: rel err %.3g (tolerance %.3g)", e, TOL_LOGITS);
    printf("logits: rel err %.2g (tolerance %.2g)\n", e, TOL_LOGITS);
    float loss0 = pdde_session_loss(s);
    double worst_loss = test_close_all("step 0 loss", &loss0, &loss_ref, 1, 0, TOL_LOSS);
    double worst = 0;
    for (uint32_t i = 0; i < n_params; i++) {
        pdde_tensor *t = pdde_graph_find(g, grads[i].name);
        float *gbuf = malloc((size_t)grads[i].n * 4);
        pdde_session_read(s, t->grad, gbuf, (size_t)grads[i].n * 4);
        e = golden_rel_err(gbuf, grads[i].data, grads[i].n);
        CHECK(e < TOL_GRAD, "gradient of %s: rel err %.3g (tolerance %.3g)", grads[i].name, e, TOL_GRAD);
        worst = !(e <= worst) ? e : worst;
        free(gbuf);
    }
    printf("loss %.6f (torch %.6f), worst gradient rel err %.2g (tolerance %.2g)\n", pdde_session_loss(s), loss_ref, worst, TOL_GRAD);
    CHECK(pdde_session_run(s, PDDE_RUN_OPTIMIZER) == PDDE_OK, "optimizer run");
    for (int step = 1; step < n_steps; step++) {
        CHECK(pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK, "step %d", step);
        float l = pdde_session_loss(s);
        char what[32];
        snprintf(what, sizeof what, "step %d loss", step);
        double el = test_close_all(what, &l, &losses_ref[step], 1, 0, TOL_LOSS);
        worst_loss = !(el <= worst_loss) ? el : worst_loss;
        printf("step %d loss %.6f torch %.6f\n", step, l, losses_ref[step]);
    }
    worst = 0;
    for (uint32_t i = 0; i < n_params; i++) {
        pdde_tensor *t = pdde_graph_find(g, final[i].name);
        float *pbuf = malloc((size_t)final[i].n * 4);
        pdde_session_read(s, t, pbuf, (size_t)final[i].n * 4);
        e = golden_rel_err(pbuf, final[i].data, final[i].n);
        CHECK(e < TOL_PARAM, "parameter %s after %d steps: rel err %.3g (tolerance %.3g)", final[i].name, n_steps, e, TOL_PARAM);
        worst = !(e <= worst) ? e : worst;
        free(pbuf);
    }
    printf("losses: worst rel err %.2g (tolerance %.2g)\n", worst_loss, TOL_LOSS);
    printf("parameters after %d AdamW steps: worst rel err %.2g (tolerance %.2g)\n", n_steps, worst, TOL_PARAM);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    golden_free(&fx);
    free(logits);
}

/* gpt_n_params (the MFU's and the planner's count) against the parameters a session of the model holds */
static void check_n_params(const char *what, const gpt_config *cfg) {
    pdde_context *ctx;
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_memory_stats ms = {0};
    pdde_status st = pdde_context_init(NULL, &ctx);
    if (!st) st = pdde_graph_init(ctx, &g);
    if (!st) st = gpt_build(g, cfg, &m);
    if (!st) st = pdde_session_init(g, NULL, &s);
    if (!st) pdde_session_memory(s, &ms);
    CHECK(!st && ms.param_bytes == (size_t)gpt_n_params(cfg) * 4, "%s: gpt_n_params %lld, the session holds %zu bytes of parameters (%s)", what,
          (long long)gpt_n_params(cfg), ms.param_bytes, st ? pdde_last_error(ctx) : "");
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        check_fixture(argv[1]);
    } else {
        check_fixture("tests/data/gpt_golden.bin");
        check_fixture("tests/data/gpt_golden_llama.bin");
        gpt_config llama = {.vocab = 256, .ctx = 16, .layers = 3, .heads = 8, .width = 64, .batch = 2, .arch = GPT_ARCH_LLAMA, .kv_heads = 2};
        check_n_params("LLaMA, 2 kv heads", &llama);
        CHECK(gpt_ffn(&llama) == 192, "LLaMA's default ffn of width 64: 8/3 x 64 rounded up to a multiple of 32 is 192, got %lld",
              (long long)gpt_ffn(&llama));
        llama.moe_experts = 4, llama.moe_every = 2;
        check_n_params("LLaMA with MoE blocks", &llama);
        llama.arch = GPT_ARCH_GPT, llama.kv_heads = 0;
        check_n_params("GPT with MoE blocks", &llama);
    }
    return test_finish();
}
