/* bench_costmodel — the cost model's predictions against measured training steps on this machine.
 *
 *   bench_costmodel [--reps N] [--steps N] [--hetero] [--only NAME] [--build DIR] [--no-priority] [--reuse]
 *
 * Every configuration trains the GPT of examples/gpt.h (two sizes, and the small one with a
 * Mixture-of-Experts feed-forward: its experts on every rank or split by ep) under build/pdde-run with
 * 1-4 ranks of one thread each: one process, data parallel, ZeRO, tensor parallel, expert parallel,
 * pipelines with several micro-batch counts, recompute, every layer on the OpenCL (PoCL) device, and a pair whose rank 1 runs
 * in a cgroup (v1) whose CFS quota gives it a third of a core. Each rank is this program again
 * (--worker): it times its steps and reports them with the bytes its session allocated.
 *
 * Robust on a machine others load: the benchmark and all it starts run in a cgroup with a large
 * cpu.shares (--no-priority: not), each rank has one thread (a 2-thread pool there ran 2-4x slower
 * than one thread whenever the others' load delayed one of its threads), the rounds run every
 * configuration once (the order reversed every other round), each round is predicted from a
 * calibration (pdde-bench --quick) taken just before it, and every figure is the median over steps of
 * the slowest rank's step, then over the rounds.
 *
 * pdde's prediction simulates what runs: the graph the ranks build, lowered for every rank as its
 * session lowers it (pdde_cost_program_from_plan), on this machine's calibration with a device per
 * rank; the throttled rank's figures are a third of the others' (a calibration inside the cgroup
 * times short ops between throttles, and their medians come out unthrottled); the simulation shares
 * the machine's cores among the ranks computing at each moment, slowed by the calibration's
 * contention figures while several compute. Memory: the most any rank's memory plan allocates (pdde_predict_memory of the same
 * graph and session params) against the most a rank's session allocated. The baseline is Paddle's
 * published formula (every op FLOPs / (0.65 x peak), alpha-beta communication) in the planner's
 * analytic schedule (pdde_plan_evaluate). pick_gap: how much slower the planner's pick for 2 ranks
 * (pdde_plan_search, its best plans ranked by the same simulation) measures than the fastest 2-rank
 * plan measured, the worse of the two model sizes.
 *
 * --hetero: a fast and a throttled rank, and the CPU with the PoCL device; for each model the
 * planner's picks (on both ranks, and free to leave one out) against the best uniform plan measured
 * in the same rounds (equal batch shares, dp=2, or an even stage cut, pp=2). The throttled pair also
 * runs uneven data parallelism by hand (dp=2,shares=3:1) and the fast rank alone.
 *
 * Last line: RESULT costmodel n=<configs> mape=<%> max_err=<%> kendall_tau=<..> baseline_mape=<%> pick_gap=<%> mem_mape=<%>
 * (--hetero: RESULT hetero speedup=<the worse of cgroup and pocl> cgroup=<..> pocl=<..> all_ranks_cgroup=<..> all_ranks_pocl=<..>
 * all_ranks_cgroup_vs_any=<..>, each the best uniform plan's time on both ranks over the pick's, the worse of the two models;
 * vs_any: the pick on both ranks against the best equal-share plan of any kind, the fast rank alone included) */
#define _GNU_SOURCE
#include "pdde.h"
#include "bench_common.h"
#include "examples/gpt.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CGROUP_DIR "/sys/fs/cgroup/cpu"
#define SLOW_SHARE 3 /* the throttled rank gets a third of a core */

static const gpt_config model_sizes[3] = {
    {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8},  /* S: 0.8M parameters, examples/gpt's default */
    {.vocab = 256, .ctx = 64, .layers = 6, .heads = 4, .width = 192, .batch = 16}, /* L: 2.8M parameters, twice the batch */
    /* M: S with a Mixture-of-Experts feed-forward in every block (4 experts, top-2; a plan's ep=2 splits them) */
    {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8, .moe_experts = 4, .moe_topk = 2, .moe_aux = 0.01f},
};

/* How a rank runs: on the CPU (cluster file of its thread count), in the throttled cgroup, or with
 * every layer on the OpenCL device. */
enum { PLACE_CPU, PLACE_SLOW, PLACE_OPENCL };

typedef struct {
    char name[48];
    int model;
    char plan[96];     /* pdde_plan_parse form */
    int place[2];      /* ranks 0 and 1 (the others: CPU) */
    int hetero;        /* 1: a throttled rank, 2: the PoCL device (the hetero comparison's groups) */
    int pick;          /* the planner's pick for its group: 1 on every rank, 2 free to leave the slow one out (both: 3) */
    double measured[16], mem_measured;
    int n_measured;
    double pred[16], base[16]; /* per round, from that round's calibration */
    int n_pred;
    double predicted, baseline, mem_predicted, t_measured;
} bench_config;

static const char *self_exe;
static char build_dir[256] = "build";
static char cgroup_path[300];

/* ------------------------------------------------------------------------------------------------
 * A rank (under pdde-run) */

/* Configuration's training graph as each of its ranks builds it (gpt_build_plan of the plan, AdamW),
 * and the session params of a rank placed at `place`: PLACE_OPENCL puts every layer on local device
 * `opencl` (layer_dev: room for the model's layers + 2). The ranks and the predictions both call it,
 * so what is predicted is what runs. */
static pdde_status config_build(pdde_graph *g, int model, const pdde_plan *pl, gpt_model *m) {
    gpt_plan gp = gpt_plan_of(pl);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    gpt_config cfg = model_sizes[model];
    cfg.moe_ep = pl->ep > 1; /* (the experts over tp, else dp) */
    return gpt_build_plan(g, &cfg, &gp, &op, m);
}

