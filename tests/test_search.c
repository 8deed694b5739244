/* test_search — the planner search (planner/search.c): on small clusters it returns the exhaustive
 * optimum of its own estimate over every degree, micro-batch count, ZeRO stage, recompute and stage
 * cut; it never returns a plan that does not fit; degenerate clusters (one device, a prime number,
 * one much slower, one with little memory, nothing that fits) give sensible plans or clear reasons;
 * on a training graph its memory prediction for one process is the session's allocation. */
#define _GNU_SOURCE /* open_memstream */
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>

enum { MAXD = 16, MAX_PLANS = 64 };

typedef struct {
    double flops[MAXD], bw[MAXD], mem[MAXD];
    int host[MAXD];
    pdde_plan_devices d;
} cluster;

static void cluster_init(cluster *c, int n, double flops, double bw, double mem, int per_host) {
    memset(c, 0, sizeof *c);
    for (int i = 0; i < n; i++) c->flops[i] = flops, c->bw[i] = bw, c->mem[i] = mem, c->host[i] = i / per_host;
    c->d = (pdde_plan_devices){.n_devices = n, .flops = c->flops, .mem_bw = c->bw, .memory = c->mem, .host = c->host, .intra_bw = 20e9,
                               .intra_lat = 2e-6, .inter_bw = 2e9, .inter_lat = 20e-6};
}

static pdde_graph *small_gpt(pdde_context *ctx, int layers, int batch) {
    pdde_graph *g;
    gpt_model m;
    gpt_config c = {.vocab = 256, .ctx = 16, .layers = layers, .heads = 4, .width = 64, .batch = batch};
    pdde_graph_init(ctx, &g);
    CHECK(gpt_build(g, &c, &m) == PDDE_OK, "gpt_build: %s", pdde_last_error(ctx));
    return g;
}

static int plan_devices(const pdde_plan *p) { return p->dp * p->tp * p->pp; }

/* Every per-stage count of recomputed layers (each stage's first k) of plan p under its cut; the best
 * fitting step time. */
static double every_recompute(pdde_graph *g, const cluster *c, const pdde_plan_params *pp, pdde_plan *p, int *n_evaluated) {
    double best = INFINITY;
    int k[PDDE_PLAN_MAX_STAGES] = {0};
    for (;;) {
        pdde_plan q = *p;
        memcpy(q.recompute_layers, k, sizeof k);
        if (pdde_plan_evaluate(g, &c->d, pp, &q) == PDDE_OK && !q.why[0] && q.step_s < best) best = q.step_s;
        (*n_evaluated)++;
        int s = 0; /* next vector: k[s] in 0..layers of stage s */
        while (s < p->pp && k[s] == p->stage_first[s + 1] - p->stage_first[s]) k[s++] = 0;
        if (s == p->pp) return best;
        k[s]++;
    }
}

/* Every uneven share vector of dp indices (each >= 1, not all equal) out of u = dp + 1 .. 4 dp units
 * dividing the batch, into v[1..] with its units (v[0]: equal shares, dp units); the count with it. */
enum { MAX_SHARE_VECTORS = 128 };
static void compose(int dp, int k, int left, int u, int *x, int (*v)[PDDE_PLAN_MAX_SHARES], int *units, int *n) {
    if (k == dp - 1) {
        x[k] = left;
        bool equal = true;
        for (int i = 1; i < dp; i++) equal &= x[i] == x[0];
        if (!equal && *n < MAX_SHARE_VECTORS) memset(v[*n], 0, sizeof v[0]), memcpy(v[*n], x, (size_t)dp * sizeof *x), units[(*n)++] = u;
        return;
    }
    for (int a = 1; a <= left - (dp - k - 1); a++) x[k] = a, compose(dp, k + 1, left - a, u, x, v, units, n);
}
static int share_vectors(int dp, int64_t batch, int (*v)[PDDE_PLAN_MAX_SHARES], int *units) {
    int n = 1, x[PDDE_PLAN_MAX_SHARES];
    memset(v[0], 0, sizeof v[0]), units[0] = dp;
    for (int u = dp + 1; u <= 4 * dp && u <= batch && dp > 1; u++)
        if (batch % u == 0) compose(dp, 0, u, u, x, v, units, &n);
    return n;
}

/* The best fitting step time over every plan the search may consider: degrees, layouts, uneven
 * shares, micro-batch counts, interleaving, comm dtypes, ZeRO stages, every stage cut and every
 * per-stage recompute count. */
static double exhaustive(pdde_graph *g, const cluster *c, const pdde_plan_params *pp, int L, int *n_evaluated) {
    double best = INFINITY;
    int max_micro = pp->max_micro;
    static int shares[MAX_SHARE_VECTORS][PDDE_PLAN_MAX_SHARES], units[MAX_SHARE_VECTORS];
    for (int n = 1; n <= c->d.n_devices; n++)
        for (int tp = 1; tp <= n; tp++)
            for (int pipe = 1; pipe * tp <= n; pipe++) {
                if (n % (tp * pipe) || (pp->tp_divisor % tp) || pipe > L) continue;
                int dp = n / tp / pipe, n_shares = share_vectors(dp, pp->batch, shares, units);
                for (int blocks = 0; blocks <= (pipe > 1); blocks++)
                    for (int o = 0; o < n_shares; o++)
                    for (int m = 1; m <= max_micro && m <= pp->batch / units[o]; m++)
                        for (int v = 1; v <= 4; v *= 2)
                            for (int bf = 0; bf <= (dp * tp > 1); bf++)
                                for (int zero = 0; zero <= (dp > 1 ? (o && pipe > 1 ? 1 : 3) : 0); zero++) {
                                    if (pp->batch % ((int64_t)units[o] * m) || (v > 1 && (pipe == 1 || m % pipe || L < v * pipe))) continue;
                                    pdde_plan p = {.dp = dp, .tp = tp, .pp = pipe, .micro = m, .zero = zero, .chunks = v, .stage_blocks = blocks,
                                                   .comm_dtype = bf ? PDDE_BF16 : PDDE_F32};
                                    memcpy(p.shares, shares[o], sizeof p.shares);
                                    if (v > 1) { /* interleaved: the even cut, every layer recomputed or none */
                                        for (int rc = 0; rc <= 1; rc++) {
                                            pdde_plan q = p;
                                            q.recompute = rc;
                                            if (pdde_plan_evaluate(g, &c->d, pp, &q) == PDDE_OK && !q.why[0] && q.step_s < best) best = q.step_s;
                                            (*n_evaluated)++;
                                        }
                                        continue;
                                    }
                                    /* every cut of L layers into `pipe` non-empty runs: choose pipe-1 of the L-1 gaps */
                                    int cut[PDDE_PLAN_MAX_STAGES + 1];
                                    for (int s = 0; s < pipe; s++) cut[s] = s;
                                    cut[pipe] = L;
                                    for (;;) {
                                        memcpy(p.stage_first, cut, sizeof cut);
                                        best = fmin(best, every_recompute(g, c, pp, &p, n_evaluated));
                                        int s = pipe - 1; /* next combination of cut[1..pipe-1] */
                                        while (s >= 1 && cut[s] == L - (pipe - s)) s--;
                                        if (s < 1) break;
                                        cut[s]++;
                                        for (int k = s + 1; k < pipe; k++) cut[k] = cut[k - 1] + 1;
                                    }
                                }
            }
    return best;
}

/* Every plan returned as fitting fits when evaluated on its own, and its prediction is reproduced; every
 * one returned as rejected says why, and does not fit when evaluated. */
