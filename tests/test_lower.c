/* test_lower — lowering is a pure pass: compiling a session never changes the user's graph (every
 * node byte for byte, before, during and after), a graph compiles again and again under different
 * plans with identical programs and losses (also with nodes on the OpenCL device, which used to
 * leave the first compile's copy nodes in the graph), and any rank's program of any plan is printed
 * without a communicator. (That the program each rank runs is the one lowered for it elsewhere is
 * checked for every plan of test_spmd, by test_spmd.) */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>

#define STEPS 4
static const gpt_config cfg = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 8};

/* Every node of g, byte for byte (the structs themselves: ops, shapes, sources, params, flags,
 * attributes, data pointers, names). */
typedef struct { int n; pdde_tensor *nodes; } snapshot;

static snapshot snap(const pdde_graph *g) {
    snapshot s = {pdde_graph_tensor_count(g), NULL};
    s.nodes = malloc((size_t)(s.n + 1) * sizeof *s.nodes);
    for (int i = 0; i < s.n; i++) memcpy(&s.nodes[i], pdde_graph_tensor(g, i), sizeof *s.nodes);
    return s;
}

/* The first node that differs from the snapshot (-1: none; n: the node count changed). */
static int changed(const snapshot *s, const pdde_graph *g) {
    if (pdde_graph_tensor_count(g) != s->n) return s->n;
    for (int i = 0; i < s->n; i++)
        if (memcmp(&s->nodes[i], pdde_graph_tensor(g, i), sizeof *s->nodes)) return i;
    return -1;
}

static char *dump_session(const pdde_session *s) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    pdde_session_dump(s, f);
    fclose(f);
    return buf;
}

static char *dump_lowered(const pdde_graph *g, const pdde_session_params *sp, int world, int rank, pdde_status *st) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    *st = pdde_lower_dump(g, sp, world, rank, f);
    fclose(f);
    return buf;
}

/* Compiles g under sp, trains STEPS steps on fixed batches from the same initial parameters, and
 * returns the losses and the program; checks that g is unchanged while the session lives and after. */
static int train(pdde_graph *g, gpt_model *m, const pdde_session_params *sp, const char *what, float *losses, char **program) {
    snapshot before = snap(g);
    pdde_session *s = NULL;
    pdde_status st = pdde_session_init(g, sp, &s);
    CHECK(st == PDDE_OK, "%s: compile: %s", what, pdde_last_error(pdde_graph_context(g)));
    if (st) { free(before.nodes); return -1; }
    *program = dump_session(s);
    int32_t x[8 * 16], y[8 * 16];
    for (int step = 0; step < STEPS && !st; step++) {
        for (int i = 0; i < 8 * 16; i++) x[i] = (i * 7 + step * 13 + i / 5) % cfg.vocab, y[i] = (i * 3 + step * 5 + 1) % cfg.vocab;
        st = pdde_session_write(s, m->ids, x, sizeof x);
        if (!st) st = pdde_session_write(s, m->targets, y, sizeof y);
        if (!st) st = pdde_session_run(s, PDDE_RUN_STEP);
        losses[step] = pdde_session_loss(s);
    }
    CHECK(st == PDDE_OK, "%s: training: %s", what, pdde_last_error(pdde_graph_context(g)));
    int c = changed(&before, g);
    CHECK(c < 0, "%s: a live session changed node %d of the user's graph", what, c);
    pdde_session_free(s);
    c = changed(&before, g);
    CHECK(c < 0, "%s: compiling changed node %d of the user's graph", what, c);
    free(before.nodes);
    return st ? -1 : 0;
}

static bool same_losses(const float *a, const float *b) {
    for (int i = 0; i < STEPS; i++)
        if (!(a[i] == b[i])) return false; /* (NaN differs) */
    return true;
}

