/* test_gpt_devices — one graph across two devices: the GPT's embedding and head on the CPU, its
 * transformer blocks on the first non-CPU device (PoCL's OpenCL device in CI). Copy nodes are
 * inserted at every device boundary; the per-step losses must match the all-CPU run. The two runs
 * differ only in float32 rounding (CLBlast vs OpenBLAS GEMMs, kernel reduction orders), which AdamW
 * amplifies a little each step: the bound is 1e-6 relative over 10 steps (measured on PoCL: 1.1e-7). */
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include "tests/gpt_test_steps.h"
#include <stdlib.h>
#include <string.h>

#define STEPS 10

static const gpt_config cfg = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 4};

/* blocks_device: the blocks placed by hand (layer devices); or with plan, the planner's placement
 * (pdde_plan_apply of a plan with place=<backend>) */
static int train(pdde_context *ctx, int blocks_device, const pdde_plan *plan, float *losses, int *n_copies) {
    pdde_graph *g;
    pdde_session *s;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.weight_decay = 0.1f, op.clip_norm = 1.0f;
    int layer_devices[8] = {0};
    for (int l = 1; l <= cfg.layers; l++) layer_devices[l] = blocks_device;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.layer_devices = layer_devices, sp.n_layer_devices = cfg.layers + 2;
    if (gpt_build(g, &cfg, &m)) return -1;
    if (plan ? pdde_plan_apply(g, plan, m.loss, &op, NULL, &s)
             : pdde_backward(g, m.loss) || pdde_optimizer_adamw(g, &op) || pdde_session_init(g, &sp, &s)) {
        fprintf(stderr, "session: %s\n", pdde_last_error(ctx));
        pdde_graph_free(g);
        return -1;
    }
    *n_copies = 0;
    for (int i = 0; i < pdde_session_node_count(s); i++) *n_copies += pdde_session_node(s, i)->op == PDDE_OP_COPY;
    int rc = gpt_test_train(ctx, s, &m, STEPS, losses);
    pdde_session_free(s);
    pdde_graph_free(g);
    return rc;
}

/* The simulated planner on a placed plan: pdde_plan_evaluate with a cluster (a CPU and a 10x faster
 * OpenCL device on one machine) simulates place=<backend> with the blocks lowered onto this process's
 * device of that backend and timed on the cluster's: the same step time as simulating that program by
 * hand, and less than the unplaced plan's. */
static void test_simulated_placement(pdde_context *ctx, int accel, const char *backend) {
    gpt_plan_builder b = {.cfg = cfg, .opt = PDDE_OPTIMIZER_PARAMS_INIT};
    pdde_cluster *cl;
    pdde_cluster_init("placed", &cl);
    pdde_device_spec cpu = {.kind = PDDE_DEVICE_CPU, .backend = "cpu", .peak_flops = 1e11, .mem_bandwidth = 1e10};
    pdde_device_spec acc = {.kind = PDDE_DEVICE_GPU, .peak_flops = 1e12, .mem_bandwidth = 1e11};
    snprintf(acc.backend, sizeof acc.backend, "%s", backend);
    pdde_cluster_add_spec(cl, &cpu), pdde_cluster_add_spec(cl, &acc);
    pdde_cluster_machine mm = {.id = 0, .intra = {-1, -1, PDDE_LINK_PCIE, 5e9, 5e-6, -1}, .nic = {-1, -1, PDDE_LINK_NET, 0, 0, -1}};
    int mi = pdde_cluster_add_machine(cl, &mm);
    pdde_cluster_add_device(cl, mi, &(pdde_cluster_device){10, 0, 1ull << 30});
    pdde_cluster_add_device(cl, mi, &(pdde_cluster_device){11, 1, 1ull << 30});
    double fl = 1e11, bw = 1e10, mem = 1e9, pfl = 1e12, pbw = 1e11, pmem = 1e9;
    pdde_plan_devices d = {.n_devices = 1, .flops = &fl, .mem_bw = &bw, .memory = &mem, .place_flops = &pfl, .place_mem_bw = &pbw,
                           .place_memory = &pmem, .place_bw = 5e9, .place_lat = 5e-6};
    snprintf(d.place_backend, sizeof d.place_backend, "%s", backend);
    pdde_graph *g;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    gpt_build(g, &cfg, &m);
    pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
    pp.batch = cfg.batch, pp.cluster = cl, pp.build = gpt_plan_build, pp.build_user = &b;
    char text[64];
    snprintf(text, sizeof text, "dp=1,place=%s", backend);
    pdde_plan placed, plain;
    pdde_plan_parse(text, &placed), pdde_plan_parse("dp=1", &plain);
    CHECK(pdde_plan_evaluate(g, &d, &pp, &placed) == PDDE_OK && !placed.why[0], "simulated %s: %s %s", text, pdde_last_error(ctx), placed.why);
    CHECK(pdde_plan_evaluate(g, &d, &pp, &plain) == PDDE_OK && !plain.why[0], "simulated dp=1: %s", pdde_last_error(ctx));
    /* by hand: the blocks on the local device accel, which the cluster's device 11 times */
    pdde_graph *pg;
    pdde_cost_program *cp = NULL;
    pdde_cost_result *r = NULL;
    pdde_graph_init(ctx, &pg);
    int layer_dev[8], local[8];
    for (int l = 0; l < cfg.layers + 2; l++) layer_dev[l] = l >= 1 && l <= cfg.layers ? accel : -1;
    for (int i = 0; i < 8; i++) local[i] = i == accel ? 11 : -1;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.layer_devices = layer_dev, sp.n_layer_devices = cfg.layers + 2;
    pdde_cost_plan cpl = {0, (const int[]){10}, local, accel + 1};
    pdde_plan q = placed;
    CHECK(accel < 8 && gpt_plan_build(pg, &q, &b) == PDDE_OK && pdde_cost_program_from_plan(cl, pg, &sp, &cpl, &cp) == PDDE_OK &&
              pdde_cost_simulate(ctx, cl, cp, &r) == PDDE_OK, "by hand: %s", pdde_last_error(ctx));
    printf("simulated: %s %.3g s (by hand %.3g s), unplaced %.3g s\n", text, placed.step_s, r ? r->step_time : 0, plain.step_s);
    CHECK(r && placed.step_s == r->step_time && placed.step_s < plain.step_s, "%s simulated %g s, by hand %g s, unplaced %g s", text, placed.step_s,
          r ? r->step_time : 0, plain.step_s);
    pdde_cost_result_free(r), pdde_cost_program_free(cp), pdde_graph_free(pg), pdde_graph_free(g);
    pdde_cluster_free(cl);
}