static void check_plans(pdde_graph *g, const cluster *c, const pdde_plan_params *pp, const pdde_plan *plans, int nf, int nr) {
    for (int i = nf; i < nf + nr; i++) {
        pdde_plan p = plans[i];
        char s[256];
        pdde_plan_str(&p, s, sizeof s);
        CHECK(plans[i].why[0] && pdde_plan_evaluate(g, &c->d, pp, &p) == PDDE_OK && p.why[0], "rejected plan %s says why ('%s') and does not fit when evaluated ('%s')",
              s, plans[i].why, p.why);
    }
    for (int i = 0; i < nf; i++) {
        pdde_plan p = plans[i];
        char s[256];
        pdde_plan_str(&p, s, sizeof s);
        CHECK(pdde_plan_evaluate(g, &c->d, pp, &p) == PDDE_OK && !p.why[0], "plan %s fits when evaluated: %s", s, p.why);
        CHECK(p.peak_bytes <= c->mem[p.peak_device], "plan %s: %.0f B on device %d of %.0f B", s, p.peak_bytes, p.peak_device, c->mem[p.peak_device]);
        CHECK(fabs(p.step_s - plans[i].step_s) <= 1e-12 * p.step_s, "plan %s: search said %g s, evaluate %g s", s, plans[i].step_s, p.step_s);
        CHECK(i == 0 || plans[i].step_s >= plans[i - 1].step_s, "plans sorted by step time");
    }
}


/* A non-GPT graph: the MLP of examples/mlp.c made deep, each block a layer (x @ W1 + b1, relu, @ W2 + b2),
 * then a head layer, for the planner's entry points. */
enum { MLP_B = 16, MLP_IN = 16, MLP_HID = 64, MLP_BLOCKS = 4, MLP_K = 4 };
typedef struct {
    pdde_tensor *x, *t, *loss;
} mlp;

static pdde_graph *mlp_build(pdde_context *ctx, mlp *m) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    char name[32];
    pdde_graph_set_layer(g, 0);
    m->x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){MLP_B, MLP_IN});
    m->t = pdde_input(g, "target", PDDE_I32, 1, (int64_t[]){MLP_B});
    pdde_tensor *h = m->x;
    for (int l = 0; l < MLP_BLOCKS; l++) {
        pdde_graph_set_layer(g, l);
        snprintf(name, sizeof name, "w1.%d", l);
        pdde_tensor *w1 = pdde_param(g, name, 2, (int64_t[]){MLP_IN, MLP_HID}, 0.3f);
        snprintf(name, sizeof name, "b1.%d", l);
        pdde_tensor *b1 = pdde_param(g, name, 1, (int64_t[]){MLP_HID}, 0.0f);
        snprintf(name, sizeof name, "w2.%d", l);
        pdde_tensor *w2 = pdde_param(g, name, 2, (int64_t[]){MLP_HID, MLP_IN}, 0.3f);
        snprintf(name, sizeof name, "b2.%d", l);
        pdde_tensor *b2 = pdde_param(g, name, 1, (int64_t[]){MLP_IN}, 0.0f);
        h = pdde_bias_add(g, pdde_matmul(g, pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, h, w1, 0, 0), b1)), w2, 0, 0), b2);
    }
    pdde_graph_set_layer(g, MLP_BLOCKS);
    pdde_tensor *wo = pdde_param(g, "wo", 2, (int64_t[]){MLP_IN, MLP_K}, 0.3f);
    m->loss = pdde_cross_entropy(g, pdde_matmul(g, h, wo, 0, 0), m->t);
    pdde_graph_set_layer(g, -1);
    CHECK(pdde_graph_status(g) == PDDE_OK, "mlp: %s", pdde_last_error(ctx));
    return g;
}

/* Losses of 5 steps of the MLP on fixed data (its session compiled by the caller). */
static void mlp_train(pdde_session *s, const mlp *m, float *losses) {
    float xs[MLP_B * MLP_IN];
    int32_t ts[MLP_B];
    for (int i = 0; i < MLP_B * MLP_IN; i++) xs[i] = (float)((i * 37) % 11) / 11.0f - 0.5f;
    for (int i = 0; i < MLP_B; i++) ts[i] = i % MLP_K;
    for (int step = 0; step < 5; step++) {
        pdde_session_write(s, m->x, xs, sizeof xs);
        pdde_session_write(s, m->t, ts, sizeof ts);
        CHECK(pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK, "mlp step %d", step);
        losses[step] = pdde_session_loss(s);
    }
}

/* A cluster of one machine of n CPU-like devices with `memory` bytes each. */
static pdde_cluster *cpu_cluster(int n, double memory) {
    pdde_cluster *c;
    pdde_cluster_init("test", &c);
    pdde_device_spec spec;
    memset(&spec, 0, sizeof spec);
    snprintf(spec.name, sizeof spec.name, "cpu-like");
    snprintf(spec.backend, sizeof spec.backend, "cpu");
    spec.kind = PDDE_DEVICE_CPU, spec.peak_flops = 1e11, spec.mem_bandwidth = 1e10;
    pdde_cluster_add_spec(c, &spec);
    pdde_cluster_machine mc;
    memset(&mc, 0, sizeof mc);
    mc.intra = (pdde_cluster_link){0, 0, PDDE_LINK_SHM, 2e10, 2e-6, -1};
    mc.nic = (pdde_cluster_link){0, 0, PDDE_LINK_NET, 2e9, 2e-5, -1};
    pdde_cluster_add_machine(c, &mc);
    for (int i = 0; i < n; i++) pdde_cluster_add_device(c, 0, &(pdde_cluster_device){i, 0, (uint64_t)memory});
    return c;
}

/* Re-planning: a device of a 4-device cluster lost gives a valid plan on the other 3; added back, a
 * plan on all 4 again. */
static void test_replan(pdde_graph *g, const pdde_plan_params *pp) {
    cluster c;
    cluster_init(&c, 4, 1e11, 1e10, 1e9, 4);
    pdde_plan before, lost, back;
    CHECK(pdde_plan_replan(g, &c.d, pp, NULL, &before) == PDDE_OK && plan_devices(&before) == 4 && !before.why[0],
          "4 devices: %s", pdde_last_error(pdde_graph_context(g)));
    cluster three;
    cluster_init(&three, 3, 1e11, 1e10, 1e9, 4);
    CHECK(pdde_plan_replan(g, &three.d, pp, &before, &lost) == PDDE_OK && plan_devices(&lost) == 3 && !lost.why[0] &&
          lost.peak_bytes <= 1e9 && lost.step_s > before.step_s, "a device lost: %dx%dx%d, %g s (4 devices: %g s): %s", lost.dp, lost.tp,
          lost.pp, lost.step_s, before.step_s, pdde_last_error(pdde_graph_context(g)));
    CHECK(pdde_plan_replan(g, &c.d, pp, &lost, &back) == PDDE_OK && plan_devices(&back) == 4 && test_close(back.step_s, before.step_s, 1e-12, 0),
          "added back: %dx%dx%d, %g s (before %g s)", back.dp, back.tp, back.pp, back.step_s, before.step_s);
    /* the old plan is kept when it is as good as the best (no reshard for nothing) */
    pdde_plan same;
    CHECK(pdde_plan_replan(g, &c.d, pp, &back, &same) == PDDE_OK && same.dp == back.dp && same.tp == back.tp && same.pp == back.pp &&
          same.micro == back.micro && same.zero == back.zero, "unchanged devices keep the plan");
    char s[3][128];
    pdde_plan_str(&before, s[0], sizeof s[0]), pdde_plan_str(&lost, s[1], sizeof s[1]), pdde_plan_str(&back, s[2], sizeof s[2]);
    printf("replan: 4 devices %s; one lost: %s; added back: %s\n", s[0], s[1], s[2]);
}

/* Plans evaluated by simulating their real programs (params.cluster + build): the prediction is the
 * simulation's, memory the sessions' allocation, and the search ranks its best by it. */