/* One process, plans A (all on the CPU) and B (the blocks on device `dev`): A, B, A again. */
static void test_recompile(pdde_context *ctx, int dev, const char *dev_name) {
    pdde_graph *g;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f;
    gpt_plan gp = {.dp = 1, .tp = 1, .pp = 1, .micro = 1};
    CHECK(gpt_build_plan(g, &cfg, &gp, &op, &m) == PDDE_OK, "build: %s", pdde_last_error(ctx));
    int layer_dev[8];
    for (int l = 0; l < cfg.layers + 2; l++) layer_dev[l] = l >= 1 && l <= cfg.layers ? dev : -1;
    pdde_session_params a = PDDE_SESSION_PARAMS_INIT, b = a;
    b.layer_devices = layer_dev, b.n_layer_devices = cfg.layers + 2;
    float la[STEPS], lb[STEPS], la2[STEPS];
    char *pa = NULL, *pb = NULL, *pa2 = NULL, what[96];
    snprintf(what, sizeof what, "blocks on %s", dev_name);
    if (train(g, &m, &a, "plan A (cpu)", la, &pa) || train(g, &m, &b, what, lb, &pb) || train(g, &m, &a, "plan A again", la2, &pa2)) goto done;
    CHECK(strcmp(pa, pa2) == 0, "plan A compiled after plan B gives another program");
    CHECK(same_losses(la, la2), "plan A compiled after plan B gives other losses: %.7f vs %.7f", la[STEPS - 1], la2[STEPS - 1]);
    if (dev > 0) {
        CHECK(strstr(pb, " copy ") && !strstr(pa, " copy "), "plan B copies at the device boundaries, plan A none");
        double worst = 0;
        for (int i = 0; i < STEPS; i++) worst = fmax(worst, fabs(la[i] - lb[i]) / fabs(la[i]));
        CHECK(worst <= 1e-4, "blocks on %s: losses differ from the CPU's by %.3g relative", dev_name, worst);
        /* compiled again with the blocks on the device: the same program and the same losses */
        char *pb2 = NULL;
        float lb2[STEPS];
        if (!train(g, &m, &b, "plan B again", lb2, &pb2)) {
            CHECK(strcmp(pb, pb2) == 0, "plan B compiled again gives another program");
            CHECK(same_losses(lb, lb2), "plan B compiled again gives other losses: %.7f vs %.7f", lb[STEPS - 1], lb2[STEPS - 1]);
        }
        free(pb2);
    }
    /* the program a session runs is the one pdde_lower_dump prints, with nothing compiled */
    pdde_status st;
    char *lowered = dump_lowered(g, &b, 0, 0, &st);
    CHECK(st == PDDE_OK && strcmp(lowered, pb) == 0, "pdde_lower_dump prints the program plan B's session ran");
    free(lowered);
done:
    free(pa), free(pb), free(pa2);
    pdde_graph_free(g);
}

/* Rank programs of a dp x tp x pp plan, lowered without a communicator: each rank's names its stage,
 * its peers and its groups; lowering ranks in any order gives the same programs; the graph is unchanged. */
static void test_rank_programs(pdde_context *ctx) {
    pdde_graph *g;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.grad_accum_steps = 4;
    gpt_plan gp = {.dp = 2, .tp = 2, .pp = 2, .micro = 4, .zero = 1}; /* dp2 x tp2 x pp2, 4 micro-batches, ZeRO-1 */
    CHECK(gpt_build_plan(g, &cfg, &gp, &op, &m) == PDDE_OK, "build: %s", pdde_last_error(ctx));
    snapshot before = snap(g);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.overlap_gradients = -1;
    char *prog[8];
    pdde_status st = PDDE_OK;
    for (int r = 0; r < 8 && !st; r++) prog[r] = dump_lowered(g, &sp, 8, r, &st);
    CHECK(st == PDDE_OK, "lowering 8 ranks: %s", pdde_last_error(ctx));
    for (int r = 0; r < 8 && !st; r++) {
        char stage[64];
        snprintf(stage, sizeof stage, "rank %d, mesh dp=2 tp=2 pp=2", r);
        CHECK(strstr(prog[r], stage) && strstr(prog[r], "pipeline stage") && strstr(prog[r], " over tp ["),
              "rank %d's program names its rank, its stage and its tensor-parallel group", r);
        CHECK(strstr(prog[r], r < 4 ? " send " : " recv "), "rank %d (stage %d) %s", r, r / 4, r < 4 ? "sends" : "receives");
    }
    /* the same, lowered in reverse order */
    for (int r = 7; r >= 0 && !st; r--) {
        char *again = dump_lowered(g, &sp, 8, r, &st);
        CHECK(st == PDDE_OK && strcmp(again, prog[r]) == 0, "rank %d lowered again gives another program", r);
        free(again);
    }
    int c = changed(&before, g);
    CHECK(c < 0, "lowering changed node %d of the user's graph", c);
    /* a rank outside the world is an error, not a program */
    char *bad = dump_lowered(g, &sp, 8, 8, &st);
    CHECK(st == PDDE_ERR_INVALID_ARG, "rank 8 of 8 is refused");
    free(bad);
    for (int r = 0; r < 8; r++) free(prog[r]);
    free(before.nodes);
    pdde_graph_free(g);
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1;
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    test_recompile(ctx, 0, "cpu");
    int dev = pdde_device_find(ctx, "opencl", 0);
    if (dev >= 0) test_recompile(ctx, dev, "opencl");
    else printf("SKIP: no OpenCL device: the recompile with blocks on a device is not tested\n");
    test_rank_programs(ctx);
    pdde_context_free(ctx);
    return test_finish();
}