static pdde_session_params config_session_params(int model, int place, int opencl, int *layer_dev) {
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    if (place == PLACE_OPENCL) {
        int n_layers = model_sizes[model].layers + 2;
        for (int l = 0; l < n_layers; l++) layer_dev[l] = opencl;
        sp.layer_devices = layer_dev, sp.n_layer_devices = n_layers;
    }
    return sp;
}

static int worker(int argc, char **argv) {
    if (argc < 6) return 2;
    int model = atoi(argv[0]), steps = atoi(argv[2]);
    const char *cg = argv[3];
    int place[2] = {atoi(argv[4]), atoi(argv[5])};
    int rank = getenv("PDDE_RANK") ? atoi(getenv("PDDE_RANK")) : 0, my_place = rank < 2 ? place[rank] : PLACE_CPU;
    if (my_place == PLACE_SLOW) { /* before any thread starts: they all inherit the group */
        char path[512];
        snprintf(path, sizeof path, "%s/cgroup.procs", cg);
        FILE *f = fopen(path, "w");
        if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f)) {
            fprintf(stderr, "bench_costmodel: rank %d: cannot join %s: %s\n", rank, path, strerror(errno));
            return 1;
        }
    }
    pdde_plan pl;
    if (pdde_plan_parse(argv[1], &pl)) return 2;
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) return 1;
    pdde_comm *comm = NULL;
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    gpt_model m;
    const gpt_config *c = &model_sizes[model];
    int layer_dev[64] = {0}, opencl = pdde_device_find(ctx, "opencl", 0);
    pdde_session_params sp = config_session_params(model, my_place, opencl, layer_dev);
    pdde_status st = pl.dp * pl.tp * pl.pp > 1 ? pdde_comm_init(ctx, NULL, &comm) : PDDE_OK;
    if (!st && my_place == PLACE_OPENCL && opencl < 0) st = pdde_error(ctx, PDDE_ERR_NOT_FOUND, "no OpenCL device");
    if (!st) st = pdde_graph_init(ctx, &g);
    if (!st) st = config_build(g, model, &pl, &m);
    sp.world = comm;
    if (!st) st = pdde_session_init(g, &sp, &s);
    size_t rows = st ? 0 : (size_t)m.cfg.batch * (size_t)c->ctx; /* the graph's micro-batch */
    int32_t *ids = malloc(rows * sizeof *ids);
    for (size_t i = 0; ids && i < rows; i++) ids[i] = (int32_t)((i * 2654435761u) % 256);
    for (int k = 0; !st && k < pdde_session_micro_batches(s); k++) { /* (uneven shares: this rank's share) */
        st = pdde_session_write_micro(s, m.ids, k, ids, rows * sizeof *ids);
        if (!st) st = pdde_session_write_micro(s, m.targets, k, ids, rows * sizeof *ids);
    }
    free(ids);
    double v[64];
    int n = 0;
    for (int i = 0; i < 2 && !st; i++) st = pdde_session_run(s, PDDE_RUN_STEP); /* warm-up: primitives, first touches */
    for (; n < steps && n < 64 && !st; n++) {
        double t0 = bench_now();
        st = pdde_session_run(s, PDDE_RUN_STEP);
        v[n] = bench_now() - t0;
    }
    pdde_memory_stats ms = {0};
    if (!st) st = pdde_session_memory(s, &ms);
    if (st) {
        fprintf(stderr, "bench_costmodel: rank %d: %s: %s\n", rank, pdde_status_str(st), pdde_last_error(ctx));
    } else {
        printf("BENCH %d %.0f", rank, (double)ms.allocated_bytes);
        for (int i = 0; i < n; i++) printf(" %.6f", v[i]);
        printf("\n");
    }
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_comm_free(comm);
    pdde_context_free(ctx);
    return st ? 1 : 0;
}

/* Runs one repeat of configuration c (pdde-run with its ranks): appends the step time (median over
 * steps of the slowest rank's) and keeps the largest allocation of a rank; 0 on success. */
static int run_config(bench_config *c, int steps) {
    pdde_plan pl;
    pdde_plan_parse(c->plan, &pl);
    int ranks = pl.dp * pl.tp * pl.pp;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s/pdde-run -n %d %s --worker %d '%s' %d '%s' %d %d 2>&1", build_dir, ranks, self_exe, c->model, c->plan, steps,
             cgroup_path[0] ? cgroup_path : "-", c->place[0], c->place[1]);
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    double t[4][64];
    int n[4] = {0}, got = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        const char *b = strstr(line, "BENCH ");
        int r, k;
        double mem;
        if (!b || sscanf(b, "BENCH %d %lf%n", &r, &mem, &k) != 2 || r < 0 || r >= ranks) {
            if (!b) fprintf(stderr, "  %s: %s", c->name, line);
            continue;
        }
        got++;
        if (mem > c->mem_measured) c->mem_measured = mem;
        for (const char *p = b + k; n[r] < 64;) {
            char *end;
            double x = strtod(p, &end);
            if (end == p) break;
            t[r][n[r]++] = x, p = end;
        }
    }
    int rc = pclose(f);
    if (rc || got != ranks) {
        fprintf(stderr, "bench_costmodel: %s: the run failed (%d of %d ranks reported)\n", c->name, got, ranks);
        return -1;
    }
    double slowest[64];
    int steps_n = n[0];
    for (int r = 1; r < ranks; r++) steps_n = n[r] < steps_n ? n[r] : steps_n;
    for (int i = 0; i < steps_n; i++) {
        slowest[i] = 0;
        for (int r = 0; r < ranks; r++) slowest[i] = fmax(slowest[i], t[r][i]);
    }
    if (!steps_n || c->n_measured == 16) return -1;
    c->measured[c->n_measured++] = bench_median(slowest, steps_n);
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Calibration and the cgroup */

