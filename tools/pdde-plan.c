/* pdde-plan — plans the example GPT without running it.
 *   pdde-plan --auto [--model gpt:layers=96,width=12288,heads=96,ctx=2048,vocab=50304,batch=1536]
 *             [--cluster cluster.json] [--ranks N] [--top K] [--simulate]
 *       the planner's best plans for the model on the cluster's devices (or N ranks on this machine,
 *       as pdde-bench measured it) with predicted step time and memory, and the rejected ones with why;
 *       --simulate ranks the best by simulating every rank's lowered program (as --timeline does)
 *   pdde-plan --plan dp=1,pp=2,mb=4 [--model gpt:...] [--cluster FILE] [--timeline out.svg] [--trace out.json]
 *       (also after --auto, for the plan it picks) one step of that plan simulated on the cluster's devices
 *       from every rank's real lowered program: a text timeline on the terminal (a lane per rank; '#'
 *       compute, '=' communication, '.' idle: the pipeline bubbles), per-rank compute, communication wait,
 *       idle and peak memory; --timeline writes it as SVG, --trace as a Chrome/Perfetto trace
 *   pdde-plan --dp 2 --tp 2 --pp 2 --zero 1 [--layers 2 --width 64 --heads 4 --ctx 32 --vocab 256 --batch 8]
 *             [--micro N] [--recompute] [--show-program [--rank R]]
 *       what one plan does: the program with every tensor's distributed attribute and the reshards
 *       (communication) it implies, and the bytes each rank holds (per pipeline stage); with --rank R,
 *       the local program rank R runs (lowered here: no process, communicator or memory for it) */
#include "pdde.h"
#include "examples/gpt.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>

#define GIB 1073741824.0 /* memory is said in GiB, as the planner's reasons and the timeline do */

static int64_t local_numel(const pdde_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        int a = t->dist.mesh ? t->dist.dims_mapping[d] : -1;
        n *= a >= 0 ? t->shape[d] / t->dist.mesh->shape[a] : t->shape[d];
    }
    return n;
}

/* "gpt:layers=96,width=12288,...[,ffn=N][,experts=E[,topk=K]]" onto c (build/gpt's default model otherwise);
 * "llama:..." the LLaMA-style model (gpt --arch llama), which also takes kv_heads=N. -1 with why (the key
 * and what it expected) on a bad spec. */
static int parse_model(const char *spec, gpt_config *c, char *why, size_t why_size) {
    static const char *const keys = "layers, width, heads, ctx, vocab, batch, ffn, experts, topk; llama: kv_heads";
    bool llama = !strncmp(spec, "llama:", 6);
    if (strncmp(spec, "gpt:", 4) && !llama) return snprintf(why, why_size, "'%s' does not start with 'gpt:' or 'llama:'", spec), -1;
    c->arch = llama ? GPT_ARCH_LLAMA : GPT_ARCH_GPT;
    for (const char *s = spec + (llama ? 6 : 4); *s;) {
        char key[32] = "";
        long v;
        int n = 0;
        if (sscanf(s, "%31[^=,]=%ld%n", key, &v, &n) != 2 || (s[n] && s[n] != ',')) {
            int len = (int)strcspn(s, ",");
            return snprintf(why, why_size, "'%.*s' is not KEY=N (N a whole number; keys: %s)", len, s, keys), -1;
        }
        int *f = !strcmp(key, "layers") ? &c->layers : !strcmp(key, "width") ? &c->width : !strcmp(key, "heads") ? &c->heads
               : !strcmp(key, "ctx") ? &c->ctx : !strcmp(key, "vocab") ? &c->vocab : !strcmp(key, "batch") ? &c->batch : !strcmp(key, "ffn") ? &c->ffn
               : !strcmp(key, "experts") ? &c->moe_experts : !strcmp(key, "topk") ? &c->moe_topk : llama && !strcmp(key, "kv_heads") ? &c->kv_heads : NULL;
        if (!f) return snprintf(why, why_size, "no key '%s' (keys: %s)", key, keys), -1;
        if (v < 1 || v > 1000000000) return snprintf(why, why_size, "%s=%ld: want 1..1000000000", key, v), -1;
        *f = (int)v, s += n;
        if (*s == ',') s++;
    }
    if (c->width % c->heads) return snprintf(why, why_size, "width %d is not a multiple of heads %d", c->width, c->heads), -1;
    if (llama && (c->heads % gpt_kv_heads(c) || (c->width / c->heads) % 2))
        return snprintf(why, why_size, "kv_heads %d must divide heads %d and the head dim %d be even", gpt_kv_heads(c), c->heads, c->width / c->heads), -1;
    return 0;
}