static void test_simulated(pdde_context *ctx) {
    gpt_plan_builder b;
    b.cfg = (gpt_config){.vocab = 256, .ctx = 16, .layers = 2, .heads = 4, .width = 64, .batch = 8};
    b.opt = (pdde_optimizer_params)PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_graph *g;
    gpt_model m;
    pdde_graph_init(ctx, &g);
    gpt_build(g, &b.cfg, &m);
    pdde_cluster *cl;
    pdde_cluster_init("sim", &cl);
    pdde_device_spec spec = {.kind = PDDE_DEVICE_CPU, .peak_flops = 1e11, .mem_bandwidth = 1e10};
    pdde_cluster_add_spec(cl, &spec);
    pdde_cluster_machine mm = {.id = 0, .intra = {-1, -1, PDDE_LINK_SHM, 5e9, 2e-6, -1}, .nic = {-1, -1, PDDE_LINK_NET, 0, 0, -1}};
    int mi = pdde_cluster_add_machine(cl, &mm);
    for (int i = 0; i < 2; i++) pdde_cluster_add_device(cl, mi, &(pdde_cluster_device){10 + i, 0, 1ull << 30});
    pdde_plan_devices d;
    CHECK(pdde_plan_devices_init(ctx, cl, 0, 0, 0, &d) == PDDE_OK, "%s", pdde_last_error(ctx));
    pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
    pp.batch = 8, pp.tp_divisor = 4, pp.max_micro = 4, pp.cluster = cl, pp.build = gpt_plan_build, pp.build_user = &b;
    const char *texts[] = {"dp=2", "tp=2", "pp=2,mb=4"};
    for (int i = 0; i < 3; i++) {
        pdde_plan p, q;
        pdde_plan_parse(texts[i], &p);
        q = p;
        CHECK(pdde_plan_evaluate(g, &d, &pp, &p) == PDDE_OK && !p.why[0], "%s: %s", texts[i], pdde_last_error(ctx));
        /* the same plan simulated by hand */
        pdde_graph *pg;
        pdde_cost_program *cp = NULL;
        pdde_cost_result *r = NULL;
        pdde_graph_init(ctx, &pg);
        pdde_cost_plan cpl = {2, (const int[]){10, 11}, NULL, 0};
        CHECK(gpt_plan_build(pg, &q, &b) == PDDE_OK && pdde_cost_program_from_plan(cl, pg, NULL, &cpl, &cp) == PDDE_OK &&
              pdde_cost_simulate(ctx, cl, cp, &r) == PDDE_OK, "%s by hand: %s", texts[i], pdde_last_error(ctx));
        double peak = 0;
        for (int k = 0; k < 2; k++) {
            pdde_memory_stats ms;
            pdde_predict_memory(pg, NULL, 2, k, &ms);
            peak = fmax(peak, (double)(ms.allocated_bytes + ms.transfer_bytes));
        }
        CHECK(r && p.step_s == r->step_time && p.peak_bytes == peak, "%s: evaluated %g s, %.0f B; simulated %g s, sessions' memory %.0f B",
              texts[i], p.step_s, p.peak_bytes, r ? r->step_time : 0, peak);
        pdde_cost_result_free(r), pdde_cost_program_free(cp), pdde_graph_free(pg);
    }
    /* a device too small for what the sessions would allocate: rejected with the simulated figure */
    double small_mem[2] = {1e5, 1e5};
    pdde_plan_devices tiny = d;
    tiny.memory = small_mem;
    pdde_plan p;
    pdde_plan_parse("dp=2", &p);
    CHECK(pdde_plan_evaluate(g, &tiny, &pp, &p) == PDDE_OK && strstr(p.why, "out of memory on device") && strstr(p.why, "(simulated)"),
          "dp=2 on 100 kB devices: why '%s'", p.why);
    /* the search: its fitting plans are ranked by their simulated step time */
    pdde_plan plans[16];
    int nf = 0, nr = 0;
    CHECK(pdde_plan_search(g, &d, &pp, plans, 16, &nf, &nr) == PDDE_OK && nf > 1, "simulated search: %s", pdde_last_error(ctx));
    for (int i = 0; i < nf; i++) {
        pdde_plan again = plans[i];
        CHECK(pdde_plan_evaluate(g, &d, &pp, &again) == PDDE_OK && again.step_s == plans[i].step_s && (i == 0 || plans[i - 1].step_s <= plans[i].step_s),
              "plan %d: step %g s, simulated again %g s (the one before %g s)", i, plans[i].step_s, again.step_s, i ? plans[i - 1].step_s : 0);
    }
    pdde_plan_devices_free(&d);
    pdde_cluster_free(cl);
    pdde_graph_free(g);
}

/* Device placement: two ranks, each with a second device (an OpenCL one) that may run the blocks
 * (layers 1..L-2). The search places them there when that device is faster, not when it is slower;
 * each device's memory is checked on its own: a placement the second device cannot hold is
 * rejected naming it, and a model the ranks' own devices cannot hold whole fits when placed. */