int main(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    int accel = -1;
    for (int d = 1; d < pdde_device_count(ctx) && accel < 0; d++) accel = d;
    if (accel < 0) {
        test_skip("opencl", "no device besides the CPU (PoCL in CI): the cross-device GPT");
        pdde_context_free(ctx);
        return test_finish();
    }
    pdde_device_props props;
    pdde_device_get_props(ctx, accel, &props);
    float cpu[STEPS], mixed[STEPS], planned[STEPS];
    int copies_cpu = 0, copies_mixed = 0, copies_planned = 0;
    CHECK(train(ctx, 0, NULL, cpu, &copies_cpu) == 0, "all-CPU run");
    CHECK(train(ctx, accel, NULL, mixed, &copies_mixed) == 0, "run with the blocks on %s (%s)", props.name, props.backend);
    CHECK(copies_cpu == 0 && copies_mixed > 0, "copy nodes at the device boundaries: %d (all CPU: %d)", copies_mixed, copies_cpu);
    /* the planner's placement of the blocks (plan text place=<backend>), run by pdde_plan_apply */
    char text[64];
    snprintf(text, sizeof text, "dp=1,tp=1,pp=1,mb=1,place=%s", props.backend);
    pdde_plan plan;
    CHECK(pdde_plan_parse(text, &plan) == PDDE_OK, "parse %s", text);
    CHECK(train(ctx, 0, &plan, planned, &copies_planned) == 0, "plan %s: %s", text, pdde_last_error(ctx));
    CHECK(copies_planned == copies_mixed, "plan %s: %d copy nodes, the blocks placed by hand %d", text, copies_planned, copies_mixed);
    for (int i = 0; i < STEPS; i++) printf("step %d  cpu %.6f  cpu+%s %.6f  planned %.6f\n", i, cpu[i], props.backend, mixed[i], planned[i]);
    double worst = test_close_all("losses, blocks on the device against all CPU", mixed, cpu, STEPS, 0, 1e-6);
    test_close_all("losses, the plan's placement against all CPU", planned, cpu, STEPS, 0, 1e-6);
    CHECK(cpu[STEPS - 1] < cpu[0], "the model learns");
    test_simulated_placement(ctx, accel, props.backend);
    printf("blocks on %s (%s): %d copy nodes, worst relative loss difference %.2g\n", props.name, props.backend, copies_mixed, worst);
    pdde_context_free(ctx);
    return test_finish();
}