/* The cgroups (v1, cpu controller): the benchmark and everything it starts run in one with a large
 * cpu.shares, so that the other users' load does not decide what is measured; the throttled rank runs
 * in a child of it whose CFS quota is a third of a core. Both are made at the start and removed at the
 * end. */
static char cgroup_top[200];

static int write_file(const char *dir, const char *file, long value) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    int bad = fprintf(f, "%ld\n", value) < 0;
    return fclose(f) || bad ? -1 : 0;
}

static void cgroup_remove(void) {
    if (cgroup_path[0] && rmdir(cgroup_path)) fprintf(stderr, "bench_costmodel: cannot remove %s: %s\n", cgroup_path, strerror(errno));
    if (cgroup_top[0] && (write_file(CGROUP_DIR, "cgroup.procs", (long)getpid()) || rmdir(cgroup_top)))
        fprintf(stderr, "bench_costmodel: cannot remove %s: %s\n", cgroup_top, strerror(errno));
    cgroup_path[0] = cgroup_top[0] = 0;
}

static int cgroup_create(int priority) {
    snprintf(cgroup_top, sizeof cgroup_top, "%s/pdde_bench_%d", CGROUP_DIR, (int)getpid());
    snprintf(cgroup_path, sizeof cgroup_path, "%s/slow", cgroup_top);
    const char *step = "create";
    if (mkdir(cgroup_top, 0755) && errno != EEXIST) {
        cgroup_top[0] = cgroup_path[0] = 0;
    } else if (step = "create", mkdir(cgroup_path, 0755) && errno != EEXIST) {
        cgroup_path[0] = 0;
    } else if (step = "set the quota of", write_file(cgroup_path, "cpu.cfs_period_us", 9000) ||
                                           write_file(cgroup_path, "cpu.cfs_quota_us", 9000 / SLOW_SHARE)) {
    } else if (step = "join", priority && (write_file(cgroup_top, "cpu.shares", 65536) || write_file(cgroup_top, "cgroup.procs", (long)getpid()))) {
    } else {
        return 0;
    }
    fprintf(stderr, "bench_costmodel: cannot %s the cgroups under %s/pdde_bench_%d: %s (needs root and cgroup v1's cpu controller)\n", step,
            CGROUP_DIR, (int)getpid(), strerror(errno));
    cgroup_remove();
    return -1;
}

/* Measures this machine for the predictions as the ranks see it (one thread each, in the benchmark's
 * cgroup): pdde-bench --quick into build/costmodel-cpu.json, again on every run (the load changes)
 * unless --reuse and the file exists. The throttled rank is this calibration scaled by its quota: a
 * calibration inside its cgroup times short ops between the quota's throttles, and their medians
 * come out unthrottled. */
static int reuse;
static int calibrate(char *path, size_t n) {
    snprintf(path, n, "%s/costmodel-cpu.json", build_dir);
    struct stat sb;
    if (reuse && !stat(path, &sb) && sb.st_size > 0) return 0;
    printf("calibrating %s (pdde-bench --quick, one thread)\n", path);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char exe[300];
        int devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) dup2(devnull, 1);
        snprintf(exe, sizeof exe, "%s/pdde-bench", build_dir);
        execl(exe, exe, "--quick", "-o", path, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "bench_costmodel: pdde-bench for %s failed\n", path);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------------
 * Predictions */

static pdde_cluster *cluster; /* this machine, one thread (pdde-bench at the start) */
static char cluster_path_cpu[300];
static int cores = 2;

/* The planner's devices for configuration c, whose training graph is g: rank r's figures from the
 * cluster file timed on g's nodes (pdde_plan_devices_init_graph; the OpenCL device's for
 * PLACE_OPENCL), a third of that for the throttled rank (its quota) and divided by the ranks sharing a
 * core when there are more ranks than cores. paddle: instead every GEMM at 0.65 x the device's peak and
 * every other op one FLOP per output element (its bytes / 12: two f32 inputs and an output), no op
 * latency: Paddle's formula. */
static pdde_status config_devices(pdde_context *ctx, const bench_config *c, const pdde_graph *g, int ranks, int paddle, pdde_plan_devices *d,
                                  double *a) {
    memset(d, 0, sizeof *d);
    pdde_plan_devices all;
    pdde_status st = pdde_plan_devices_init_graph(ctx, cluster, g, ranks, &all);
    if (st) return st;
    int k_opencl = -1;
    for (int i = 0, dd = 0; i < cluster->n_machines; i++)
        for (int j = 0; j < cluster->machines[i].n_devices; j++, dd++)
            if (k_opencl < 0 && !strcmp(cluster->specs[cluster->machines[i].devices[j].spec].backend, "opencl")) k_opencl = dd;
    double over = ranks > cores ? (double)cores / ranks : 1;
    for (int r = 0; r < ranks && !st; r++) {
        int place = r < 2 ? c->place[r] : PLACE_CPU, k = place == PLACE_OPENCL ? k_opencl : 0;
        if (k < 0) {
            st = pdde_error(ctx, PDDE_ERR_NOT_FOUND, "%s has no OpenCL device", cluster_path_cpu);
            break;
        }
        double speed = over / (place == PLACE_SLOW ? SLOW_SHARE : 1), peak = 0;
        for (int i = 0, dd = 0; i < cluster->n_machines; i++)
            for (int j = 0; j < cluster->machines[i].n_devices; j++, dd++)
                if (dd == k) peak = cluster->specs[cluster->machines[i].devices[j].spec].peak_flops;
        a[r] = paddle ? 0.65 * peak * speed : all.flops[k] * speed;
        a[4 + r] = paddle ? 12 * 0.65 * peak * speed : all.mem_bw[k] * speed;
        a[8 + r] = all.memory[k] / (place == PLACE_OPENCL ? 1 : ranks);
        a[12 + r] = paddle ? 0 : all.op_latency[k] / speed;
    }
    d->intra_bw = cluster->machines[0].intra.bandwidth, d->intra_lat = cluster->machines[0].intra.latency;
    d->n_devices = ranks, d->flops = a, d->mem_bw = a + 4, d->memory = a + 8, d->op_latency = a + 12;
    pdde_plan_devices_free(&all);
    return st;
}

