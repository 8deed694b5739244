/* test_search — the planner search (planner/search.c): on small clusters it returns the exhaustive
 * optimum of its own estimate over every degree, micro-batch count, ZeRO stage, recompute and stage
 * cut; it never returns a plan that does not fit; degenerate clusters (one device, a prime number,
 * one much slower, one with little memory, nothing that fits) give sensible plans or clear reasons. */
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
    c->d = (pdde_plan_devices){n, c->flops, c->bw, c->mem, c->host, 20e9, 2e-6, 2e9, 20e-6, NULL};
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

/* The best fitting step time over every plan the search may consider, each stage cut included. */
static double exhaustive(pdde_graph *g, const cluster *c, const pdde_plan_params *pp, int L, int *n_evaluated) {
    double best = INFINITY;
    int max_micro = pp->max_micro;
    for (int n = 1; n <= c->d.n_devices; n++)
        for (int tp = 1; tp <= n; tp++)
            for (int pipe = 1; pipe * tp <= n; pipe++) {
                if (n % (tp * pipe) || (pp->tp_divisor % tp) || pipe > L) continue;
                int dp = n / tp / pipe;
                if (pp->batch % dp) continue;
                for (int m = 1; m <= max_micro && m <= pp->batch / dp; m++)
                    for (int v = 1; v <= 1; v++)
                        for (int zero = 0; zero <= (dp > 1 ? 3 : 0); zero++)
                            for (int rc = 0; rc <= 1; rc++) {
                                if ((pp->batch / dp) % m || (v > 1 && (m % pipe || L < v * pipe))) continue;
                                /* every cut of L layers into `pipe` non-empty runs: choose pipe-1 of the L-1 gaps */
                                int cut[PDDE_PLAN_MAX_STAGES + 1];
                                for (int s = 0; s < pipe; s++) cut[s] = s;
                                cut[pipe] = L;
                                for (;;) {
                                    pdde_plan p = {.dp = dp, .tp = tp, .pp = pipe, .micro = m, .zero = zero, .recompute = rc, .chunks = v};
                                    memcpy(p.stage_first, cut, sizeof cut);
                                    if (pdde_plan_evaluate(g, &c->d, pp, &p) == PDDE_OK && !p.why[0] && p.step_s < best) best = p.step_s;
                                    (*n_evaluated)++;
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

/* Every plan returned as fitting fits when evaluated on its own, and its prediction is reproduced. */
static void check_fitting(pdde_graph *g, const cluster *c, const pdde_plan_params *pp, const pdde_plan *plans, int nf) {
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
    CHECK(pdde_cluster_plan_devices(ctx, cl, 0, 0, 0, &d) == PDDE_OK, "%s", pdde_last_error(ctx));
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
            pdde_lower_memory(pg, NULL, 2, k, &ms);
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
        CHECK(n_eval > 300, "the exhaustive search covered %d plans", n_eval);
        check_fitting(g, &c, &pp, plans, nf);
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
        check_fitting(g14, &c, &p14, plans, nf);
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
    /* 5. one device with too little memory for anything: left out */
    {
        cluster c;
        cluster_init(&c, 4, 1e11, 1e10, 1e9, 4);
        c.mem[2] = 1e5;
        CHECK(pdde_plan_search(g, &c.d, &pp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0 && plan_devices(&plans[0]) < 4,
              "a 100 kB device is left out (best uses %d)", nf ? plan_devices(&plans[0]) : -1);
        check_fitting(g, &c, &pp, plans, nf);
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
    /* 7. the text form */
    {
        pdde_plan p, q;
        char s[256];
        CHECK(pdde_plan_parse("dp=2,tp=1,pp=2,mb=4,zero=1,recompute=1,stages=4:2", &p) == PDDE_OK && p.dp == 2 && p.pp == 2 && p.micro == 4 &&
              p.zero == 1 && p.recompute == 1 && p.stage_first[1] == 4 && p.stage_first[2] == 6, "parse a plan");
        pdde_plan_str(&p, s, sizeof s);
        CHECK(pdde_plan_parse(s, &q) == PDDE_OK && !memcmp(q.stage_first, p.stage_first, sizeof p.stage_first) && q.dp == p.dp && q.micro == p.micro,
              "round trip through '%s'", s);
        const char *bad[] = {"dp=0", "zero=5", "foo=1", "dp=2,pp=2,stages=3", "dp=x", "dp=2,,", "recompute=2", "mb=-1"};
        for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK(pdde_plan_parse(bad[i], &p) == PDDE_ERR_INVALID_ARG, "'%s' is refused", bad[i]);
    }
    test_replan(g, &pp);
    pdde_graph_free(g);

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
        pdde_plan_devices d = {64, fl, bw, mem, host, 150e9, 5e-6, 12.5e9, 10e-6, NULL};
        pdde_plan_params bp = PDDE_PLAN_PARAMS_INIT;
        bp.batch = 512, bp.tp_divisor = 16, bp.overlap_dp = 1;
        CHECK(pdde_plan_search(big, &d, &bp, plans, MAX_PLANS, &nf, &nr) == PDDE_OK && nf > 0 && plan_devices(&plans[0]) == 64 &&
                  plans[0].peak_bytes <= 40e9 && plans[0].step_s > 0,
              "1.3B on 64 devices: %s", pdde_last_error(ctx));
        char s[256];
        pdde_plan_str(&plans[0], s, sizeof s);
        printf("1.3B GPT on 64 devices: %s, %.3f s/step, %.1f GB peak\n", s, plans[0].step_s, plans[0].peak_bytes / 1e9);
        pdde_graph_free(big);
    }
    test_simulated(ctx);
    pdde_context_free(ctx);
    return test_finish();
}