static void test_placement(pdde_graph *g, const pdde_plan_params *pp, int L) {
    pdde_context *ctx = pdde_graph_context(g);
    cluster c;
    double pf[MAXD], pbw[MAXD], pmem[MAXD];
    pdde_plan plans[MAX_PLANS];
    int nf = 0, nr = 0;
    char s[256];
    cluster_init(&c, 2, 1e10, 1e10, 1e9, 2);
    for (int i = 0; i < 2; i++) pf[i] = 1e12, pbw[i] = 1e11, pmem[i] = 1e9;
    c.d.place_flops = pf, c.d.place_mem_bw = pbw, c.d.place_memory = pmem, c.d.place_bw = 10e9, c.d.place_lat = 1e-5;
    snprintf(c.d.place_backend, sizeof c.d.place_backend, "opencl");

    /* a faster second device: the blocks go there */
    CHECK(pdde_plan_search(g, &c.d, pp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "search: %s", pdde_last_error(ctx));
    pdde_plan_str(&plans[0], s, sizeof s);
    CHECK(!strcmp(plans[0].place, "opencl") && plans[0].pp == 1 && pdde_plan_layer_on_device(&plans[0], L, 1) && pdde_plan_layer_on_device(&plans[0], L, L - 2) &&
              !pdde_plan_layer_on_device(&plans[0], L, 0) && !pdde_plan_layer_on_device(&plans[0], L, L - 1) && strstr(s, ",place=opencl"),
          "a 100x faster second device: the best plan %s places the blocks there", s);
    pdde_plan parsed, own = plans[0];
    CHECK(pdde_plan_parse(s, &parsed) == PDDE_OK && !strcmp(parsed.place, "opencl") && parsed.place_last == 0, "parse '%s'", s);
    own.place[0] = 0, own.stage_first[1] = 0;
    CHECK(pdde_plan_evaluate(g, &c.d, pp, &own) == PDDE_OK && own.step_s > plans[0].step_s, "the same plan unplaced: %g s, placed %g s", own.step_s,
          plans[0].step_s);
    pdde_plan again = plans[0];
    CHECK(pdde_plan_evaluate(g, &c.d, pp, &again) == PDDE_OK && fabs(again.step_s - plans[0].step_s) <= 1e-12 * plans[0].step_s,
          "pdde_plan_evaluate of the placed plan %g s, the search's %g s", again.step_s, plans[0].step_s);
    pdde_plan range;
    CHECK(pdde_plan_parse("dp=2,place=opencl:2-3", &range) == PDDE_OK && range.place_first == 2 && range.place_last == 4 &&
              pdde_plan_layer_on_device(&range, L, 2) && pdde_plan_layer_on_device(&range, L, 3) && !pdde_plan_layer_on_device(&range, L, 1) && !pdde_plan_layer_on_device(&range, L, 4),
          "place=opencl:2-3 places layers 2 and 3");
    pdde_plan_str(&range, s, sizeof s);
    CHECK(strstr(s, ",place=opencl:2-3") != NULL, "written back: %s", s);
    CHECK(pdde_plan_parse("dp=1,place=", &range) != PDDE_OK && pdde_plan_parse("dp=1,place=opencl:3-1", &range) != PDDE_OK, "bad place= refused");

    /* a slower one: nothing placed */
    for (int i = 0; i < 2; i++) pf[i] = 1e9, pbw[i] = 1e9;
    CHECK(pdde_plan_search(g, &c.d, pp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "search: %s", pdde_last_error(ctx));
    pdde_plan_str(&plans[0], s, sizeof s);
    CHECK(plans[0].place[0] == 0, "a 10x slower second device: the best plan %s places nothing", s);

    /* memory per device: the ranks' own devices too small for the whole model, the second device's
     * room enough for the blocks: placed although slower */
    own = plans[0];
    CHECK(pdde_plan_evaluate(g, &c.d, pp, &own) == PDDE_OK, "%s", pdde_last_error(ctx));
    double whole = own.peak_bytes;
    for (int i = 0; i < 2; i++) c.mem[i] = 0.5 * whole;
    pdde_plan_params only_place = *pp; /* (the other ways to fit left out) */
    only_place.no_tp = only_place.no_pp = only_place.no_zero = only_place.no_recompute = 1;
    CHECK(pdde_plan_search(g, &c.d, &only_place, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "search: %s", pdde_last_error(ctx));
    pdde_plan_str(&plans[0], s, sizeof s);
    bool all_placed = true;
    for (int i = 0; i < nf; i++) all_placed &= plans[i].place[0] != 0;
    CHECK(!strcmp(plans[0].place, "opencl") && all_placed,
          "own devices of half the model's %g bytes: the best plan %s places the blocks (%g bytes on the fullest device), and so do all %d that fit",
          whole, s, plans[0].peak_bytes, nf);
    /* and the second device too small for them: every placement rejected, naming it */
    for (int i = 0; i < 2; i++) c.mem[i] = 1e9, pmem[i] = 1e3, pf[i] = 1e12, pbw[i] = 1e11;
    CHECK(pdde_plan_search(g, &c.d, pp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "search: %s", pdde_last_error(ctx));
    int placed_fit = 0, placed_rejected = 0;
    for (int i = 0; i < nf; i++) placed_fit += plans[i].place[0] != 0;
    for (int i = nf; i < nf + nr; i++) placed_rejected += plans[i].place[0] && strstr(plans[i].why, "opencl device") != NULL;
    CHECK(placed_fit == 0 && placed_rejected > 0, "a second device of 1 kB: %d placed plans fit, %d rejected naming it (%s)", placed_fit,
          placed_rejected, nr ? plans[nf].why : "");
    /* with pipeline stages: each stage places the layers of the range it holds (place=opencl:3-4 with
     * stages=3:3: stage 1's two blocks), each part timed on its device and each device's memory checked */
    for (int i = 0; i < 2; i++) c.mem[i] = 1e9, pmem[i] = 1e9, pf[i] = 1e12, pbw[i] = 1e11;
    pdde_plan staged, staged_own;
    CHECK(pdde_plan_parse("dp=1,pp=2,mb=2,stages=3:3,place=opencl:3-4", &staged) == PDDE_OK && pdde_plan_parse("dp=1,pp=2,mb=2,stages=3:3", &staged_own) == PDDE_OK &&
              pdde_plan_evaluate(g, &c.d, pp, &staged) == PDDE_OK && pdde_plan_evaluate(g, &c.d, pp, &staged_own) == PDDE_OK && !staged.why[0],
          "pp=2 with stage 1's blocks placed: %s %s", pdde_last_error(ctx), staged.why);
    CHECK(staged.step_s < staged_own.step_s, "stage 1's blocks on a 100x faster device: %g s, unplaced %g s", staged.step_s, staged_own.step_s);
    for (int i = 0; i < 2; i++) pmem[i] = 1e3;
    CHECK(pdde_plan_evaluate(g, &c.d, pp, &staged) == PDDE_OK && strstr(staged.why, "opencl device") && strstr(staged.why, "stage 1, layers 3-4"),
          "a second device of 1 kB: '%s'", staged.why);
    /* own devices that hold neither the whole model nor a stage of it, second devices that hold no
     * model's blocks whole: only stages with their blocks placed fit, and the search cuts them best */
    pdde_plan one = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .chunks = 1};
    for (int i = 0; i < 2; i++) c.mem[i] = 1e12, pmem[i] = 1e12;
    pdde_plan_evaluate(g, &c.d, pp, &one);
    for (int i = 0; i < 2; i++) c.mem[i] = 0.3 * one.peak_bytes, pmem[i] = 0.4 * one.peak_bytes;
    pdde_plan_params stages_only = *pp;
    stages_only.no_tp = stages_only.no_zero = stages_only.no_recompute = stages_only.use_all_devices = 1;
    CHECK(pdde_plan_search(g, &c.d, &stages_only, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "search: %s", pdde_last_error(ctx));
    pdde_plan_str(&plans[0], s, sizeof s);
    double best_cut = INFINITY;
    for (int cut = 1; cut < L; cut++) {
        pdde_plan q = plans[0];
        q.stage_first[1] = cut, q.stage_first[2] = L;
        if (pdde_plan_evaluate(g, &c.d, &stages_only, &q) == PDDE_OK && !q.why[0]) best_cut = fmin(best_cut, q.step_s);
    }
    CHECK(plans[0].pp == 2 && plans[0].place[0] && fabs(plans[0].step_s - best_cut) <= 1e-12 * best_cut,
          "devices too small for a stage: the best plan %s (%g s) places blocks in stages, cut as the best of every cut (%g s)", s, plans[0].step_s,
          best_cut);
    for (int i = 0; i < nf; i++) { /* (check_plans reads own devices' memory only) */
        pdde_plan q = plans[i];
        CHECK(pdde_plan_evaluate(g, &c.d, &stages_only, &q) == PDDE_OK && !q.why[0] && q.pp == 2 && q.place[0] &&
                  fabs(q.step_s - plans[i].step_s) <= 1e-12 * q.step_s, "fitting plan %d is placed in stages and fits when evaluated: %s", i, q.why);
    }
    printf("placement in stages: %s, %.3g ms\n", s, plans[0].step_s * 1e3);
    /* a plan placing on a kind the devices lack is refused */
    pdde_plan bad;
    pdde_plan_parse("dp=1,place=cuda", &bad);
    CHECK(pdde_plan_evaluate(g, &c.d, pp, &bad) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "cuda"), "place=cuda: %s", pdde_last_error(ctx));
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    pdde_plan plans[MAX_PLANS];
    int nf = 0, nr = 0;
    const int L = 4 + 2; /* a 4-block GPT: embedding, blocks, head */
    pdde_graph *g = small_gpt(ctx, 4, 8);
    pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
    pp.batch = 8, pp.tp_divisor = 4, pp.max_micro = 8;

    /* 1. a heterogeneous 4-device cluster on two hosts whose memory forces sharding: the search's best
     * equals the best of an exhaustive enumeration, cuts included */
    {
        cluster c;
        cluster_init(&c, 4, 1e11, 1e10, 2.6e6, 2);
        c.flops[2] = 5e10, c.flops[3] = 2e10, c.mem[1] = 1.6e6;
        CHECK(pdde_plan_search(g, &c.d, &pp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK, "search: %s", pdde_last_error(ctx));
        int n_eval = 0;
        double best = exhaustive(g, &c, &pp, L, &n_eval);
        char s[256];
        pdde_plan_str(&plans[0], s, sizeof s);
        CHECK(nf > 0 && isfinite(best) && fabs(plans[0].step_s - best) <= 1e-12 * best,
              "search's best %s %.9g s equals the exhaustive optimum %.9g s over %d plans", s, nf ? plans[0].step_s : NAN, best, n_eval);
        CHECK(n_eval > 10000, "the exhaustive search covered %d plans", n_eval);
        printf("exhaustive: %d plans, the best %s %.4g ms, as the search's\n", n_eval, s, best * 1e3);
        /* (two fast devices and two slower ones: a pipeline of each pair, the faster taking 3 of 4 shares) */
        CHECK(nf > 0 && plans[0].pp > 1 && plans[0].shares[0] > plans[0].shares[1], "the best plan gives uneven shares to pipelines: %s", s);
        /* with room for one plan the pruning by lower bound is at its sharpest: still the optimum */
        pdde_plan one[2];
        int nf1 = 0, nr1 = 0;
        CHECK(pdde_plan_search(g, &c.d, &pp, one, 2, &nf1, &nr1) == PDDE_OK && nf1 == 1 && fabs(one[0].step_s - best) <= 1e-12 * best,
              "with one plan kept: %.9g s, the optimum %.9g s", nf1 ? one[0].step_s : NAN, best);
        check_plans(g, &c, &pp, plans, nf, nr);
        CHECK(nr > 0 && strstr(plans[nf].why, "out of memory on device"), "rejected plans say why: '%s'", nr ? plans[nf].why : "");
        pdde_plan whole = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .chunks = 1};
        CHECK(pdde_plan_evaluate(g, &c.d, &pp, &whole) == PDDE_OK && strstr(whole.why, "out of memory"), "one device does not hold the model: '%s'",
              whole.why);
    }
    /* 2. one device: the whole model on it */
    {
        cluster c;
        cluster_init(&c, 1, 1e11, 1e10, 1e9, 1);
        CHECK(pdde_plan_search(g, &c.d, &pp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0 && plan_devices(&plans[0]) == 1,
              "one device: dp=tp=pp=1 (%s)", pdde_last_error(ctx));
    }
    /* 3. a prime number of devices (7) with batch 14: all seven used */
    {
        pdde_graph *g14 = small_gpt(ctx, 4, 14);
        pdde_plan_params p14 = pp;
        p14.batch = 14;
        cluster c;
        cluster_init(&c, 7, 1e11, 1e10, 1e9, 8);
        CHECK(pdde_plan_search(g14, &c.d, &p14, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0 && plan_devices(&plans[0]) == 7,
              "7 devices: the best plan uses all 7 (dp %d tp %d pp %d)", plans[0].dp, plans[0].tp, plans[0].pp);
        check_plans(g14, &c, &p14, plans, nf, nr);
        pdde_graph_free(g14);
    }
    /* 4. one device ten times slower: the plan leaves it out or gives its stage the fewest layers, and
     * beats the uniform plan on all four */
    {
        cluster c;
        cluster_init(&c, 4, 1e11, 1e10, 1e9, 4);
        c.flops[3] = 1e10, c.bw[3] = 1e9;
        CHECK(pdde_plan_search(g, &c.d, &pp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "slow device: %s", pdde_last_error(ctx));
        pdde_plan uniform = {.dp = 4, .tp = 1, .pp = 1, .micro = 1, .chunks = 1};
        pdde_plan_evaluate(g, &c.d, &pp, &uniform);
        pdde_plan *b = &plans[0];
        CHECK(b->step_s < 0.8 * uniform.step_s, "planned %g s against %g s for dp=4 over the slow device", b->step_s, uniform.step_s);
        if (plan_devices(b) == 4 && b->pp > 1) { /* the slow device is rank 3: the last stage (pp innermost) */
            int slow = b->stage_first[b->pp] - b->stage_first[b->pp - 1];
            for (int s = 0; s + 1 < b->pp; s++)
                CHECK(slow <= b->stage_first[s + 1] - b->stage_first[s], "the slow device's stage has the fewest layers (%d)", slow);
        }
    }
    /* 4b. two devices, the second a third as fast (flops and bandwidth): on both, the plan gives the slow
     * one the smaller data-parallel share (uneven shares, by speed) and beats equal shares by over 1.3x;
     * the shares' text reads back; bad shares are refused */
    {
        cluster c;
        cluster_init(&c, 2, 3e10, 3e9, 1e9, 2);
        c.flops[1] = 1e10, c.bw[1] = 1e9;
        pdde_plan_params both = pp;
        both.use_all_devices = 1, both.no_tp = 1, both.no_pp = 1;
        CHECK(pdde_plan_search(g, &c.d, &both, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "a slow second device: %s", pdde_last_error(ctx));
        pdde_plan *b = &plans[0], equal = {.dp = 2, .tp = 1, .pp = 1, .micro = 1, .chunks = 1};
        char s[256];
        pdde_plan_str(b, s, sizeof s);
        pdde_plan_evaluate(g, &c.d, &both, &equal);
        CHECK(b->dp == 2 && b->shares[0] > b->shares[1] && b->shares[1] >= 1, "the slow device gets the smaller share: %s", s);
        CHECK(b->step_s * 1.3 < equal.step_s, "%s: %g s against %g s for equal shares", s, b->step_s, equal.step_s);
        pdde_plan again = *b, back;
        CHECK(pdde_plan_evaluate(g, &c.d, &both, &again) == PDDE_OK && fabs(again.step_s - b->step_s) <= 1e-12 * b->step_s,
              "evaluating %s again predicts what the search did (%g s, %g s)", s, again.step_s, b->step_s);
        CHECK(strstr(s, ",shares=") && pdde_plan_parse(s, &back) == PDDE_OK && !memcmp(back.shares, b->shares, sizeof back.shares),
              "%s reads back with its shares", s);
        static const char *const bad[] = {"dp=2,shares=3", "dp=2,shares=3:0", "dp=2,shares=3:x", "dp=1,shares=1:1", "dp=2,shares=:1"};
        for (int i = 0; i < 5; i++) CHECK(pdde_plan_parse(bad[i], &back) == PDDE_ERR_INVALID_ARG, "'%s' is refused", bad[i]);
        pdde_plan one_index = {.dp = 1, .tp = 1, .pp = 2, .micro = 2, .chunks = 1, .shares = {1}};
        CHECK(pdde_plan_evaluate(g, &c.d, &both, &one_index) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "shares"),
              "shares of one dp index: an error naming them (%s)", pdde_last_error(ctx));
        /* ZeRO-2/3 reduce or gather in every micro-batch: a smaller share makes up the larger's count with
         * phantom micro-batches (one stage only), whose ZeRO-3 gathers the estimate charges */
        bool zero_ok = true;
        for (int i = 0; i < nf; i++) zero_ok &= !(plans[i].shares[0] && plans[i].zero >= 2 && plans[i].pp > 1);
        CHECK(zero_ok, "no plan with shares and stages takes ZeRO 2 or 3");
        pdde_plan staged2 = {.dp = 2, .tp = 1, .pp = 2, .micro = 1, .chunks = 1, .zero = 2, .shares = {3, 1}};
        CHECK(pdde_plan_evaluate(g, &c.d, &both, &staged2) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "ZeRO"),
              "shares with ZeRO-2 and stages: an error naming it (%s)", pdde_last_error(ctx));
        pdde_plan zero3 = {.dp = 2, .tp = 1, .pp = 1, .micro = 1, .chunks = 1, .zero = 3, .shares = {3, 1}};
        CHECK(pdde_plan_evaluate(g, &c.d, &both, &zero3) == PDDE_OK && !zero3.why[0], "shares with ZeRO-3 in one stage are predicted: %s",
              pdde_last_error(ctx));
        pdde_plan gathers = {.dp = 2, .tp = 1, .pp = 1, .micro = 1, .chunks = 1, .zero = 1, .shares = {3, 1}};
        pdde_plan_evaluate(g, &c.d, &both, &gathers);
        CHECK(zero3.step_s > gathers.step_s, "ZeRO-3's gathers, phantom ones included, cost time: %g s against %g s under ZeRO-1", zero3.step_s,
              gathers.step_s);
        printf("a device 3x slower: %s, %.3g ms against %.3g ms for equal shares\n", s, b->step_s * 1e3, equal.step_s * 1e3);
    }
    /* 5. one device with too little memory for anything: left out */
    {
        cluster c;
        cluster_init(&c, 4, 1e11, 1e10, 1e9, 4);
        c.mem[2] = 1e5;
        CHECK(pdde_plan_search(g, &c.d, &pp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0 && plan_devices(&plans[0]) < 4,
              "a 100 kB device is left out (best uses %d)", nf ? plan_devices(&plans[0]) : -1);
        check_plans(g, &c, &pp, plans, nf, nr);
    }
    /* 6. nothing fits: an error naming the closest plan's shortfall */
    {
        cluster c;
        cluster_init(&c, 2, 1e11, 1e10, 1e4, 2);
        int st = pdde_plan_search(g, &c.d, &pp, plans, MAX_PLANS, &nf, &nr);
        CHECK(st == PDDE_ERR_NO_PLAN && nf == 0 && strstr(pdde_last_error(ctx), "out of memory on device"), "no plan: %d '%s'", st,
              pdde_last_error(ctx));
        c.flops[1] = NAN;
        CHECK(pdde_plan_search(g, &c.d, &pp, plans, MAX_PLANS, &nf, &nr) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "device 1"),
              "a NaN speed is refused: %s", pdde_last_error(ctx));
    }
    /* 6b. every device needed and no link measured between them (a cluster file from pdde-bench
     * --no-comm): the error says so, not a bare "no plan fits" */
    {
        cluster c;
        cluster_init(&c, 2, 1e11, 1e10, 1e10, 2);
        c.d.intra_bw = 0;
        pdde_plan_params all = pp;
        all.use_all_devices = 1;
        int st = pdde_plan_search(g, &c.d, &all, plans, MAX_PLANS, &nf, &nr);
        CHECK(st == PDDE_ERR_NO_PLAN && nf == 0 && strstr(pdde_last_error(ctx), "no link bandwidth") &&
              strstr(pdde_last_error(ctx), "pdde-bench without --no-comm"), "no link: %d '%s'", st, pdde_last_error(ctx));
    }
    /* 7. the text form */
    {
        pdde_plan p, q;
        char s[256];
        CHECK(pdde_plan_parse("dp=2,tp=1,pp=2,mb=4,zero=1,recompute=1,stages=4:2", &p) == PDDE_OK && p.dp == 2 && p.pp == 2 && p.micro == 4 &&
              p.zero == 1 && p.recompute == 1 && p.stage_first[1] == 4 && p.stage_first[2] == 6, "parse a plan");
        pdde_plan_str(&p, s, sizeof s);
        CHECK(pdde_plan_parse(s, &q) == PDDE_OK && !memcmp(q.stage_first, p.stage_first, sizeof p.stage_first) && q.dp == p.dp && q.micro == p.micro,
              "round trip through '%s'", s);
        /* bad text: refused, and the message (in why: parsing has no context) names the key at fault */
        static const char *const bad[][2] = {{"dp=0", "dp"}, {"zero=5", "zero"}, {"foo=1", "foo"}, {"dp=2,pp=2,stages=3", "stages"},
            {"dp=x", "dp"}, {"dp=2,,", "a key"}, {"recompute=2", "recompute"}, {"mb=-1", "mb"}, {"pp=2,rc=1", "rc"}, {"comm=f64", "comm"},
            {"sched=zb", "sched"}, {"blocks=2", "blocks"}, {"rc=-1", "rc"}, {"dp=2,shares=3", "shares"}, {"dp=2,shares=3:0", "shares"},
            {"dp=2,shares=3:x", "shares"}, {"dp=1,shares=1:1", "shares"}, {"dp=2,shares=:1", "shares"}, {"dp=1,place=", "place"},
            {"place=opencl:3-1", "place"}, {"place=opencl:1-2x", "place"}, {"pp=65", "pp"}, {"dp=2x", "dp"}, {"stages=0:2", "stages"},
            /* what the text form could not print back: a key twice, a list the other keys make meaningless, a negative ep */
            {"dp=2,dp=4", "dp"}, {"pp=2,rc=1:0,rc=0:1", "rc"}, {"pp=2,chunks=2,stages=1:1", "stages"}, {"pp=2,recompute=1,rc=1:0", "rc"},
            {"dp=2,ep=-2", "ep"}, {"dp=2,stages=1", "stages"}};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
            char key[32];
            snprintf(key, sizeof key, "plan text: %s: want ", bad[i][1]);
            CHECK(pdde_plan_parse(bad[i][0], &p) == PDDE_ERR_INVALID_ARG && strstr(p.why, key), "'%s' is refused naming %s: %s", bad[i][0],
                  bad[i][1], p.why);
        }
        CHECK(pdde_plan_parse("dp=2,ep=1", &p) == PDDE_OK && p.ep == 0, "ep=1 reads as ep 0 (every rank holds every expert): %d", p.ep);
        const char *full = "dp=1,tp=2,pp=2,mb=4,zero=0,recompute=0,stages=4:2,rc=2:0,comm=bf16,sched=gpipe,blocks=1";
        CHECK(pdde_plan_parse(full, &p) == PDDE_OK && p.recompute_layers[0] == 2 && p.recompute_layers[1] == 0 && p.comm_dtype == PDDE_BF16 &&
              p.schedule == PDDE_PIPELINE_GPIPE && p.stage_blocks == 1, "parse '%s'", full);
        pdde_plan_str(&p, s, sizeof s);
        CHECK(!strcmp(s, full), "'%s' is written back as '%s'", full, s);
    }
    /* 9. the search space's dimensions, each where it pays */
    {
        char s[256];
        cluster c;
        cluster_init(&c, 4, 1e11, 1e10, 1e9, 4);
        /* GPipe keeps every micro-batch alive: same predicted time as 1F1B, more memory on the first stage */
        pdde_plan a = {.dp = 1, .tp = 1, .pp = 2, .micro = 4, .chunks = 1}, b = a;
        b.schedule = PDDE_PIPELINE_GPIPE;
        CHECK(pdde_plan_evaluate(g, &c.d, &pp, &a) == PDDE_OK && pdde_plan_evaluate(g, &c.d, &pp, &b) == PDDE_OK && b.peak_bytes > 1.2 * a.peak_bytes &&
                  fabs(a.step_s - b.step_s) <= 1e-12 * a.step_s,
              "GPipe %.0f B vs 1F1B %.0f B, %g s vs %g s", b.peak_bytes, a.peak_bytes, b.step_s, a.step_s);
        /* interleaved stages: a smaller bubble */
        pdde_plan iv = a;
        iv.chunks = 2;
        CHECK(pdde_plan_evaluate(g, &c.d, &pp, &iv) == PDDE_OK && iv.bubble_s < 0.75 * a.bubble_s, "interleaved bubble %g s vs %g s", iv.bubble_s,
              a.bubble_s);
        /* slow links: the best plan sends bf16, faster than the same plan in f32 */
        cluster slow;
        cluster_init(&slow, 4, 1e11, 1e10, 1e9, 1);
        slow.d.inter_bw = 2e6;
        pdde_plan_params every = pp; /* a job's ranks, all started: they must communicate */
        every.use_all_devices = 1, every.no_pp = 1;
        CHECK(pdde_plan_search(g, &slow.d, &every, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "slow links: %s", pdde_last_error(ctx));
        pdde_plan f32 = plans[0];
        f32.comm_dtype = PDDE_F32;
        pdde_plan_str(&plans[0], s, sizeof s);
        CHECK(plans[0].comm_dtype == PDDE_BF16 && pdde_plan_evaluate(g, &slow.d, &every, &f32) == PDDE_OK && f32.step_s > 1.2 * plans[0].step_s,
              "slow links: %s in bf16 %g s, in f32 %g s", s, plans[0].step_s, f32.step_s);
        pdde_plan dp4 = {.dp = 4, .tp = 1, .pp = 1, .micro = 1, .chunks = 1, .comm_dtype = PDDE_BF16}, dp4f = dp4;
        dp4f.comm_dtype = PDDE_F32;
        CHECK(pdde_plan_evaluate(g, &slow.d, &every, &dp4) == PDDE_OK && pdde_plan_evaluate(g, &slow.d, &every, &dp4f) == PDDE_OK &&
                  dp4f.step_s > 1.5 * dp4.step_s, "slow links: dp=4's gradients in bf16 %g s, in f32 %g s", dp4.step_s, dp4f.step_s);
        /* memory between what no recompute and what every layer recomputed need: some layers only */
        pdde_plan none = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .chunks = 1}, all = none;
        all.recompute = 1;
        pdde_plan_evaluate(g, &c.d, &pp, &none), pdde_plan_evaluate(g, &c.d, &pp, &all);
        cluster tight;
        cluster_init(&tight, 1, 1e11, 1e10, (none.peak_bytes + all.peak_bytes) / 2, 1);
        pdde_plan_params one_micro = pp; /* (more micro-batches would fit too) */
        one_micro.max_micro = 1;
        CHECK(pdde_plan_search(g, &tight.d, &one_micro, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "tight memory: %s", pdde_last_error(ctx));
        pdde_plan_str(&plans[0], s, sizeof s);
        int layers = plans[0].stage_first[1] - plans[0].stage_first[0];
        pdde_plan_evaluate(g, &tight.d, &pp, &all);
        CHECK(plans[0].recompute == 0 && plans[0].recompute_layers[0] > 0 && plans[0].recompute_layers[0] < layers && plans[0].step_s < all.step_s,
              "tight memory: %s recomputes %d of %d layers, %g s against %g s for all", s, plans[0].recompute_layers[0], layers, plans[0].step_s,
              all.step_s);
        check_plans(g, &tight, &one_micro, plans, nf, nr);
        /* mixed machines, two fast devices then two slow: each stage on a block of alike devices, the slow
         * one with fewer layers, beats stages that each hold a slow device */
        cluster mixed;
        cluster_init(&mixed, 4, 1e11, 1e10, 1e9, 2);
        mixed.flops[2] = mixed.flops[3] = 2.5e10;
        pdde_plan_params no_drop = pp;
        no_drop.use_all_devices = 1, no_drop.no_tp = 1;
        CHECK(pdde_plan_search(g, &mixed.d, &no_drop, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0, "mixed: %s", pdde_last_error(ctx));
        pdde_plan_str(&plans[0], s, sizeof s);
        pdde_plan inner = plans[0];
        inner.stage_blocks = 0;
        CHECK(plans[0].stage_blocks == 1 && plans[0].pp == 2 && plans[0].stage_first[2] - plans[0].stage_first[1] < plans[0].stage_first[1] &&
                  pdde_plan_evaluate(g, &mixed.d, &no_drop, &inner) == PDDE_OK && inner.step_s > 1.2 * plans[0].step_s,
              "mixed: %s %g s; the same pp innermost %g s", s, plans[0].step_s, inner.step_s);
        check_plans(g, &mixed, &no_drop, plans, nf, nr);
    }
    test_replan(g, &pp);
    test_placement(g, &pp, L);
    pdde_graph_free(g);

    /* 10. the entry points on a non-GPT graph: pdde_plan_auto on a cluster, pdde_plan_apply compiles and
     * trains what it chose */
    {
        mlp m;
        pdde_graph *mg = mlp_build(ctx, &m);
        pdde_plan_params mp = PDDE_PLAN_PARAMS_INIT;
        mp.batch = MLP_B, mp.max_micro = 1;
        /* one device whose memory is between what no recompute and every layer recomputed need */
        static double fl[1] = {1e11}, bw[1] = {1e10}, big[1] = {1e12};
        pdde_plan_devices one = {.n_devices = 1, .flops = fl, .mem_bw = bw, .memory = big};
        pdde_plan none = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .chunks = 1}, all = none;
        all.recompute = 1;
        pdde_plan_evaluate(mg, &one, &mp, &none), pdde_plan_evaluate(mg, &one, &mp, &all);
        pdde_cluster *cl = cpu_cluster(1, (none.peak_bytes + all.peak_bytes) / 2);
        pdde_plan p;
        char s[256];
        pdde_status auto_st = pdde_plan_auto(mg, cl, &mp, &p);
        CHECK(auto_st == PDDE_OK, "pdde_plan_auto on the MLP: %s", pdde_last_error(ctx));
        if (auto_st) return test_finish();
        pdde_plan_str(&p, s, sizeof s);
        CHECK(p.recompute == 0 && p.recompute_layers[0] > 0 && p.recompute_layers[0] < MLP_BLOCKS + 1, "the MLP's plan recomputes some layers: %s", s);
        pdde_session *sa = NULL, *sb = NULL;
        float la[5], lb[5];
        pdde_status apply_st = pdde_plan_apply(mg, &p, m.loss, NULL, NULL, &sa);
        CHECK(apply_st == PDDE_OK, "pdde_plan_apply %s: %s", s, pdde_last_error(ctx));
        if (apply_st) return test_finish();
        mlp_train(sa, &m, la);
        mlp ref;
        pdde_graph *rg = mlp_build(ctx, &ref); /* the same MLP compiled by hand, nothing recomputed */
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        CHECK(pdde_backward(rg, ref.loss) == PDDE_OK && pdde_optimizer_adamw(rg, &op) == PDDE_OK && pdde_session_init(rg, NULL, &sb) == PDDE_OK,
              "the MLP by hand: %s", pdde_last_error(ctx));
        mlp_train(sb, &ref, lb);
        pdde_memory_stats ma, mb;
        pdde_session_memory(sa, &ma), pdde_session_memory(sb, &mb);
        CHECK(!memcmp(la, lb, sizeof la) && la[4] < la[0], "the planned MLP trains as by hand (bit for bit): loss %g -> %g, by hand %g -> %g", la[0],
              la[4], lb[0], lb[4]);
        CHECK(ma.arena_bytes < mb.arena_bytes, "its recomputed layers keep less: arena %zu B against %zu B", ma.arena_bytes, mb.arena_bytes);
        pdde_session_free(sa), pdde_session_free(sb);
        pdde_graph_free(mg), pdde_graph_free(rg);
        pdde_cluster_free(cl);
        /* a plan of 8 ranks: every rank's program lowers, with tensor-parallel allreduces and stage sends */
        const char *text = "dp=2,tp=2,pp=2,mb=1,zero=1,recompute=0,stages=2:3,rc=1:0";
        mg = mlp_build(ctx, &m);
        CHECK(pdde_plan_parse(text, &p) == PDDE_OK && pdde_plan_apply(mg, &p, m.loss, NULL, NULL, NULL) == PDDE_OK, "apply %s: %s", text,
              pdde_last_error(ctx));
        for (int r = 0; r < 8; r++) {
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            pdde_status st = pdde_lower_dump(mg, NULL, 8, r, f);
            fclose(f);
            CHECK(st == PDDE_OK && strstr(buf, "allreduce") && (strstr(buf, "send") || strstr(buf, "recv")), "rank %d of %s lowers (%s)%s", r, text,
                  pdde_last_error(ctx), st ? "" : buf);
            free(buf);
        }
        /* Megatron pairs: w1 split on its outputs (column), w2 on its inputs (row), over mesh axis 1 (tp) */
        const pdde_tensor *w1 = pdde_graph_find(mg, "w1.0"), *w2 = pdde_graph_find(mg, "w2.0");
        CHECK(w1 && w2 && w1->dist.dims_mapping[1] == 1 && w1->dist.dims_mapping[0] == -1 && w2->dist.dims_mapping[0] == 1 &&
                  w2->dist.dims_mapping[1] == -1, "w1 column parallel (%d, %d), w2 row parallel (%d, %d)", w1 ? w1->dist.dims_mapping[0] : 9,
              w1 ? w1->dist.dims_mapping[1] : 9, w2 ? w2->dist.dims_mapping[0] : 9, w2 ? w2->dist.dims_mapping[1] : 9);
        pdde_graph_free(mg);
        /* stage blocks: the second stage (layers 2..4) on processes 2 and 3, not 1 and 3 */
        mg = mlp_build(ctx, &m);
        CHECK(pdde_plan_parse("dp=2,pp=2,stages=2:3,blocks=1", &p) == PDDE_OK && pdde_plan_apply(mg, &p, m.loss, NULL, NULL, NULL) == PDDE_OK,
              "apply blocks=1: %s", pdde_last_error(ctx));
        const pdde_mesh *last = pdde_graph_find(mg, "wo")->dist.mesh;
        CHECK(last && last->n_ranks == 2 && last->ranks[0] == 2 && last->ranks[1] == 3, "the last stage on processes %d, %d",
              last ? last->ranks[0] : -1, last && last->n_ranks > 1 ? last->ranks[1] : -1);
        pdde_graph_free(mg);
        /* uneven shares: dp index 0 runs 1 x 2 micro-batches, index 1 3 x 2; a share missing is refused by name */
        mg = mlp_build(ctx, &m);
        CHECK(pdde_plan_parse("dp=2,mb=2,shares=1:3", &p) == PDDE_OK && pdde_plan_apply(mg, &p, m.loss, NULL, NULL, NULL) == PDDE_OK,
              "apply shares=1:3: %s", pdde_last_error(ctx));
        for (int r = 0; r < 2; r++) {
            char *buf = NULL, want[64];
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            pdde_status st = pdde_lower_dump(mg, NULL, 2, r, f);
            fclose(f);
            snprintf(want, sizeof want, "; %d micro-batches per step", r ? 6 : 2);
            CHECK(st == PDDE_OK && strstr(buf, want), "rank %d of shares=1:3: %s (%s)", r, want, pdde_last_error(ctx));
            free(buf);
        }
        pdde_graph_free(mg);
        mg = mlp_build(ctx, &m);
        p.shares[1] = 0;
        CHECK(pdde_plan_apply(mg, &p, m.loss, NULL, NULL, NULL) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "share 1 is 0"),
              "a missing share is refused: %s", pdde_last_error(ctx));
        pdde_graph_free(mg);
        mg = mlp_build(ctx, &m);
        CHECK(pdde_plan_parse("tp=3", &p) == PDDE_OK && pdde_plan_apply(mg, &p, m.loss, NULL, NULL, NULL) == PDDE_ERR_DIST_ATTR &&
                  strstr(pdde_last_error(ctx), "w1.0"), "tp=3 is refused naming the weight: %s", pdde_last_error(ctx));
        pdde_graph_free(mg);
    }

    /* 8. a GPT of 1.3B parameters on 64 devices of 8 per host: a plan that fits, found quickly */
    {
        pdde_graph *big;
        gpt_model m;
        gpt_config c = {.vocab = 50304, .ctx = 2048, .layers = 24, .heads = 16, .width = 2048, .batch = 512};
        pdde_graph_init(ctx, &big);
        CHECK(gpt_build(big, &c, &m) == PDDE_OK, "1.3B GPT: %s", pdde_last_error(ctx));
        static double fl[64], bw[64], mem[64];
        static int host[64];
        for (int i = 0; i < 64; i++) fl[i] = 150e12, bw[i] = 1.5e12, mem[i] = 40e9, host[i] = i / 8;
        pdde_plan_devices d = {.n_devices = 64, .flops = fl, .mem_bw = bw, .memory = mem, .host = host, .intra_bw = 150e9, .intra_lat = 5e-6,
                               .inter_bw = 12.5e9, .inter_lat = 10e-6};
        pdde_plan_params bp = PDDE_PLAN_PARAMS_INIT;
        bp.batch = 512, bp.tp_divisor = 16, bp.overlap_dp = 1;
        CHECK(pdde_plan_search(big, &d, &bp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0 && plan_devices(&plans[0]) == 64 &&
                  plans[0].peak_bytes <= 40e9 && plans[0].step_s > 0,
              "1.3B on 64 devices: %s", pdde_last_error(ctx));
        pdde_plan one[2];
        int nf1 = 0, nr1 = 0; /* GEMM-bound: the pruning's lower bound is close, and must stay below */
        CHECK(pdde_plan_search(big, &d, &bp, one, 2, &nf1, &nr1) == PDDE_OK && nf1 == 1 && one[0].step_s == plans[0].step_s,
              "1.3B with one plan kept: %g s, with %d kept %g s", nf1 ? one[0].step_s : NAN, MAX_PLANS, plans[0].step_s);
        char s[256];
        pdde_plan_str(&plans[0], s, sizeof s);
        printf("1.3B GPT on 64 devices: %s, %.3f s/step, %.1f GB peak\n", s, plans[0].step_s, plans[0].peak_bytes / 1e9);
        pdde_graph_free(big);
    }

    /* 9. on a training graph (backward and AdamW in it) the predicted memory of one process is what its
     * session allocates, within 10%: what backward reads of the forward is kept, the rest reused (every
     * forward output counted was 65% too much). The planner reads the graph without recompute marks
     * (recompute is its choice); the session runs one with them. */
    for (int rc = 0; rc <= 1; rc++) {
        pdde_graph *tg[2];
        gpt_model m;
        gpt_config c = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8};
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        for (int k = 0; k < 2; k++) {
            pdde_graph_init(ctx, &tg[k]);
            CHECK(gpt_build(tg[k], &c, &m) == PDDE_OK, "gpt_build: %s", pdde_last_error(ctx));
            for (int l = 1; k && rc && l <= c.layers; l++) pdde_graph_set_recompute(tg[k], l, 1);
            pdde_backward(tg[k], m.loss);
            pdde_optimizer_adamw(tg[k], &op);
        }
        cluster one;
        cluster_init(&one, 1, 1e11, 1e10, 1e12, 1);
        pdde_plan_params tpp = PDDE_PLAN_PARAMS_INIT;
        tpp.batch = c.batch;
        pdde_plan p = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .recompute = rc, .chunks = 1};
        pdde_session *s = NULL;
        pdde_memory_stats ms = {0};
        CHECK(pdde_plan_evaluate(tg[0], &one.d, &tpp, &p) == PDDE_OK && pdde_session_init(tg[1], NULL, &s) == PDDE_OK &&
                  pdde_session_memory(s, &ms) == PDDE_OK, "%s", pdde_last_error(ctx));
        CHECK(fabs(p.peak_bytes - (double)ms.allocated_bytes) <= 0.1 * (double)ms.allocated_bytes,
              "recompute %d: predicted %.0f B, the session allocated %zu B", rc, p.peak_bytes, ms.allocated_bytes);
        pdde_session_free(s);
        pdde_graph_free(tg[0]), pdde_graph_free(tg[1]);
    }
    test_simulated(ctx);
    pdde_context_free(ctx);
    return test_finish();
}