/* The training graph of c's model at its global batch (what the planner reads and times). */
static pdde_status config_graph(pdde_context *ctx, const bench_config *c, pdde_graph **g, pdde_plan_params *pp) {
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_status st = pdde_graph_init(ctx, g);
    if (!st) st = gpt_build(*g, &model_sizes[c->model], &m);
    if (!st) st = pdde_backward(*g, m.loss);
    if (!st) st = pdde_optimizer_adamw(*g, &op);
    *pp = (pdde_plan_params)PDDE_PLAN_PARAMS_INIT;
    pp->batch = model_sizes[c->model].batch, pp->tp_divisor = model_sizes[c->model].heads, pp->use_all_devices = 1;
    return st;
}

/* This machine's calibrated device of backend `backend` (its spec index; -1: none) and, with link, its
 * explicit link from the CPU (the bus an OpenCL device's copies cross). */
static int cluster_spec_of(const char *backend, pdde_cluster_link *link) {
    for (int i = 0; i < cluster->n_machines; i++)
        for (int j = 0; j < cluster->machines[i].n_devices; j++) {
            const pdde_cluster_device *d = &cluster->machines[i].devices[j];
            if (strcmp(cluster->specs[d->spec].backend, backend)) continue;
            for (int l = 0; link && l < cluster->n_links; l++)
                if (cluster->links[l].a == d->id || cluster->links[l].b == d->id) *link = cluster->links[l];
            return d->spec;
        }
    return -1;
}

/* What rank r of c runs at: a core, a third of one (the throttled cgroup's quota) or the OpenCL device. */
static int config_place(const bench_config *c, int r) { return r < 2 ? c->place[r] : PLACE_CPU; }

/* The cluster c's ranks run on, for the simulation: this machine's calibration with one device per
 * rank (id r) on this machine (its cores: the simulation shares them among the ranks computing at each
 * moment), each the CPU's figures (a third of them in the throttled cgroup, whose calibration inside
 * it would time short ops between throttles and come out unthrottled), or the OpenCL device's for a PoCL rank of a
 * mixed pair; when every rank places its layers on the OpenCL device, that device once more (id
 * ranks, reached over the calibrated bus), the local device their layers name (*opencl_id). */
static pdde_status config_cluster(pdde_context *ctx, const bench_config *c, int ranks, pdde_cluster **out, int *opencl_id) {
    pdde_cluster_link bus = {0};
    int cpu = cluster_spec_of("cpu", NULL), ocl = cluster_spec_of("opencl", &bus), uniform_ocl = 1;
    for (int r = 0; r < ranks; r++) uniform_ocl &= config_place(c, r) == PLACE_OPENCL;
    *out = NULL, *opencl_id = -1;
    if (cpu < 0 || ((uniform_ocl || c->place[0] == PLACE_OPENCL || c->place[1] == PLACE_OPENCL) && ocl < 0))
        return pdde_error(ctx, PDDE_ERR_NOT_FOUND, "%s has no %s device", cluster_path_cpu, cpu < 0 ? "cpu" : "OpenCL");
    pdde_cluster *cl;
    pdde_status st = pdde_cluster_init("bench_costmodel", &cl);
    pdde_cluster_machine m = cluster->machines[0];
    m.n_devices = 0, m.devices = NULL;
    if (!st && pdde_cluster_add_machine(cl, &m) < 0) st = PDDE_ERR_OOM;
    for (int r = 0; r < ranks && !st; r++) {
        int place = config_place(c, r);
        pdde_device_spec s = cluster->specs[place == PLACE_OPENCL && !uniform_ocl ? ocl : cpu];
        double speed = place == PLACE_SLOW ? 1.0 / SLOW_SHARE : 1;
        for (int i = 0; i < s.n_gemm; i++) s.gemm[i].flops *= speed;
        for (int k = 0; k < PDDE_OPCLASS_COUNT; k++)
            for (int i = 0; i < s.n_curve[k]; i++) s.curve[k][i].seconds /= speed;
        s.peak_flops *= speed, s.mem_bandwidth *= speed;
        pdde_cluster_device d = {r, pdde_cluster_add_spec(cl, &s), cluster->machines[0].devices[0].memory};
        if (d.spec < 0 || pdde_cluster_add_device(cl, 0, &d) < 0) st = PDDE_ERR_OOM;
    }
    if (!st && uniform_ocl) {
        pdde_cluster_device d = {ranks, pdde_cluster_add_spec(cl, &cluster->specs[ocl]), cluster->machines[0].devices[0].memory};
        if (d.spec < 0 || pdde_cluster_add_device(cl, 0, &d) < 0) st = PDDE_ERR_OOM;
        for (int r = 0; r < ranks && !st && bus.bandwidth > 0; r++) {
            pdde_cluster_link l = bus;
            l.a = r, l.b = ranks;
            if (pdde_cluster_add_link(cl, &l) < 0) st = PDDE_ERR_OOM;
        }
        *opencl_id = ranks;
    }
    for (int i = 0; i < cluster->n_calibs && !st; i++)
        if (pdde_cluster_add_calib(cl, &cluster->calibs[i]) < 0) st = PDDE_ERR_OOM;
    if (st) {
        pdde_cluster_free(cl);
        return pdde_error(ctx, st, "bench_costmodel: out of memory");
    }
    *out = cl;
    return PDDE_OK;
}