static const char help[] =
    "usage: pdde-plan --auto [--model gpt:layers=N,width=N,heads=N,ctx=N,vocab=N,batch=N[,ffn=N][,experts=E[,topk=K]]]\n"
    "                 (llama:...,kv_heads=N instead of gpt: the LLaMA-style model, gpt --arch llama)\n"
    "                 [--cluster FILE] [--ranks N] [--top K] [--simulate]    the best plans, predicted, and the rejected ones with why\n"
    "       pdde-plan --plan dp=N,tp=N,pp=N,mb=N,zero=N[,...] [--model ...] [--cluster FILE] [--timeline out.svg] [--trace out.json]\n"
    "                 one step of that plan simulated on the cluster's devices (also after --auto, for the plan it picks)\n"
    "       pdde-plan [--dp N] [--tp N] [--pp N] [--zero 0-3] [--micro N] [--recompute] [--layers N --width N --heads N --ctx N --vocab N --batch N]\n"
    "                 [--show-program [--rank R]]    what one plan does: distributed attributes, reshards, bytes per rank\n";

/* The id of the cluster's device at index i, counting the machines' devices in order (-1: none). */
static int cluster_device_id(const pdde_cluster *cl, int i) {
    for (int mi = 0; mi < cl->n_machines; mi++) {
        if (i < cl->machines[mi].n_devices) return cl->machines[mi].devices[i].id;
        i -= cl->machines[mi].n_devices;
    }
    return -1;
}

/* The bytes rank r of `ranks` may use: its share of its device in d (the devices the plan was checked
 * for), else the cluster's r-th device's (the first's, shared, where it has fewer) */
static double rank_memory(const pdde_cluster *cl, const pdde_plan_devices *d, int r, int ranks) {
    if (d && r < d->n_devices) return d->memory[r];
    int n = pdde_cluster_device_count(cl), i = r < n ? r : 0;
    for (int mi = 0; mi < cl->n_machines; mi++) {
        if (i < cl->machines[mi].n_devices) return (double)cl->machines[mi].devices[i].memory / (r < n ? 1 : ranks);
        i -= cl->machines[mi].n_devices;
    }
    return INFINITY;
}

/* One step of plan p for the GPT of c, simulated on the cluster from every rank's lowered program, each
 * rank on the device d (the devices the plan was searched or checked for) gives it: where d stands
 * several ranks on copies of one device, its cluster_device; else the cluster's devices in order.
 * check_memory: a rank whose simulated peak is over its device's memory is an error (a plan given by
 * hand that would fail to allocate), after the timeline. */
static int plan_timeline(pdde_context *ctx, const gpt_config *c, const pdde_plan *p, const char *cluster_path, const pdde_plan_devices *d,
                         const char *svg, const char *trace, int check_memory) {
    pdde_cluster *cl = NULL;
    pdde_graph *g = NULL;
    pdde_cost_program *cp = NULL;
    pdde_cost_result *res = NULL;
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_plan even = *p;
    if (even.pp > 1 && even.chunks <= 1 && even.stage_first[even.pp] == 0) /* no cut given: the even one gpt makes */
        for (int s = 0; s <= even.pp; s++) even.stage_first[s] = s * (c->layers + 2) / even.pp;
    p = &even;
    gpt_plan gp = gpt_plan_of(p);
    int ranks = p->dp * p->tp * p->pp;
    pdde_cost_plan plan = {ranks > 1 ? ranks : 0, NULL, NULL, 0};
    int *rank_devices = NULL;
    pdde_status st = pdde_cluster_load(ctx, cluster_path, &cl);
    if (!st && d && d->cluster_device && ranks <= d->n_devices) {
        if (!(rank_devices = malloc((size_t)ranks * sizeof *rank_devices))) st = PDDE_ERR_OOM;
        for (int r = 0; !st && r < ranks; r++)
            if ((rank_devices[r] = cluster_device_id(cl, d->cluster_device[r])) < 0)
                st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "rank %d's device %d is not in %s", r, d->cluster_device[r], cluster_path);
        plan.rank_devices = rank_devices;
    }
    if (!st) st = pdde_graph_init(ctx, &g);
    if (!st) st = gpt_build_plan(g, c, &gp, &op, &m);
    if (!st) st = pdde_cost_program_from_plan(cl, g, NULL, &plan, &cp);
    if (!st) st = pdde_cost_simulate(ctx, cl, cp, &res);
    if (!st) {
        char s[256];
        pdde_plan_str(p, s, sizeof s);
        printf("one step of %s on %s, simulated from the %d ranks' lowered programs:\n", s, cluster_path, ranks);
        pdde_cost_timeline_text(res, stdout, 100);
        if (res->uncalibrated) printf("(%d ops timed from peak figures: the cluster has no measured curve for them)\n", res->uncalibrated);
    }
    if (!st && svg && !(st = pdde_cost_timeline_svg(ctx, res, cp, svg))) printf("timeline: %s\n", svg);
    if (!st && trace && !(st = pdde_cost_timeline_trace(ctx, res, cp, trace))) printf("trace: %s\n", trace);
    if (st) fprintf(stderr, "pdde-plan: timeline: %s: %s\n", pdde_status_str(st), pdde_last_error(ctx));
    int over = 0; /* (a placed plan's peak spans two devices: the search checks each of them) */
    for (int r = 0; !st && check_memory && !p->place[0] && r < res->n_ranks; r++) {
        double have = rank_memory(cl, d, r, ranks);
        if (!(res->peak_memory[r] > have)) continue;
        char s[256];
        pdde_plan_str(p, s, sizeof s);
        fprintf(stderr, "pdde-plan: --plan %s does not fit: rank %d needs %.4g GiB at its peak, its device (cluster device %d) has %.4g GiB "
                "for it: %.4g GiB over\n", s, r, res->peak_memory[r] / GIB, rank_devices ? rank_devices[r] : cluster_device_id(cl, r),
                have / GIB, (res->peak_memory[r] - have) / GIB);
        over = 1;
    }
    pdde_cost_result_free(res);
    pdde_cost_program_free(cp);
    pdde_graph_free(g);
    free(rank_devices);
    pdde_cluster_free(cl);
    return st || over ? 1 : 0;
}

