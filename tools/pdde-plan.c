/* pdde-plan — plans the example GPT, or the example recommender, without running it.
 *   pdde-plan --auto [--model gpt:layers=96,width=12288,heads=96,ctx=2048,vocab=50304,batch=1536]
 *             [--cluster cluster.json] [--ranks N] [--top K] [--simulate]
 *       the planner's best plans for the model on the cluster's devices (or N ranks on this machine,
 *       as pdde-bench measured it) with predicted step time and memory, and the rejected ones with why;
 *       --simulate ranks the best by simulating every rank's lowered program (as --timeline does)
 *   pdde-plan --auto --model dlrm:batch=256,dim=8,hidden=64 [--cluster cluster.json] [--top K]
 *       build/dlrm's pipeline with its dense stage on each device in turn, the table's pull and push on
 *       that machine's CPU: predicted time per batch and each stage's threads, the fastest first
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
#include "examples/dlrm.h"
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

/* "gpt:layers=96,width=12288,...[,ffn=N][,experts=E[,topk=K]][,window=W]" onto c (build/gpt's default model otherwise;
 * window: gpt --window's sliding-window attention);
 * "llama:..." the LLaMA-style model (gpt --arch llama), which also takes kv_heads=N. -1 with why (the key
 * and what it expected) on a bad spec. */