/* pdde's prediction of c: its ranks' real programs (the graph they build, lowered for each rank as its
 * session lowers it) simulated on the cluster of config_cluster; memory: the most any rank's memory
 * plan allocates (pdde_predict_memory, what its session allocates). */
static pdde_status predict_simulated(pdde_context *ctx, bench_config *c, const pdde_plan *pl, double *step_s, double *mem) {
    int ranks = pl->dp * pl->tp * pl->pp, world = ranks > 1 ? ranks : 0, opencl_id, layer_dev[64];
    int local_opencl = pdde_device_find(ctx, "opencl", 0), local_devices[16];
    pdde_cluster *cl = NULL;
    pdde_graph *g = NULL;
    pdde_cost_program *cp = NULL;
    pdde_cost_result *res = NULL;
    gpt_model m;
    pdde_status st = config_cluster(ctx, c, ranks, &cl, &opencl_id);
    if (!st) st = pdde_graph_init(ctx, &g);
    if (!st) st = config_build(g, c->model, pl, &m);
    *mem = 0;
    for (int r = 0; r < ranks && !st; r++) {
        pdde_session_params sp = config_session_params(c->model, config_place(c, r), local_opencl, layer_dev);
        pdde_memory_stats ms;
        if (!(st = pdde_predict_memory(g, &sp, world, r, &ms)) && (double)ms.allocated_bytes > *mem) *mem = (double)ms.allocated_bytes;
    }
    /* the ranks' layers on the OpenCL device: as one session's params, the local device mapped to it */
    pdde_session_params sp = config_session_params(c->model, opencl_id >= 0 ? PLACE_OPENCL : PLACE_CPU, local_opencl, layer_dev);
    for (int i = 0; i < 16; i++) local_devices[i] = i == local_opencl ? opencl_id : -1;
    pdde_cost_plan cpl = {world, NULL, local_devices, opencl_id >= 0 && local_opencl >= 0 && local_opencl < 16 ? local_opencl + 1 : 0};
    if (!st) st = pdde_cost_program_from_plan(cl, g, &sp, &cpl, &cp);
    if (!st) st = pdde_cost_simulate(ctx, cl, cp, &res);
    if (!st) *step_s = res->step_time;
    pdde_cost_result_free(res);
    pdde_cost_program_free(cp);
    pdde_graph_free(g);
    pdde_cluster_free(cl);
    return st;
}

/* Appends c's predictions from the current calibration to c->pred (the simulation) and c->base
 * (Paddle's formula, in the planner's analytic schedule); sets c->mem_predicted. */
static pdde_status predict(pdde_context *ctx, bench_config *c) {
    pdde_plan pl;
    pdde_plan_parse(c->plan, &pl);
    int ranks = pl.dp * pl.tp * pl.pp;
    pdde_graph *g = NULL;
    pdde_plan_params pp;
    pdde_plan_devices d;
    double a[16];
    pdde_status st = config_graph(ctx, c, &g, &pp);
    pdde_plan p = pl;
    if (!st && !(st = config_devices(ctx, c, g, ranks, 1, &d, a))) st = pdde_plan_evaluate(g, &d, &pp, &p);
    if (!st) c->base[c->n_pred] = p.step_s;
    pdde_graph_free(g);
    if (!st) st = predict_simulated(ctx, c, &pl, &c->pred[c->n_pred], &c->mem_predicted);
    if (!st && c->n_pred < 16) c->n_pred++;
    return st;
}

/* The planner's pick for the ranks and placement of c (pdde_plan_search, on every rank or on those it
 * chooses, its best plans ranked by simulating them on c's cluster): into out. */
static pdde_status planner_pick(pdde_context *ctx, const bench_config *c, int ranks, int use_all, char *out, size_t n) {
    pdde_graph *g = NULL;
    pdde_plan_params pp;
    pdde_plan_devices d;
    pdde_plan plans[8];
    pdde_cluster *cl = NULL;
    int nf = 0, nr = 0, opencl_id;
    double a[16];
    pdde_status st = config_graph(ctx, c, &g, &pp);
    if (!st) st = config_devices(ctx, c, g, ranks, 0, &d, a);
    pdde_graph_free(g);
    /* the simulation needs a device per rank (not the one-rank layer placement) */
    if (!st) st = config_cluster(ctx, c, ranks, &cl, &opencl_id);
    if (!st && opencl_id >= 0) pdde_cluster_free(cl), cl = NULL;
    if (!st) st = gpt_plan_search_simulated(ctx, &model_sizes[c->model], &d, use_all, cl, plans, 8, &nf, &nr);
    if (!st) pdde_plan_str(&plans[0], out, n);
    pdde_cluster_free(cl);
    return st;
}