static int plan_auto(int argc, char **argv) {
    gpt_config c = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8}; /* build/gpt's default */
    const char *cluster = "build/cluster.json";
    const char *svg = NULL, *trace = NULL, *forced = NULL;
    int ranks = 0, top = 8, auto_ = 0, simulate = 0;
    pdde_plan fp;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--auto")) { auto_ = 1; continue; }
        if (!strcmp(a, "--simulate")) { simulate = 1; continue; }
        if (v && !strcmp(a, "--model")) {
            char why[256];
            if (parse_model(v, &c, why, sizeof why)) {
                fprintf(stderr, "pdde-plan: --model %s: %s\n", v, why);
                return 2;
            }
            i++;
        }
        else if (v && !strcmp(a, "--cluster")) cluster = v, i++;
        else if (v && !strcmp(a, "--ranks") && (ranks = atoi(v)) > 0) i++;
        else if (v && !strcmp(a, "--top") && (top = atoi(v)) > 0 && top <= 48) i++;
        else if (v && !strcmp(a, "--timeline")) svg = v, i++;
        else if (v && !strcmp(a, "--trace")) trace = v, i++;
        else if (v && !strcmp(a, "--plan") && pdde_plan_parse(v, &fp) == PDDE_OK) forced = v, i++;
        else {
            fprintf(stderr, "pdde-plan: bad argument '%s'%s%s%s\n%s", a, v ? "" : " (or its value is missing)", v && !strcmp(a, "--plan") ? ": " : "",
                    v && !strcmp(a, "--plan") ? fp.why : "", help); /* (pdde_plan_parse's: the key and what it expected) */
            return 2;
        }
    }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) return 1;
    if (forced && !auto_) { /* a plan given: its timeline only */
        int rc = 2;
        if (fp.pp > 1 && fp.stage_first[fp.pp] && fp.stage_first[fp.pp] != c.layers + 2)
            fprintf(stderr, "pdde-plan: --plan %s: the stages must cut the %d layers (embedding, blocks, head)\n", forced, c.layers + 2);
        else if (gpt_plan_place_outside(&fp, &c, "pdde-plan: --plan")) /* (it said why) */
            rc = 2;
        else if (c.batch % fp.micro)
            fprintf(stderr, "pdde-plan: --plan %s: %d micro-batches do not divide the batch %d\n", forced, fp.micro, c.batch);
        else { /* each rank on the device the search would give it */
            pdde_plan_devices d = {0};
            int have = gpt_plan_devices(ctx, cluster, &c, fp.dp * fp.tp * fp.pp, &d) == PDDE_OK;
            rc = plan_timeline(ctx, &c, &fp, cluster, have ? &d : NULL, svg, trace, 1);
            if (have) pdde_plan_devices_free(&d);
        }
        pdde_context_free(ctx);
        return rc;
    }
    pdde_plan_devices d;
    pdde_plan plans[64];
    int nf = 0, nr = 0;
    struct timespec t0, t1;
    pdde_status st = gpt_plan_devices(ctx, cluster, &c, ranks, &d);
    if (st) {
        if (access(cluster, F_OK)) /* (a file that is there but does not fit the job needs no new one) */
            fprintf(stderr, "pdde-plan: %s\n(write a cluster file with build/pdde-bench -o %s, or pass --cluster tools/clusters/h100_128.json)\n",
                    pdde_last_error(ctx), cluster);
        else fprintf(stderr, "pdde-plan: %s\n", pdde_last_error(ctx));
        pdde_context_free(ctx);
        return 1;
    }
    pdde_cluster *cl = NULL;
    if (simulate && (st = pdde_cluster_load(ctx, cluster, &cl))) {
        fprintf(stderr, "pdde-plan: %s\n", pdde_last_error(ctx));
        pdde_plan_devices_free(&d);
        pdde_context_free(ctx);
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    st = gpt_plan_search_simulated(ctx, &c, &d, ranks > 0, cl, plans, top + top / 3 + 1, &nf, &nr);
    pdde_cluster_free(cl);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%s %d layers, width %d, %d heads, ctx %d, vocab %d, batch %d: %.3g parameters; %d devices (%s); planned in %.2f s%s\n",
           c.arch == GPT_ARCH_LLAMA ? "LLaMA" : "GPT", c.layers, c.width, c.heads, c.ctx, c.vocab, c.batch, (double)gpt_n_params(&c), d.n_devices, cluster, secs,
           simulate ? " (the best ranked by simulating their lowered programs)" : "");
    double tokens = (double)c.batch * c.ctx;
    for (int i = 0; i < nf && i < top; i++) {
        char s[256];
        pdde_plan_str(&plans[i], s, sizeof s);
        printf("%s %-56s %10.4g s/step %10.4g tok/s  bubble %4.1f%%  peak %.3g GiB (device %d)\n", i ? "    " : "best", s, plans[i].step_s,
               tokens / plans[i].step_s, 100 * plans[i].bubble_s / plans[i].step_s, plans[i].peak_bytes / GIB, plans[i].peak_device);
    }
    for (int i = nf; i < nf + nr; i++) {
        char s[256];
        pdde_plan_str(&plans[i], s, sizeof s);
        printf("no   %-56s %10.4g s/step had it fitted: %s\n", s, plans[i].step_s, plans[i].why);
    }
    if (st) fprintf(stderr, "pdde-plan: %s\n", pdde_last_error(ctx));
    if (!st && nf > 0 && (svg || trace)) st = plan_timeline(ctx, &c, &plans[0], cluster, &d, svg, trace, 0) ? PDDE_ERR_NO_PLAN : PDDE_OK;
    pdde_plan_devices_free(&d);
    pdde_context_free(ctx);
    return st ? 1 : 0;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return fputs(help, stdout) < 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--auto") || !strcmp(argv[i], "--plan")) return plan_auto(argc, argv);
    gpt_config c = {.vocab = 256, .ctx = 32, .layers = 2, .heads = 4, .width = 64, .batch = 8};
    int dp = 1, tp = 1, pp = 1, zero = 0, show = 0, recompute = 0, rank = -1, micro = 1;
    for (int i = 1; i < argc; i++) {
        int *v = NULL;
        if (!strcmp(argv[i], "--show-program")) { show = 1; continue; }
        if (!strcmp(argv[i], "--recompute")) { recompute = 1; continue; }
        if (!strcmp(argv[i], "--dp")) v = &dp;
        else if (!strcmp(argv[i], "--tp")) v = &tp;
        else if (!strcmp(argv[i], "--pp")) v = &pp;
        else if (!strcmp(argv[i], "--zero")) v = &zero;
        else if (!strcmp(argv[i], "--layers")) v = &c.layers;
        else if (!strcmp(argv[i], "--width")) v = &c.width;
        else if (!strcmp(argv[i], "--heads")) v = &c.heads;
        else if (!strcmp(argv[i], "--ctx")) v = &c.ctx;
        else if (!strcmp(argv[i], "--vocab")) v = &c.vocab;
        else if (!strcmp(argv[i], "--batch")) v = &c.batch;
        else if (!strcmp(argv[i], "--rank")) v = &rank;
        else if (!strcmp(argv[i], "--micro")) v = &micro;
        if (!v || i + 1 >= argc) {
            fprintf(stderr, "pdde-plan: %s %s\n%s", v ? "no value after" : "unknown flag", argv[i], help);
            return 2;
        }
        char *end;
        long x = strtol(argv[i + 1], &end, 10);
        long lo = v == &zero || v == &rank ? 0 : 1, hi = v == &zero ? 3 : 1 << 24;
        if (end == argv[i + 1] || *end || x < lo || x > hi) {
            fprintf(stderr, "pdde-plan: %s wants an integer in %ld..%ld, got '%s'\n", argv[i], lo, hi, argv[i + 1]);
            return 2;
        }
        *v = (int)x;
        i++;
    }
    if (c.width % c.heads || (long)dp * tp * pp > 1 << 24) {
        fprintf(stderr, "pdde-plan: --width %d must be a multiple of --heads %d, and --dp x --tp x --pp at most 2^24\n", c.width, c.heads);
        return 2;
    }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    pdde_graph *g;
    gpt_model m;
    if (pdde_context_init(&cp, &ctx) || pdde_graph_init(ctx, &g)) {
        fprintf(stderr, "pdde-plan: cannot create a context\n");
        return 1;
    }
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    gpt_plan plan = {.dp = dp, .tp = tp, .pp = pp, .micro = micro, .zero = zero, .recompute = recompute};
    pdde_status st = gpt_build_plan(g, &c, &plan, &op, &m);
    if (st) {
        fprintf(stderr, "pdde-plan: %s: %s\n", pdde_status_str(st), pdde_last_error(ctx));
        return 1;
    }
    if (show && rank >= dp * tp * pp) {
        fprintf(stderr, "pdde-plan: --rank %d: the plan has %d rank%s (0..%d)\n", rank, dp * tp * pp, dp * tp * pp > 1 ? "s" : "", dp * tp * pp - 1);
        pdde_graph_free(g);
        pdde_context_free(ctx);
        return 1;
    }
    if (show && rank >= 0) { /* rank R's local program, as its session would run it */
        int world = dp * tp * pp > 1 ? dp * tp * pp : 0;
        st = pdde_lower_dump(g, NULL, world, world ? rank : 0, stdout);
        if (st) fprintf(stderr, "pdde-plan: rank %d: %s: %s\n", rank, pdde_status_str(st), pdde_last_error(ctx));
        pdde_graph_free(g);
        pdde_context_free(ctx);
        return st ? 1 : 0;
    }
    if (show) pdde_graph_dump_dist(g, stdout);
    printf("plan: dp %d x tp %d x pp %d, ZeRO-%d on %d ranks%s; GPT %d layers, width %d: %.2fM parameters\n", dp, tp, pp, zero,
           dp * tp * pp, recompute ? ", blocks recomputed" : "", c.layers, c.width, (double)gpt_n_params(&c) / 1e6);
    /* per rank, ranks holding the same amounts (a pipeline stage's) on one line */
    enum { MAX_RANKS = 256 };
    int n = dp * tp * pp < MAX_RANKS ? dp * tp * pp : MAX_RANKS;
    double total[3] = {0}, bytes[MAX_RANKS][3] = {{0}};
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i);
        int kind = t->flags & PDDE_TENSOR_PARAM ? 0 : t->flags & PDDE_TENSOR_GRAD ? 1 : t->flags & PDDE_TENSOR_STATE ? 2 : -1;
        if (kind < 0 || t->op != PDDE_OP_NONE) continue;
        total[kind] += 4.0 * (double)pdde_tensor_numel(t);
        int coords[PDDE_MAX_MESH_DIMS];
        for (int r = 0; r < n; r++)
            if (!t->dist.mesh || pdde_mesh_coords(t->dist.mesh, r, coords) == PDDE_OK) bytes[r][kind] += 4.0 * (double)local_numel(t);
    }
    for (int r = 0; r < n; r++) {
        int first = 0;
        while (memcmp(bytes[first], bytes[r], sizeof bytes[r])) first++;
        if (first < r) continue; /* printed with an earlier rank */
        printf("ranks");
        for (int q = r; q < n; q++)
            if (!memcmp(bytes[q], bytes[r], sizeof bytes[r])) printf(" %d", q);
        printf(": parameters %.4g GiB, gradients %.4g GiB, optimizer %.4g GiB each\n", bytes[r][0] / GIB, bytes[r][1] / GIB, bytes[r][2] / GIB);
    }
    printf("one process: parameters %.4g GiB, gradients %.4g GiB, optimizer %.4g GiB\n", total[0] / GIB, total[1] / GIB, total[2] / GIB);
    printf("completion conflicts resolved: %d\n", pdde_complete_conflict_count(g));
    pdde_graph_free(g);
    pdde_context_free(ctx);
    return 0;
}
