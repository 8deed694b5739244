/* test_moe_device — an MoE GPT (8 experts, top-2, the balance loss in the loss) trained with the whole
 * step on each OpenCL device (PoCL's in CI; and each CUDA device with PDDE_CUDA_MOE=1) equals the
 * all-CPU run step by step: every MoE op (routing, dispatch, grouped GEMMs, combine, balance loss and their gradients) runs on the
 * device, none left to the CPU. Dropless, with a capacity (tokens dropped) and with the experts' buffer
 * by expert. The runs differ in float32 rounding only (device GEMMs and reduction orders): the bound is
 * the cross-device GPT's, 1e-6 relative over 10 steps. A route flipped by a rounding difference would
 * move a loss far more than that. */
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include "tests/gpt_test_steps.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define STEPS 10

static int is_moe(pdde_op op) { return op >= PDDE_OP_MOE_TOPK && op <= PDDE_OP_MOE_AUX_LOSS_BACK; }

/* the losses of STEPS AdamW steps with the whole graph on device; the MoE nodes on it and elsewhere */
static int train(pdde_context *ctx, const gpt_config *cfg, int device, float *losses, int *moe_on, int *moe_off) {
    pdde_graph *g;
    pdde_session *s;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.weight_decay = 0.1f, op.clip_norm = 1.0f;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    if (gpt_build(g, cfg, &m) || pdde_backward(g, m.loss) || pdde_optimizer_adamw(g, &op) || pdde_session_init(g, &sp, &s)) {
        fprintf(stderr, "session: %s\n", pdde_last_error(ctx));
        pdde_graph_free(g);
        return -1;
    }
    *moe_on = *moe_off = 0;
    for (int i = 0; i < pdde_session_node_count(s); i++) {
        const pdde_tensor *t = pdde_session_node(s, i);
        if (is_moe(t->op)) ++*(t->device == device ? moe_on : moe_off);
    }
    int rc = gpt_test_train(ctx, s, &m, STEPS, losses);
    pdde_session_free(s);
    pdde_graph_free(g);
    return rc;
}

/* the backends whose MoE kernels run: OpenCL, and CUDA with PDDE_CUDA_MOE=1 */
static int moe_kernels_on(const char *backend) {
    const char *env = getenv("PDDE_CUDA_MOE");
    return !strcmp(backend, "opencl") || (!strcmp(backend, "cuda") && env && env[0] && strcmp(env, "0") != 0);
}

static void test_device(pdde_context *ctx, int accel) {
    pdde_device_props props;
    pdde_device_get_props(ctx, accel, &props);
    static const struct { const char *what; float capacity; int topk, ep; } runs[] = {
        {"dropless, top-2", 0.0f, 2, 0},
        {"capacity 1.0, top-1 (tokens dropped)", 1.0f, 1, 0},
        {"by expert (the ep layout), top-2", 0.0f, 2, 1},
    };
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        gpt_config cfg = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 4};
        cfg.moe_experts = 8, cfg.moe_topk = runs[r].topk, cfg.moe_capacity = runs[r].capacity, cfg.moe_aux = 0.01f, cfg.moe_ep = runs[r].ep;
        float cpu[STEPS], dev[STEPS];
        int on_cpu, off_cpu, on_dev, off_dev;
        CHECK(train(ctx, &cfg, 0, cpu, &on_cpu, &off_cpu) == 0, "%s: the CPU run", runs[r].what);
        CHECK(train(ctx, &cfg, accel, dev, &on_dev, &off_dev) == 0, "%s: the run on %s: %s", runs[r].what, props.name, pdde_last_error(ctx));
        CHECK(on_dev > 0 && on_dev == on_cpu && off_dev == 0, "%s: %d MoE nodes on %s, %d left to the CPU (the CPU run has %d)", runs[r].what,
              on_dev, props.backend, off_dev, on_cpu);
        for (int i = 0; i < STEPS; i++) printf("%s: step %d  cpu %.7f  %s %.7f\n", runs[r].what, i, cpu[i], props.backend, dev[i]);
        char label[96];
        snprintf(label, sizeof label, "%s: losses on %s against the CPU", runs[r].what, props.backend);
        test_close_all(label, dev, cpu, STEPS, 0, 1e-6);
        CHECK(isfinite(cpu[STEPS - 1]) && cpu[STEPS - 1] < cpu[0], "%s: the model learns (%g -> %g)", runs[r].what, cpu[0], cpu[STEPS - 1]);
    }
}

int main(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    int devices = 0;
    for (int d = 1; d < pdde_device_count(ctx); d++) {
        pdde_device_props p;
        pdde_device_get_props(ctx, d, &p);
        if (moe_kernels_on(p.backend)) test_device(ctx, d), devices++;
    }
    if (!devices) test_skip("opencl", "no OpenCL device (PoCL in CI), nor CUDA with PDDE_CUDA_MOE=1: the MoE GPT on a device");
    pdde_context_free(ctx);
    return test_finish();
}