/* Do x and y name the same plan of a model of n_layers layer ids (no cut = the even cut)? */
static int same_plan(const char *x, const char *y, int n_layers) {
    pdde_plan p[2];
    if (pdde_plan_parse(x, &p[0]) || pdde_plan_parse(y, &p[1])) return 0;
    for (int i = 0; i < 2; i++)
        if (p[i].stage_first[p[i].pp] == 0)
            for (int s = 0; s <= p[i].pp; s++) p[i].stage_first[s] = s * n_layers / p[i].pp;
    int cut = 1;
    for (int s = 0; s <= p[0].pp && s <= p[1].pp; s++) cut &= p[0].stage_first[s] == p[1].stage_first[s];
    return p[0].dp == p[1].dp && p[0].tp == p[1].tp && p[0].pp == p[1].pp && p[0].micro == p[1].micro && p[0].zero == p[1].zero &&
           p[0].recompute == p[1].recompute && cut && !memcmp(p[0].shares, p[1].shares, sizeof p[0].shares);
}

/* Kendall's tau-a of x and y. */
static double kendall_tau(const double *x, const double *y, int n) {
    double s = 0;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) {
            double dx = x[i] - x[j], dy = y[i] - y[j];
            s += (dx > 0) - (dx < 0) == (dy > 0) - (dy < 0) ? 1 : -1;
        }
    return n > 1 ? s / (n * (n - 1) / 2.0) : NAN;
}

/* ------------------------------------------------------------------------------------------------ */

#define MAX_CONFIGS 40
static bench_config configs[MAX_CONFIGS];
static int n_configs;