static int parse_model(const char *spec, gpt_config *c, char *why, size_t why_size) {
    static const char *const keys = "layers, width, heads, ctx, vocab, batch, ffn, experts, topk, window; llama: kv_heads";
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
               : !strcmp(key, "experts") ? &c->moe_experts : !strcmp(key, "topk") ? &c->moe_topk : !strcmp(key, "window") ? &c->window
               : llama && !strcmp(key, "kv_heads") ? &c->kv_heads : NULL;
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

/* "dlrm:batch=N,dim=N,hidden=N[,dense=adamw|sgd|servers][,optimizer=sgd|adagrad|adam][,threads=N]": build/dlrm's
 * --batch, --dim, --hidden, --dense-on-servers (servers) and table --optimizer, onto c and *opt (its defaults
 * otherwise); threads (0: the machine's cores) bounds the pipeline's threads, as PDDE_NUM_THREADS does dlrm's.
 * -1 with why (the key and what it expected) on a bad spec. */
static int parse_dlrm(const char *spec, dlrm_config *c, pdde_ps_optimizer *opt, int *threads, char *why, size_t why_size) {
    static const char *const keys = "batch, dim, hidden, threads (N); dense=adamw|sgd|servers; optimizer=sgd|adagrad|adam";
    for (const char *s = spec + 5; *s;) {
        char key[32] = "", val[32] = "";
        int n = 0, len = (int)strcspn(s, ",");
        if (sscanf(s, "%31[^=,]=%31[^,]%n", key, val, &n) != 2 || n != len)
            return snprintf(why, why_size, "'%.*s' is not KEY=VALUE (keys: %s)", len, s, keys), -1;
        char *end;
        long v = strtol(val, &end, 10);
        int *f = !strcmp(key, "batch") ? &c->batch : !strcmp(key, "dim") ? &c->dim : !strcmp(key, "hidden") ? &c->hidden
               : !strcmp(key, "threads") ? threads : NULL;
        if (f && (*end || end == val || v < 1 || v > 1000000000))
            return snprintf(why, why_size, "%s=%s: want a whole number in 1..1000000000", key, val), -1;
        if (f) *f = (int)v;
        else if (!strcmp(key, "dense")) {
            if (!strcmp(val, "adamw")) c->dense = DLRM_DENSE_ADAMW;
            else if (!strcmp(val, "sgd")) c->dense = DLRM_DENSE_SGD;
            else if (!strcmp(val, "servers")) c->dense = DLRM_DENSE_ON_SERVERS;
            else return snprintf(why, why_size, "dense=%s: want adamw, sgd or servers", val), -1;
        } else if (!strcmp(key, "optimizer")) {
            if (!strcmp(val, "sgd")) *opt = PDDE_PS_SGD;
            else if (!strcmp(val, "adagrad")) *opt = PDDE_PS_ADAGRAD;
            else if (!strcmp(val, "adam")) *opt = PDDE_PS_ADAM;
            else return snprintf(why, why_size, "optimizer=%s: want sgd, adagrad or adam", val), -1;
        } else return snprintf(why, why_size, "no key '%s' (keys: %s)", key, keys), -1;
        s += n;
        if (*s == ',') s++;
    }
    return 0;
}

typedef struct {
    int dense_id, cpu_id, machine;
    double batch_s;                   /* the pipeline's predicted seconds per batch (its slowest stage per worker) */
    pdde_pipeline_stats ps;
    char why[256];                    /* not placeable: why */
} dlrm_placement;

static int dlrm_placement_cmp(const void *a, const void *b) {
    const dlrm_placement *x = a, *y = b;
    if (!x->why[0] != !y->why[0]) return x->why[0] ? 1 : -1; /* the placeable first, fastest first */
    if (x->batch_s != y->batch_s) return (x->batch_s > y->batch_s) - (x->batch_s < y->batch_s);
    double xt = 0, yt = 0; /* (as fast, bound by the same stage: the shorter batch in turn, the shorter latency) */
    for (int k = 0; k < 3; k++) xt += x->ps.stage[k].predicted_s, yt += y->ps.stage[k].predicted_s;
    return (xt > yt) - (xt < yt);
}

/* The recommender (examples/dlrm.h) on every device of the cluster: its dense stage there, the pull
 * and push of the table's rows on its machine's CPU (the table itself on the parameter servers, in
 * host memory), each stage timed by dlrm_stages_predict and the stages' threads sized by the pipeline,
 * as build/dlrm --pipeline --cluster sizes them; the fastest first. */
static int plan_dlrm(pdde_context *ctx, const char *cluster, const dlrm_config *c, pdde_ps_optimizer opt, int threads, int top) {
    pdde_cluster *cl = NULL;
    pdde_graph *g = NULL;
    dlrm_model m = {0};
    dlrm_placement *pl = NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pdde_status st = pdde_cluster_load(ctx, cluster, &cl);
    if (st) {
        fprintf(stderr, "pdde-plan: %s\n", pdde_last_error(ctx));
        if (access(cluster, F_OK)) fprintf(stderr, "(write a cluster file with build/pdde-bench -o %s)\n", cluster);
        pdde_context_free(ctx);
        return 1;
    }
    int n = pdde_cluster_device_count(cl);
    if (!(st = pdde_graph_init(ctx, &g))) st = dlrm_build(g, c, &m);
    if (!st && !(pl = calloc((size_t)n + 1, sizeof *pl))) st = PDDE_ERR_OOM;
    for (int h = 0, i = 0; !st && h < cl->n_machines; h++)
        for (int k = 0; k < cl->machines[h].n_devices; k++, i++) {
            dlrm_placement *p = &pl[i];
            p->dense_id = cl->machines[h].devices[k].id, p->machine = h, p->cpu_id = dlrm_machine_device(cl, h, "cpu");
            if (p->cpu_id < 0) {
                snprintf(p->why, sizeof p->why, "machine %s lists no CPU device for the pull and push of the table's rows", cl->machines[h].name);
                continue;
            }
            dlrm_stages d = {&m, NULL, NULL, NULL, NULL, NULL}; /* (sized, never run) */
            pdde_pipeline_stage stages[3];
            dlrm_stages_fill(&d, stages);
            if (dlrm_stages_predict(ctx, cl, g, &m, opt, p->cpu_id, p->dense_id, 0, stages) < 3) {
                size_t len = (size_t)snprintf(p->why, sizeof p->why, "the cost model cannot time");
                for (int s = 0; s < 3; s++)
                    if (!stages[s].predicted_s && len < sizeof p->why)
                        len += (size_t)snprintf(p->why + len, sizeof p->why - len, " %s", stages[s].name);
                if (len < sizeof p->why) snprintf(p->why + len, sizeof p->why - len, " (no curve or peak figure: pdde-bench measures them)");
                continue;
            }
            void *slot = NULL;
            pdde_pipeline_params pp = PDDE_PIPELINE_PARAMS_INIT;
            pp.n_stages = 3, pp.stages = stages, pp.slots = &slot, pp.n_slots = 1;
            pp.max_threads = threads ? threads : cl->machines[h].cores > 0 ? cl->machines[h].cores : 1;
            pdde_pipeline *pipe = NULL;
            if (!(st = pdde_pipeline_init(ctx, &pp, &pipe)) && !(st = pdde_pipeline_size(pipe))) {
                pdde_pipeline_stats_get(pipe, &p->ps);
                for (int s = 0; s < 3; s++) p->batch_s = fmax(p->batch_s, p->ps.stage[s].predicted_s / p->ps.stage[s].workers);
            }
            pdde_pipeline_free(pipe);
        }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!st) {
        qsort(pl, (size_t)n, sizeof *pl, dlrm_placement_cmp);
        static const char *const dense_names[] = {"adamw", "sgd", "servers"}, *const opt_names[] = {"sgd", "adagrad", "adam"};
        printf("DLRM batch %d, dim %d, hidden %d (%d dense features, %d sparse fields), dense update %s, table optimizer %s; %d devices (%s); "
               "planned in %.2f s\n", c->batch, c->dim, c->hidden, DLRM_DENSE, DLRM_SPARSE, dense_names[c->dense], opt_names[opt], n, cluster,
               (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
        printf("(the table on the parameter servers, in host memory; a worker pulls and pushes its rows on its machine's CPU)\n");
        int shown = 0, refused = 0;
        for (int i = 0; i < n; i++) {
            const dlrm_placement *p = &pl[i];
            const pdde_cluster_device *dev = pdde_cluster_find_device(cl, p->dense_id, NULL);
            const char *spec = dev ? cl->specs[dev->spec].name : "?", *backend = dev ? cl->specs[dev->spec].backend : "?";
            if (p->why[0]) { /* (as many as the best shown: a cluster of thousands refused says so in a few lines) */
                if (refused++ < top) printf("no   dense on device %d (%s, %s): %s\n", p->dense_id, backend, spec, p->why);
                continue;
            }
            if (shown >= top) continue;
            printf("%s dense on device %d (%s, %s), pull and push on CPU device %d of %s: %10.4g s/batch %10.4g samples/s\n", shown ? "    " : "best",
                   p->dense_id, backend, spec, p->cpu_id, cl->machines[p->machine].name, p->batch_s, c->batch / p->batch_s);
            printf("     sized from %s\n", p->ps.sizing);
            shown++;
        }
        if (refused > top) printf("no   %d more devices refused (a larger --top lists them)\n", refused - top);
    } else fprintf(stderr, "pdde-plan: dlrm: %s: %s\n", pdde_status_str(st), pdde_last_error(ctx));
    int none = !st && (n == 0 || pl[0].why[0]);
    if (none) fprintf(stderr, "pdde-plan: no device of %s can be timed for the recommender (the lines above say why)\n", cluster);
    free(pl);
    pdde_graph_free(g);
    pdde_cluster_free(cl);
    pdde_context_free(ctx);
    return st || none ? 1 : 0;
}

static const char help[] =
    "usage: pdde-plan --auto [--model gpt:layers=N,width=N,heads=N,ctx=N,vocab=N,batch=N[,ffn=N][,experts=E[,topk=K]][,window=W]]\n"
    "                 (llama:...,kv_heads=N instead of gpt: the LLaMA-style model, gpt --arch llama)\n"
    "                 (dlrm:batch=N,dim=N,hidden=N[,dense=adamw|sgd|servers][,optimizer=sgd|adagrad|adam][,threads=N]: the recommender,\n"
    "                 build/dlrm: its dense stage on each device, the table's pull and push on that machine's CPU)\n"
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
    int *rank_devices = NULL; /* (NULL: the cluster's devices in order) */
    pdde_status st = pdde_cluster_load(ctx, cluster_path, &cl);
    if (!st && d && d->cluster_device && ranks <= d->n_devices) {
        if (!(rank_devices = malloc((size_t)ranks * sizeof *rank_devices))) st = PDDE_ERR_OOM;
        for (int r = 0; !st && r < ranks; r++)
            if ((rank_devices[r] = cluster_device_id(cl, d->cluster_device[r])) < 0)
                st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "rank %d's device %d is not in %s", r, d->cluster_device[r], cluster_path);
    }
    if (!st) st = pdde_graph_init(ctx, &g);
    if (!st) st = gpt_build_plan(g, c, &gp, &op, &m);
    if (!st) st = pdde_plan_cost_program(cl, g, p, rank_devices, &cp); /* (with its place= layers on their device) */
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
    int ranks = 0, top = 8, auto_ = 0, simulate = 0, dlrm = 0, rec_threads = 0;
    dlrm_config rec = DLRM_CONFIG_INIT;
    pdde_ps_optimizer rec_opt = PDDE_PS_ADAGRAD; /* (build/dlrm's) */
    pdde_plan fp;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--auto")) { auto_ = 1; continue; }
        if (!strcmp(a, "--simulate")) { simulate = 1; continue; }
        if (v && !strcmp(a, "--model")) {
            char why[256];
            if (!strncmp(v, "dlrm:", 5) ? parse_dlrm(v, &rec, &rec_opt, &rec_threads, why, sizeof why) : parse_model(v, &c, why, sizeof why)) {
                fprintf(stderr, "pdde-plan: --model %s: %s\n", v, why);
                return 2;
            }
            dlrm = !strncmp(v, "dlrm:", 5), i++;
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
    if (dlrm && (forced || ranks || simulate || svg || trace)) {
        fprintf(stderr, "pdde-plan: --model dlrm:... takes --auto [--cluster FILE] [--top K] only (one worker's pipeline: no --plan, --ranks, "
                "--simulate, --timeline or --trace)\n");
        return 2;
    }
    /* every backend (PDDE_BACKENDS may narrow them): a placed plan is lowered for its device, and the machine's
     * plans give a rank no accelerator that this process's device of it could not run (pdde_device_select's rule) */
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) return 1;
    if (dlrm) return plan_dlrm(ctx, cluster, &rec, rec_opt, rec_threads, top);
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