static bench_config *add(const char *name, int model, const char *plan, int p0, int p1, int hetero) {
    if (n_configs == MAX_CONFIGS) return NULL;
    bench_config *c = &configs[n_configs++];
    memset(c, 0, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    snprintf(c->plan, sizeof c->plan, "%s", plan);
    c->model = model, c->place[0] = p0, c->place[1] = p1, c->hetero = hetero;
    return c;
}

/* Adds the planner's pick for configurations like `like` (same model, ranks and placement) unless
 * one of them is that plan; marks it (1: on every rank, 2: free to leave ranks out). */
static int add_pick(pdde_context *ctx, const bench_config *like, int ranks, int use_all) {
    char plan[96], name[48];
    int mark = use_all ? 1 : 2;
    if (planner_pick(ctx, like, ranks, use_all, plan, sizeof plan)) {
        fprintf(stderr, "bench_costmodel: the planner: %s\n", pdde_last_error(ctx));
        return -1;
    }
    for (int i = 0; i < n_configs; i++) {
        bench_config *c = &configs[i];
        if (c->model == like->model && c->hetero == like->hetero && c->place[0] == like->place[0] && c->place[1] == like->place[1] &&
            same_plan(c->plan, plan, model_sizes[c->model].layers + 2)) {
            c->pick |= mark;
            return 0;
        }
    }
    snprintf(name, sizeof name, "%s planner's pick%s", like->model ? "L" : "S", use_all ? "" : " (free)");
    bench_config *c = add(name, like->model, plan, like->place[0], like->place[1], like->hetero);
    if (c) c->pick = mark;
    return c ? 0 : -1;
}

static int config_ranks(const bench_config *c) {
    pdde_plan p;
    pdde_plan_parse(c->plan, &p);
    return p.dp * p.tp * p.pp;
}

/* --hetero, the throttled pair: besides the uniform plans, uneven data parallelism by hand (the
 * throttled rank a share a third of the other's: dp=2,shares=3:1) and the fast rank alone (the best
 * plan without the throttled rank: what equal shares leave to a planner). */
static void add_hetero_uneven(int model) {
    char name[48], plan[48];
    snprintf(name, sizeof name, "%s throttled dp2 shares %d:1", model ? "L" : "S", SLOW_SHARE);
    snprintf(plan, sizeof plan, "dp=2,shares=%d:1", SLOW_SHARE);
    add(name, model, plan, PLACE_CPU, PLACE_SLOW, 1);
    add(model ? "L throttled: fast rank alone" : "S throttled: fast rank alone", model, "", PLACE_CPU, PLACE_SLOW, 1);
}

static int config_has_shares(const bench_config *c) {
    pdde_plan p;
    return !pdde_plan_parse(c->plan, &p) && p.shares[0] > 0;
}

/* The best uniform plan (equal shares, an even cut; not a pick) measured in pick p's group: on both
 * ranks (*both), and of any kind, one rank included (*any). */
static void hetero_uniform(const bench_config *p, double *both, double *any) {
    *both = *any = INFINITY;
    for (int j = 0; j < n_configs; j++) {
        const bench_config *c = &configs[j];
        if (!c->n_measured || c->pick || config_has_shares(c) || c->model != p->model || c->hetero != p->hetero || c->place[1] != p->place[1])
            continue;
        *any = fmin(*any, c->t_measured);
        if (config_ranks(c) == 2) *both = fmin(*both, c->t_measured);
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--worker")) return worker(argc - 2, argv + 2);
    int reps = 3, steps = 6, hetero = 0, priority = 1;
    const char *only = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc) steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hetero")) hetero = 1;
        else if (!strcmp(argv[i], "--no-priority")) priority = 0;
        else if (!strcmp(argv[i], "--reuse")) reuse = 1;
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--build") && i + 1 < argc) snprintf(build_dir, sizeof build_dir, "%s", argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--reps N] [--steps N] [--hetero] [--only NAME] [--build DIR] [--no-priority] [--reuse]\n", argv[0]);
            return 2;
        }
    }
    if (reps < 1 || reps > 16 || steps < 1 || steps > 64) {
        fprintf(stderr, "bench_costmodel: --reps 1..16, --steps 1..64\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* one thread a rank, for the ranks (pdde-run keeps what is set) and pdde-bench alike: a pool of 2
     * threads on this shared 2-core machine waits for whichever thread the others' load delays */
    setenv("PDDE_NUM_THREADS", "1", 1), setenv("OPENBLAS_NUM_THREADS", "1", 1), setenv("OMP_NUM_THREADS", "1", 1);
    static char exe[512];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0) return 1;
    exe[len] = 0, self_exe = exe;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    cores = nc > 0 ? (int)nc : 1;
    double load[3] = {0};
    if (getloadavg(load, 3) < 0) load[0] = NAN;
    printf("bench_costmodel: %d cores, load average %.2f %.2f %.2f at the start\n", cores, load[0], load[1], load[2]);

    int have_cgroup = cgroup_create(priority) == 0;
    pdde_context *ctx;
    if (calibrate(cluster_path_cpu, sizeof cluster_path_cpu) || pdde_context_init(NULL, &ctx)) return cgroup_remove(), 1;
    if (pdde_cluster_load(ctx, cluster_path_cpu, &cluster)) {
        fprintf(stderr, "bench_costmodel: %s\n", pdde_last_error(ctx));
        cgroup_remove();
        return 1;
    }
    int have_opencl = pdde_device_find(ctx, "opencl", 0) >= 0;

    if (!hetero) {
        add("S 1 rank", 0, "", 0, 0, 0);
        add("S 1 rank recompute", 0, "recompute=1", 0, 0, 0);
        add("S 1 rank mb2", 0, "mb=2", 0, 0, 0);
        add("L 1 rank", 1, "", 0, 0, 0);
        add("L 1 rank recompute", 1, "recompute=1", 0, 0, 0);
        add("S dp2", 0, "dp=2", 0, 0, 0);
        add("S dp2 zero1", 0, "dp=2,zero=1", 0, 0, 0);
        add("S dp2 zero2", 0, "dp=2,zero=2", 0, 0, 0);
        add("S dp2 zero3", 0, "dp=2,zero=3", 0, 0, 0);
        add("S tp2", 0, "tp=2", 0, 0, 0);
        add("S pp2 mb2", 0, "pp=2,mb=2", 0, 0, 0);
        add("S pp2 mb4", 0, "pp=2,mb=4", 0, 0, 0);
        add("L dp2", 1, "dp=2", 0, 0, 0);
        add("L dp2 zero1 recompute", 1, "dp=2,zero=1,recompute=1", 0, 0, 0);
        add("L tp2", 1, "tp=2", 0, 0, 0);
        add("L pp2 mb4", 1, "pp=2,mb=4", 0, 0, 0);
        add("S dp4", 0, "dp=4", 0, 0, 0);
        add("S dp2 tp2", 0, "dp=2,tp=2", 0, 0, 0);
        add("S dp2 pp2 mb2", 0, "dp=2,pp=2,mb=2", 0, 0, 0);
        add("M 1 rank", 2, "", 0, 0, 0); /* Mixture-of-Experts: experts on every rank, split by ep (all-to-all; over tp: gathered) */
        add("M dp2", 2, "dp=2", 0, 0, 0);
        add("M dp2 ep2", 2, "dp=2,ep=2", 0, 0, 0);
        add("M dp2 tp2 ep2", 2, "dp=2,tp=2,ep=2", 0, 0, 0);
        add("M dp4", 2, "dp=4", 0, 0, 0);
        add("M dp4 ep2", 2, "dp=4,ep=2", 0, 0, 0); /* tokens over 4, the experts over each pair */
        if (have_opencl) add("S 1 rank on PoCL", 0, "", PLACE_OPENCL, 0, 0);
        if (add_pick(ctx, &configs[5], 2, 1) || add_pick(ctx, &configs[11], 2, 1)) return 1;
    }
    if (have_cgroup) {
        const bench_config *first = add("S throttled dp2", 0, "dp=2", PLACE_CPU, PLACE_SLOW, 1);
        add("S throttled pp2 mb4", 0, "pp=2,mb=4", PLACE_CPU, PLACE_SLOW, 1);
        if (hetero) add_hetero_uneven(0);
        if (add_pick(ctx, first, 2, 1) || (hetero && add_pick(ctx, first, 2, 0))) return 1;
        if (hetero) {
            first = add("L throttled dp2", 1, "dp=2", PLACE_CPU, PLACE_SLOW, 1);
            add("L throttled pp2 mb4", 1, "pp=2,mb=4", PLACE_CPU, PLACE_SLOW, 1);
            add_hetero_uneven(1);
            if (add_pick(ctx, first, 2, 1) || add_pick(ctx, first, 2, 0)) return 1;
        }
    }
    if (hetero && have_opencl) {
        const bench_config *first = add("S CPU+PoCL dp2", 0, "dp=2", PLACE_CPU, PLACE_OPENCL, 2);
        add("S CPU+PoCL pp2 mb4", 0, "pp=2,mb=4", PLACE_CPU, PLACE_OPENCL, 2);
        if (add_pick(ctx, first, 2, 1) || add_pick(ctx, first, 2, 0)) return 1;
    }
    if (only) { /* one configuration (by name), for a quick look */
        int k = 0;
        for (int i = 0; i < n_configs; i++)
            if (strstr(configs[i].name, only)) configs[k++] = configs[i];
        n_configs = k;
    }

    for (int rep = 0; rep < reps; rep++) {
        if (rep > 0) { /* the load drifts: each round is predicted from a calibration taken with it */
            pdde_cluster_free(cluster), cluster = NULL;
            if (calibrate(cluster_path_cpu, sizeof cluster_path_cpu) || pdde_cluster_load(ctx, cluster_path_cpu, &cluster)) {
                fprintf(stderr, "bench_costmodel: %s\n", pdde_last_error(ctx));
                cgroup_remove();
                return 1;
            }
        }
        printf("round %d of %d:", rep + 1, reps);
        for (int j = 0; j < n_configs; j++) {
            bench_config *c = &configs[rep % 2 ? n_configs - 1 - j : j];
            if (!run_config(c, steps)) printf(" %.1f", 1e3 * c->measured[c->n_measured - 1]);
            else printf(" failed");
        }
        if (getloadavg(load, 3) < 0) load[0] = NAN;
        printf(" ms (load %.2f)\n", load[0]);
        for (int j = 0; j < n_configs; j++)
            if (predict(ctx, &configs[j])) fprintf(stderr, "bench_costmodel: %s: %s\n", configs[j].name, pdde_last_error(ctx));
    }
    cgroup_remove();

    printf("\n%-26s %-34s %9s %15s %9s %15s %7s %9s %7s %8s %8s\n", "config", "plan", "measured", "(rounds)", "pdde", "(rounds)", "err",
           "paddle", "err", "mem MB", "pred MB");
    double pred[MAX_CONFIGS], meas[MAX_CONFIGS], err_sum = 0, err_max = 0, base_sum = 0, mem_sum = 0;
    int n = 0;
    for (int i = 0; i < n_configs; i++) {
        bench_config *c = &configs[i];
        if (!c->n_measured || !c->n_pred) continue;
        c->t_measured = bench_median(c->measured, c->n_measured);
        c->predicted = bench_median(c->pred, c->n_pred), c->baseline = bench_median(c->base, c->n_pred);
        double err = 100 * fabs(c->predicted - c->t_measured) / c->t_measured, berr = 100 * fabs(c->baseline - c->t_measured) / c->t_measured;
        double merr = 100 * fabs(c->mem_predicted - c->mem_measured) / c->mem_measured;
        /* the medians sorted both: the rounds' range is first to last */
        printf("%-26s %-34s %7.2fms (%6.2f-%6.2f) %7.2fms (%6.2f-%6.2f) %6.1f%% %7.2fms %6.1f%% %8.2f %8.2f%s\n", c->name,
               c->plan[0] ? c->plan : "(one process)", 1e3 * c->t_measured, 1e3 * c->measured[0], 1e3 * c->measured[c->n_measured - 1],
               1e3 * c->predicted, 1e3 * c->pred[0], 1e3 * c->pred[c->n_pred - 1], err, 1e3 * c->baseline, berr, c->mem_measured / 1e6,
               c->mem_predicted / 1e6, c->pick ? "  <- planner's pick" : "");
        pred[n] = c->predicted, meas[n] = c->t_measured, n++;
        err_sum += err, base_sum += berr, mem_sum += merr;
        if (err > err_max) err_max = err;
    }
    /* per group (a model's 2-rank plans, or a heterogeneous setup): the pick against the fastest plan
     * measured, and (heterogeneous) against the best uniform plan: equal batch shares or an even cut */
    double gap = 0, speedup[2][3] = {{INFINITY, INFINITY, INFINITY}, {INFINITY, INFINITY, INFINITY}}, vs_any = INFINITY;
    for (int i = 0; i < n_configs; i++) {
        const bench_config *p = &configs[i];
        if (!p->pick || !p->n_measured) continue;
        double fastest = INFINITY, uniform = INFINITY;
        for (int j = 0; j < n_configs; j++) {
            const bench_config *c = &configs[j];
            if (!c->n_measured || c->model != p->model || c->hetero != p->hetero || c->place[1] != p->place[1] || (!c->hetero && config_ranks(c) != 2))
                continue;
            fastest = fmin(fastest, c->t_measured);
            if (!c->pick) uniform = fmin(uniform, c->t_measured);
        }
        double g = 100 * (p->t_measured / fastest - 1);
        printf("%s: %s measures %.2f ms, the fastest measured %.2f ms: %.1f%% slower", p->name, p->plan[0] ? p->plan : "one process", 1e3 * p->t_measured,
               1e3 * fastest, g);
        if (p->hetero) {
            double any;
            hetero_uniform(p, &uniform, &any);
            printf("; the best uniform plan on both ranks %.2f ms: %.2fx; of any kind %.2f ms: %.2fx", 1e3 * uniform, uniform / p->t_measured,
                   1e3 * any, any / p->t_measured);
            for (int k = 0; k < 2; k++)
                if (p->pick & (1 << k)) speedup[k][p->hetero] = fmin(speedup[k][p->hetero], uniform / p->t_measured);
            if (p->hetero == 1 && (p->pick & 1)) vs_any = fmin(vs_any, any / p->t_measured);
        } else if (g > gap) {
            gap = g;
        }
        printf("\n");
    }
    if (getloadavg(load, 3) < 0) load[0] = NAN;
    printf("load average %.2f %.2f %.2f at the end\n", load[0], load[1], load[2]);
    pdde_cluster_free(cluster);
    pdde_context_free(ctx);
    if (!n) return 1;
    if (hetero)
        printf("RESULT hetero speedup=%.2f cgroup=%.2f pocl=%.2f all_ranks_cgroup=%.2f all_ranks_pocl=%.2f all_ranks_cgroup_vs_any=%.2f\n",
               fmin(speedup[1][1], speedup[1][2]), speedup[1][1], speedup[1][2], speedup[0][1], speedup[0][2], vs_any);
    else
        printf("RESULT costmodel n=%d mape=%.1f max_err=%.1f kendall_tau=%.2f baseline_mape=%.1f pick_gap=%.1f mem_mape=%.1f\n", n, err_sum / n,
               err_max, kendall_tau(pred, meas, n), base_sum / n, gap, mem_sum / n);
    return 0;
}
