/* bench_moe — Mixture-of-Experts on this machine.
 *
 *   bench_moe [--build DIR] [--reps N] [--ep-rounds N] [--min BYTES] [--max BYTES]   (what `make bench-moe` runs)
 *   bench_moe --worker MIN MAX [registered]                (one rank of the all-to-all part, under pdde-run)
 *   bench_moe --alltoall-only [--build DIR] [--min BYTES] [--max BYTES]   (part 2 alone; RESULT moe_alltoall ...)
 *   bench_moe --layer-only [--reps N]                      (part 1 alone, E = 8, f32 and bf16; RESULT moe_layer ...)
 *
 * 1. An MoE feed-forward (router, top-2 of 8 experts, dispatch, grouped GEMMs, GELU, combine) against
 *    the dense MLP of the same active FLOPs (hidden 2 x the experts' ffn), forward and backward on the
 *    same tokens, in alternating rounds: layer_vs_dense = the dense time / the MoE time (its share of
 *    the dense layer's FLOP rate). The same two layers under a bf16 compute dtype (the dense matmuls and
 *    the MoE's permutation and GEMMs in bf16, f32 sums), timed in the same rounds: layer_vs_dense_bf16
 *    the same ratio in bf16, moe_bf16_vs_f32 = the MoE layer's f32 time / its bf16 time.
 * 2. pdde_comm_alltoallv (equal counts, the shape of a balanced token exchange) against Open MPI's
 *    MPI_Alltoallv (tools/bench/mpi_alltoallv.c, the same sizes and timing) on 2 and 4 ranks, each
 *    size the bytes one rank sends (4 KiB, 16 KiB, ... 16 MiB: powers of 4), each size's latency the
 *    median of 7 repeats within a run, then the median over 5 runs of each side in alternating rounds.
 *    Every side fills its send buffer before it starts (real data: an untouched buffer is read from the
 *    kernel's one zero page). pdde runs twice: its send buffer plain malloc'ed memory (what any user
 *    buffer gets) and from pdde_comm_buffer_alloc (registered: what training's expert exchange uses).
 *    alltoall_vs_mpi = the geometric mean over the sizes of pdde's bandwidth / MPI's on 2 ranks with the
 *    plain buffer, alltoall_registered_vs_mpi the same with the registered one, *_4 the same on 4 ranks
 *    (every size's ratios printed). All bound alike: mpirun's default (2 ranks: a core each, pdde-run
 *    --bind cores; more: the whole socket, pdde-run unbound).
 * 3. The cost model: the MoE layer's forward and backward for 4, 8, 16 and 32 experts predicted from
 *    calibrations of this machine (pdde-bench --quick --budget 0.1; three, each followed by a third of
 *    the rounds, so that a load that changes meanwhile is in the calibration as in the rounds it is
 *    compared with): each layer's error the median over the three of its prediction over the median
 *    of the rounds after it; cost_mape their mean absolute value.
 * 4. The ep pick: an MoE GPT (8 experts, top-2) trained under build/pdde-run on 2 ranks, data parallel
 *    (ep 1) and expert parallel (--moe-ep, ep 2), and on 4 ranks, ep 1, ep 2 (--ep 2: groups of 2 of
 *    the 4 dp ranks) and ep 4 (--moe-ep); the runs of every configuration in alternating rounds (A B C
 *    .. A B C ..: load from elsewhere hits them alike), each run's median step, the median over the
 *    rounds. pdde_moe_cost_estimate of each (the layouts as they run: the routed rows exchanged, the
 *    expert gradients reduce-scattered) on this machine's calibrations with collectives (before the
 *    rounds, halfway, after: the median of the three predictions), its CPU device one rank a copy, the machine's cores as the file says (the ranks beyond them share them), picks
 *    one for each number of ranks, as gpt --plan auto does: pick_gap_pct = how much slower the pick
 *    on 2 ranks measured than the faster, pick_gap_pct_4 the same among the 3 on 4 ranks. Beside each,
 *    the model's parts (exchange, expert GEMMs, their buffers, expert gradients) against one traced
 *    run's (rank 0's spans; the exchange's include its waits, the gradients' are all collectives).
 *
 * Last line: RESULT moe layer_vs_dense=.. layer_vs_dense_bf16=.. alltoall_vs_mpi=.. alltoall_vs_mpi_4=..
 * alltoall_registered_vs_mpi=.. alltoall_registered_vs_mpi_4=.. pick_gap_pct=.. cost_mape=.. pick_gap_pct_4=.. */
#define _GNU_SOURCE
#include "pdde.h"
#include "bench_common.h"
#include "bench_collect.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOKENS 2048
#define WIDTH 256
#define FFN 512
#define TOPK 2

static uint64_t rng = 12345;
static float frand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / 8388608.0) - 1.0f;
}

/* The layer's graph: loss = sum(layer(x) * wout), experts 0: the dense MLP of hidden TOPK x FFN; under
 * compute dtype dt (f32 or bf16). */
static pdde_tensor *build_layer(pdde_graph *g, int experts, pdde_dtype dt) {
    int64_t N = TOKENS, C = WIDTH, F = FFN;
    if (pdde_graph_set_compute_dtype(g, dt)) return NULL;
    pdde_tensor *x = pdde_param(g, "x", 2, (int64_t[]){N, C}, 1.0f), *y;
    if (experts == 0) {
        pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){C, TOPK * F}, 0.05f), *w2 = pdde_param(g, "w2", 2, (int64_t[]){TOPK * F, C}, 0.05f);
        y = pdde_matmul(g, pdde_gelu(g, pdde_matmul(g, x, w1, 0, 0)), w2, 0, 0);
    } else {
        int64_t E = experts;
        pdde_tensor *logits = pdde_matmul(g, x, pdde_param(g, "router", 2, (int64_t[]){C, E}, 0.05f), 0, 0);
        pdde_tensor *idx = pdde_moe_topk(g, logits, NULL, TOPK, 0);
        pdde_tensor *w1 = pdde_param(g, "w1", 3, (int64_t[]){E, C, F}, 0.05f), *w2 = pdde_param(g, "w2", 3, (int64_t[]){E, F, C}, 0.05f);
        pdde_tensor *h = pdde_gelu(g, pdde_moe_grouped_matmul(g, pdde_moe_dispatch(g, x, idx, experts, 0), w1, idx, 0, 0));
        y = pdde_moe_combine(g, pdde_moe_grouped_matmul(g, h, w2, idx, 0, 0), idx, pdde_moe_gate(g, logits, idx, 0), experts, 0);
    }
    pdde_tensor *wout = pdde_input(g, "wout", PDDE_F32, 2, (int64_t[]){N, C});
    return pdde_sum(g, pdde_mul(g, y, wout), -1, 0);
}

typedef struct {
    pdde_graph *g;
    pdde_session *s;
    double t[64];
    int n;
} layer_run;

static int layer_open(pdde_context *ctx, int experts, pdde_dtype dt, layer_run *r) {
    memset(r, 0, sizeof *r);
    pdde_graph_init(ctx, &r->g);
    pdde_tensor *loss = build_layer(r->g, experts, dt);
    if (!loss || pdde_backward(r->g, loss) || pdde_session_init(r->g, NULL, &r->s)) {
        fprintf(stderr, "bench_moe: %s\n", pdde_last_error(ctx));
        return -1;
    }
    pdde_tensor *wout = pdde_graph_find(r->g, "wout");
    float *w = malloc((size_t)pdde_tensor_nbytes(wout));
    for (int64_t i = 0; i < pdde_tensor_numel(wout); i++) w[i] = frand();
    pdde_session_write(r->s, wout, w, pdde_tensor_nbytes(wout));
    free(w);
    return pdde_session_run(r->s, PDDE_RUN_FORWARD_BACKWARD); /* warm-up */
}

static int layer_time(layer_run *r) {
    double t0 = bench_now();
    int st = pdde_session_run(r->s, PDDE_RUN_FORWARD_BACKWARD);
    if (r->n < 64) r->t[r->n++] = bench_now() - t0;
    return st;
}

static void layer_close(layer_run *r) { pdde_session_free(r->s), pdde_graph_free(r->g); }

/* ---- the all-to-all ---- */

static int worker(size_t min, size_t max, int registered) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_comm *c;
    if (pdde_comm_init(ctx, NULL, &c)) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    int n = pdde_comm_size(c), rc = 0;
    void *sp = NULL;
    if (registered && pdde_comm_buffer_alloc(c, (max / 4 + (size_t)n) * 4, &sp)) { fprintf(stderr, "%s\n", pdde_last_error(ctx)); return 1; }
    float *send = registered ? sp : calloc(max / 4 + (size_t)n, 4), *recv = calloc(max / 4 + (size_t)n, 4);
    for (size_t i = 0; i < max / 4 + (size_t)n; i++) send[i] = (float)(i % 1000), recv[i] = 0; /* real pages, not the zero page */
    size_t *counts = calloc((size_t)n, sizeof *counts), *displs = calloc((size_t)n, sizeof *displs);
    for (size_t bytes = 64; bytes <= max && !rc; bytes = bench_next_size(bytes)) {
        if (bytes < min) continue;
        size_t per = bytes / 4 / (size_t)n; /* bytes: one rank's whole send buffer */
        for (int r = 0; r < n; r++) counts[r] = per, displs[r] = (size_t)r * per;
        int iters = bench_iters(bytes), reps = bench_reps(bytes);
        double t[16];
        rc |= pdde_comm_alltoallv(c, send, counts, displs, recv, counts, displs, PDDE_F32);
        for (int r = 0; r < reps && !rc; r++) {
            rc |= pdde_comm_barrier(c);
            double t0 = bench_now();
            for (int i = 0; i < iters && !rc; i++) rc |= pdde_comm_alltoallv(c, send, counts, displs, recv, counts, displs, PDDE_F32);
            t[r] = (bench_now() - t0) / iters;
        }
        if (rc) fprintf(stderr, "alltoallv: %s\n", pdde_last_error(ctx));
        else if (pdde_comm_rank(c) == 0) printf("RES %zu %.9g\n", bytes, bench_median(t, reps));
        fflush(stdout);
    }
    if (registered) pdde_comm_buffer_free(send);
    else free(send);
    free(recv), free(counts), free(displs);
    pdde_comm_free(c);
    pdde_context_free(ctx);
    return rc ? 1 : 0;
}

#define MAXS 32

/* 2. the all-to-all: pdde (plain send buffer, registered send buffer) and MPI in alternating rounds
 * (load from elsewhere hits them alike), each size's latency the median over the rounds of each run's
 * median; a ratio the geometric mean over the sizes both measured. vs_mpi: [0] plain 2 ranks, [1] plain
 * 4 ranks, [2] registered 2 ranks, [3] registered 4 ranks. */
static void alltoall_sweep(const char *build, size_t min, size_t max, double vs_mpi[4]) {
#define A2A_ROUNDS 5
    enum { PLAIN, REG, MPI, SIDES };
    vs_mpi[0] = vs_mpi[1] = vs_mpi[2] = vs_mpi[3] = NAN;
    char cmd[2048];
    for (int n = 2; n <= 4; n += 2) {
        size_t sizes[SIDES][MAXS];
        double lat[SIDES][A2A_ROUNDS][MAXS], med[SIDES][MAXS], t[A2A_ROUNDS];
        int got[SIDES] = {MAXS, MAXS, MAXS}, rounds[SIDES] = {0}, bind = n <= 2 && n <= sysconf(_SC_NPROCESSORS_ONLN);
        for (int round = 0; round < A2A_ROUNDS; round++)
            for (int side = 0; side < SIDES; side++) {
                size_t sz[MAXS];
                /* bound as mpirun binds by default: up to 2 ranks one core each, beyond that the whole socket */
                if (side == MPI)
                    snprintf(cmd, sizeof cmd, "mpirun --allow-run-as-root --oversubscribe -np %d %s/mpi_alltoallv %zu %zu 2>&1", n, build, min, max);
                else
                    snprintf(cmd, sizeof cmd, "%s%s/pdde-run -n %d %s %s/bench_moe --worker %zu %zu %s 2>&1", bind ? "PDDE_NUM_THREADS=1 " : "",
                             build, n, bind ? "--bind cores" : "", build, min, max, side == REG ? "registered" : "");
                int k = bench_collect("bench_moe", cmd, sz, lat[side][rounds[side]], MAXS);
                if (k > 0) { memcpy(sizes[side], sz, sizeof sz); got[side] = k < got[side] ? k : got[side]; rounds[side]++; }
            }
        for (int side = 0; side < SIDES; side++) {
            if (!rounds[side]) got[side] = 0;
            for (int i = 0; i < got[side]; i++) {
                for (int r = 0; r < rounds[side]; r++) t[r] = lat[side][r][i];
                med[side][i] = bench_median(t, rounds[side]);
            }
        }
        printf("alltoallv f32, equal counts, %d ranks (one host, %ld cores, %s), medians of %d alternating runs each: bytes a rank sends, "
               "bandwidth = bytes x (n-1)/n / time; pdde's send buffer plain (malloc) or registered (pdde_comm_buffer_alloc)\n", n,
               sysconf(_SC_NPROCESSORS_ONLN), bind ? "a core each" : "unbound", A2A_ROUNDS);
        printf("%10s %10s %10s %10s %10s %10s %10s %8s %8s\n", "bytes", "plain us", "reg us", "mpi us", "plain GB/s", "reg GB/s", "mpi GB/s",
               "plain/mpi", "reg/mpi");
        double logsum[2] = {0, 0};
        int nlog[2] = {0, 0};
        for (int i = 0; i < got[PLAIN]; i++) {
            double lr = 0, lm = 0, f = (double)(n - 1) / n, b[SIDES];
            for (int j = 0; j < got[REG]; j++)
                if (sizes[REG][j] == sizes[PLAIN][i]) lr = med[REG][j];
            for (int j = 0; j < got[MPI]; j++)
                if (sizes[MPI][j] == sizes[PLAIN][i]) lm = med[MPI][j];
            b[PLAIN] = sizes[PLAIN][i] * f / med[PLAIN][i] / 1e9, b[REG] = lr > 0 ? sizes[PLAIN][i] * f / lr / 1e9 : 0;
            b[MPI] = lm > 0 ? sizes[PLAIN][i] * f / lm / 1e9 : 0;
            printf("%10zu %10.2f %10.2f %10.2f %10.3f %10.3f %10.3f %8.2f %8.2f\n", sizes[PLAIN][i], med[PLAIN][i] * 1e6, lr * 1e6, lm * 1e6,
                   b[PLAIN], b[REG], b[MPI], b[MPI] > 0 ? b[PLAIN] / b[MPI] : 0, b[MPI] > 0 ? b[REG] / b[MPI] : 0);
            for (int k = 0; k < 2; k++)
                if (b[MPI] > 0 && b[k] > 0) logsum[k] += log(b[k] / b[MPI]), nlog[k]++;
        }
        for (int k = 0; k < 2; k++)
            if (nlog[k]) vs_mpi[2 * k + n / 2 - 1] = exp(logsum[k] / nlog[k]);
        printf("  geometric means of the ratios over %d sizes: plain %.3f, registered %.3f\n", nlog[0], vs_mpi[n / 2 - 1], vs_mpi[2 + n / 2 - 1]);
        fflush(stdout);
    }
}

/* The MoE parts of rank 0's steps after the 5th in a trace of gpt (pdde-run --trace: one event a line),
 * ms a step: [0] the exchange (alltoall, its waits included), [1] the expert GEMMs, [2] the passes over
 * their buffers (the activation, dispatch, combine), [3] the gradients' collectives (all of them: at
 * ep 1 the experts' ride in the dense buckets), [4] the step. 0 when the trace has no steps. */
enum { PARTS = 5 }; /* ([4]: the step) */
static int trace_parts(const char *path, double *ms) {
    static const char *const prefix[PARTS][4] = {{"alltoall"}, {"moe_grouped_matmul"}, {"gelu", "moe_dispatch", "moe_combine"},
                                                 {"allreduce", "reduce_scatter", "bucket"}, {"step\""}};
    FILE *f = fopen(path, "r");
    char line[1024];
    int steps[64] = {0}, n_steps = 0;
    memset(ms, 0, PARTS * sizeof *ms);
    while (f && fgets(line, sizeof line, f)) {
        char *dur = strstr(line, "\"dur\":"), *pid = strstr(line, "\"pid\":"), *step = strstr(line, "\"step\":");
        int st = step ? atoi(step + 7) : 0;
        if (strncmp(line, "{\"name\":\"", 9) || !dur || !pid || atoi(pid + 6) != 0 || st <= 5 || st >= 64) continue;
        if (!steps[st]) steps[st] = 1, n_steps++;
        for (int k = 0; k < PARTS; k++)
            for (int i = 0; i < 4 && prefix[k][i]; i++)
                if (!strncmp(line + 9, prefix[k][i], strlen(prefix[k][i]))) ms[k] += atof(dur + 6) / 1e3;
    }
    if (f) fclose(f);
    for (int k = 0; k < PARTS; k++) ms[k] = n_steps ? ms[k] / n_steps : 0;
    return n_steps;
}

int main(int argc, char **argv) {
    const char *build = "build";
    int reps = 15, ep_rounds = 7, a2a_only = 0, layer_only = 0;
    size_t max = (size_t)16 << 20, min = (size_t)4 << 10;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--worker") && i + 2 < argc)
            return worker(strtoull(argv[i + 1], NULL, 10), strtoull(argv[i + 2], NULL, 10), i + 3 < argc && !strcmp(argv[i + 3], "registered"));
        if (!strcmp(argv[i], "--build") && i + 1 < argc) build = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max") && i + 1 < argc) max = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--min") && i + 1 < argc) min = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--ep-rounds") && i + 1 < argc) ep_rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--alltoall-only")) a2a_only = 1;
        else if (!strcmp(argv[i], "--layer-only")) layer_only = 1;
        else { fprintf(stderr, "usage: bench_moe [--build DIR] [--reps N] [--ep-rounds N] [--min BYTES] [--max BYTES] [--alltoall-only | --layer-only] | --worker MIN MAX [registered]\n"); return 2; }
    }
    if (a2a_only) { /* part 2 alone */
        double v[4];
        alltoall_sweep(build, min, max, v);
        printf("RESULT moe_alltoall alltoall_vs_mpi=%.3f alltoall_vs_mpi_4=%.3f alltoall_registered_vs_mpi=%.3f alltoall_registered_vs_mpi_4=%.3f\n",
               v[0], v[1], v[2], v[3]);
        return 0;
    }
    if (reps < 6) reps = 6; /* (at least 2 rounds a calibration) */
    if (reps > 64) reps = 64;
    if (ep_rounds < 1 || ep_rounds > 64) ep_rounds = 7;
    pdde_context *ctx;
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context_init(&cp, &ctx);

    /* 1. MoE layer against the dense one; 3. the cost model's predictions of the MoE layers */
    static const int experts[] = {8, 4, 16, 32};
    enum { NE = sizeof experts / sizeof experts[0] };
    layer_run dense, moe[NE], dense_bf16, moe_bf16; /* (bf16: E = 8) */
    if (layer_open(ctx, 0, PDDE_F32, &dense) || layer_open(ctx, 0, PDDE_BF16, &dense_bf16) || layer_open(ctx, experts[0], PDDE_BF16, &moe_bf16)) return 1;
    for (int e = 0; e < NE && !(layer_only && e); e++)
        if (layer_open(ctx, experts[e], PDDE_F32, &moe[e])) return 1;
    if (layer_only) { /* part 1 alone: the four layers in alternating rounds */
        for (int r = 0; r < reps; r++)
            if (layer_time(&dense) || layer_time(&moe[0]) || layer_time(&dense_bf16) || layer_time(&moe_bf16)) return 1;
        double t[4] = {bench_median(dense.t, dense.n), bench_median(moe[0].t, moe[0].n), bench_median(dense_bf16.t, dense_bf16.n),
                       bench_median(moe_bf16.t, moe_bf16.n)};
        printf("MoE feed-forward (%d tokens, width %d, top-%d of 8 experts of ffn %d) and the dense MLP of ffn %d, forward + backward, "
               "%d threads, median of %d alternating rounds\n  f32:  dense %8.3f ms  moe %8.3f ms\n  bf16: dense %8.3f ms  moe %8.3f ms\n",
               TOKENS, WIDTH, TOPK, FFN, TOPK * FFN, pdde_context_thread_count(ctx), reps, t[0] * 1e3, t[1] * 1e3, t[2] * 1e3, t[3] * 1e3);
        printf("RESULT moe_layer layer_vs_dense=%.3f layer_vs_dense_bf16=%.3f moe_bf16_vs_f32=%.3f\n", t[0] / t[1], t[2] / t[3], t[1] / t[3]);
        layer_close(&dense), layer_close(&moe[0]), layer_close(&dense_bf16), layer_close(&moe_bf16);
        pdde_context_free(ctx);
        return 0;
    }
    /* calibrations, each followed by its block of rounds: each layer predicted by each calibration and
     * compared with the block measured right after it (the same load, as near as can be) */
    char cmd[2048], cluster[1024];
    snprintf(cluster, sizeof cluster, "%s/bench_moe_cluster.json", build);
    snprintf(cmd, sizeof cmd, "%s/pdde-bench -o %s --quick --budget 0.1 --no-comm --devices cpu >/dev/null 2>&1", build, cluster); /* (medians of 0.1 s a point) */
#define CALIBS 3
    double pred[CALIBS][NE], err[CALIBS][NE];
    int n_calib = 0;
    for (int k = 0; k < CALIBS; k++) {
        pdde_cluster *cl = NULL;
        int ok = system(cmd) == 0 && pdde_cluster_load(ctx, cluster, &cl) == PDDE_OK && cl->n_machines > 0 && cl->machines[0].n_devices > 0;
        if (!ok) fprintf(stderr, "bench_moe: no calibration (%s)\n", cl ? pdde_last_error(ctx) : cmd);
        for (int e = 0; ok && e < NE; e++) {
            pdde_cost_program *p = NULL;
            pdde_cost_result *res = NULL;
            if (pdde_cost_program_from_graph(moe[e].g, cl->machines[0].devices[0].id, &p) == PDDE_OK && pdde_cost_simulate(ctx, cl, p, &res) == PDDE_OK)
                pred[n_calib][e] = res->step_time;
            else
                ok = 0, fprintf(stderr, "bench_moe: cost model: %s\n", pdde_last_error(ctx));
            pdde_cost_result_free(res), pdde_cost_program_free(p);
        }
        pdde_cluster_free(cl);
        int first[NE];
        for (int e = 0; e < NE; e++) first[e] = moe[e].n;
        for (int r = k * reps / CALIBS; r < (k + 1) * reps / CALIBS; r++) { /* rounds of every layer, in turn */
            if (layer_time(&dense) || layer_time(&dense_bf16) || layer_time(&moe_bf16)) return 1;
            for (int e = 0; e < NE; e++)
                if (layer_time(&moe[e])) return 1;
        }
        for (int e = 0; ok && e < NE; e++) err[n_calib][e] = pred[n_calib][e] / bench_median(moe[e].t + first[e], moe[e].n - first[e]) - 1;
        n_calib += ok;
    }
    double flops = 3.0 * 2.0 * 2.0 * TOKENS * (double)WIDTH * TOPK * FFN; /* 2 GEMMs, forward + 2x backward */
    double td = bench_median(dense.t, dense.n);
    printf("MoE feed-forward, %d tokens, width %d, top-%d of E experts of ffn %d, against the dense MLP of ffn %d (same active FLOPs), "
           "forward + backward, %d threads, median of %d\n", TOKENS, WIDTH, TOPK, FFN, TOPK * FFN, pdde_context_thread_count(ctx), reps);
    printf("  dense        %8.3f ms  %7.2f GFLOP/s\n", td * 1e3, flops / td * 1e-9);
    double tm[NE];
    for (int e = 0; e < NE; e++) {
        tm[e] = bench_median(moe[e].t, moe[e].n);
        printf("  moe E=%-3d    %8.3f ms  %7.2f GFLOP/s  %.3f of dense\n", experts[e], tm[e] * 1e3, flops / tm[e] * 1e-9, td / tm[e]);
    }
    double layer_vs_dense = td / tm[0], td_bf16 = bench_median(dense_bf16.t, dense_bf16.n), tm_bf16 = bench_median(moe_bf16.t, moe_bf16.n);
    double layer_vs_dense_bf16 = td_bf16 / tm_bf16;
    printf("  bf16: dense  %8.3f ms, moe E=8 %8.3f ms: %.3f of dense; the MoE layer %.3f x its f32 speed\n", td_bf16 * 1e3, tm_bf16 * 1e3,
           layer_vs_dense_bf16, tm[0] / tm_bf16);
    double mape = NAN;
    if (n_calib) {
        double sum = 0;
        printf("cost model: %d calibrations by pdde-bench --quick, each followed by a block of the rounds; error = the median over the "
               "blocks of (the prediction / the block's median - 1)\n", n_calib);
        for (int e = 0; e < NE; e++) {
            double t[CALIBS], ev[CALIBS], lo = INFINITY, hi = 0;
            for (int k = 0; k < n_calib; k++) t[k] = pred[k][e], ev[k] = err[k][e], lo = t[k] < lo ? t[k] : lo, hi = t[k] > hi ? t[k] : hi;
            double pm = bench_median(t, n_calib), em = bench_median(ev, n_calib);
            printf("  moe E=%-3d    predicted %8.3f ms (%.3f .. %.3f), measured %8.3f ms: %+.1f%% (paired)\n", experts[e], pm * 1e3, lo * 1e3, hi * 1e3,
                   tm[e] * 1e3, 100 * em);
            sum += fabs(em);
        }
        mape = 100 * sum / NE;
    } else {
        fprintf(stderr, "bench_moe: no calibration: cost_mape not measured\n");
    }
    layer_close(&dense), layer_close(&dense_bf16), layer_close(&moe_bf16);
    for (int e = 0; e < NE; e++) layer_close(&moe[e]);

    /* 2. the all-to-all */
    double vs_mpi[4];
    alltoall_sweep(build, min, max, vs_mpi);
    /* 4. the ep pick: 2 ranks (ep 1, 2), 4 ranks (ep 1, 2 in groups, 4), alternating rounds */
    static const struct { int ranks, ep; const char *args; } cfg[] = {
        {2, 1, "--dp 2"}, {2, 2, "--dp 2 --moe-ep"}, {4, 1, "--dp 4"}, {4, 2, "--dp 4 --ep 2"}, {4, 4, "--dp 4 --moe-ep"}};
    enum { NC = sizeof cfg / sizeof cfg[0] };
    double runs[NC][64], measured[NC], predicted[NC], gap = NAN, gap4 = NAN;
    int n_runs[NC] = {0};
    /* this machine's calibration with collectives (one thread a rank) before the rounds, halfway and
     * after them: each configuration's prediction the median of the three */
    char calib[2048];
    snprintf(calib, sizeof calib, "PDDE_NUM_THREADS=1 %s/pdde-bench -o %s --quick --devices cpu >/dev/null 2>&1", build, cluster);
    double preds[NC][3], parts[NC][3][PARTS], seen[NC][PARTS]; /* the model's parts: exchange, GEMMs, buffers, gradients */
    int n_pred = 0, cores = 0;
    for (int r = 0; r <= ep_rounds; r++) {
        pdde_cluster *cl = NULL;
        if ((r == 0 || r == ep_rounds / 2 || r == ep_rounds) && n_pred < 3 && system(calib) == 0 && pdde_cluster_load(ctx, cluster, &cl) == PDDE_OK &&
            cl->n_machines > 0 && cl->machines[0].n_devices > 0) {
            /* the other ranks: copies of the machine's CPU device (the ranks share its cores, a thread each) */
            pdde_cluster_device d0 = cl->machines[0].devices[0];
            int dev[4] = {d0.id, d0.id + 1000, d0.id + 2000, d0.id + 3000}, ok = 1;
            for (int k = 1; k < 4; k++) {
                pdde_cluster_device dk = d0;
                dk.id = dev[k];
                pdde_cluster_add_device(cl, 0, &dk);
            }
            cores = cl->machines[0].cores;
            for (int i = 0; i < NC; i++) {
                pdde_moe_cost_params mp = PDDE_MOE_COST_PARAMS_INIT;
                mp.tokens = 8 * 64, mp.width = 128, mp.ffn = 512, mp.experts = 8, mp.topk = 2, mp.layers = 2;
                mp.capacity_factor = 0; /* dropless: the exchange carries the routed rows only */
                mp.grads_over_ep = 1;
                pdde_moe_cost mc;
                if (pdde_moe_cost_estimate(ctx, cl, dev, cfg[i].ranks, &mp, cfg[i].ep, &mc) == PDDE_OK) {
                    preds[i][n_pred] = mc.step_s;
                    double *pp = parts[i][n_pred];
                    pp[0] = mc.alltoall_s, pp[1] = mc.expert_gemm_s, pp[2] = mc.expert_buffer_s, pp[3] = mc.dp_sync_s, pp[4] = mc.step_s;
                }
                else ok = 0, fprintf(stderr, "bench_moe: %s\n", pdde_last_error(ctx));
            }
            n_pred += ok;
        }
        pdde_cluster_free(cl);
        for (int i = 0; r < ep_rounds && i < NC; i++) {
            char metrics[1024];
            snprintf(metrics, sizeof metrics, "%s/bench_moe_ep.jsonl", build);
            remove(metrics);
            snprintf(cmd, sizeof cmd, "%s/pdde-run -n %d %s/gpt %s --moe-experts 8 --moe-topk 2 --layers 2 --width 128 --ctx 64 --batch 8 "
                     "--steps 20 --val-every 0 --sample-len 0 --ckpt-every 0 --threads 1 --metrics %s >/dev/null 2>&1", build, cfg[i].ranks, build,
                     cfg[i].args, metrics);
            FILE *f = system(cmd) == 0 ? fopen(metrics, "r") : NULL;
            double t[64];
            int n = 0;
            char line[512];
            while (f && fgets(line, sizeof line, f)) {
                char *p = strstr(line, "\"step_s\":");
                int step = 0;
                if (p && sscanf(line, "{\"step\":%d", &step) == 1 && step > 5 && n < 64) t[n++] = atof(p + 9);
            }
            if (f) fclose(f);
            if (n && n_runs[i] < 64) runs[i][n_runs[i]++] = bench_median(t, n);
            else if (!n) fprintf(stderr, "bench_moe: '%s' gave no steps\n", cmd);
        }
    }
    for (int i = 0; i < NC; i++) { /* one more run of each, traced: the measured parts */
        char trace[1024];
        snprintf(trace, sizeof trace, "%s/bench_moe_trace.json", build);
        snprintf(cmd, sizeof cmd, "%s/pdde-run -n %d --trace %s %s/gpt %s --moe-experts 8 --moe-topk 2 --layers 2 --width 128 --ctx 64 --batch 8 "
                 "--steps 20 --val-every 0 --sample-len 0 --ckpt-every 0 --threads 1 >/dev/null 2>&1", build, cfg[i].ranks, trace, build, cfg[i].args);
        if (system(cmd) != 0 || !trace_parts(trace, seen[i])) memset(seen[i], 0, sizeof seen[i]);
        remove(trace);
    }
    for (int i = 0; i < NC; i++) measured[i] = n_runs[i] ? bench_median(runs[i], n_runs[i]) : NAN, predicted[i] = n_pred ? bench_median(preds[i], n_pred) : NAN;
    printf("ep pick (MoE GPT, 8 experts, top-2, 2 layers of width 128, 512 tokens a step; a thread a rank on %ld cores, the cluster file's "
           "machine: %d cores, shared by the ranks beyond them; medians of %d alternating rounds):\n", sysconf(_SC_NPROCESSORS_ONLN), cores, ep_rounds);
    for (int n = 2; n <= 4; n += 2) {
        int pick = -1, best = -1;
        for (int i = 0; i < NC; i++) {
            if (cfg[i].ranks != n) continue;
            printf("  %d ranks, ep %d (%-16s): measured %7.2f ms a step, the model's MoE part %7.2f ms\n", n, cfg[i].ep, cfg[i].args, measured[i] * 1e3,
                   predicted[i] * 1e3);
            double pm[PARTS] = {0};
            for (int k = 0; k < PARTS && n_pred; k++) {
                double v[3];
                for (int j = 0; j < n_pred; j++) v[j] = parts[i][j][k];
                pm[k] = bench_median(v, n_pred) * 1e3;
            }
            printf("      ms a step, predicted / measured (one traced run, rank 0): exchange %.2f / %.2f, expert GEMMs %.2f / %.2f, "
                   "buffers %.2f / %.2f, expert gradients %.2f / all gradients %.2f (its step %.2f)\n", pm[0], seen[i][0], pm[1], seen[i][1], pm[2],
                   seen[i][2], pm[3], seen[i][3], seen[i][4]);
            if (!isfinite(measured[i]) || !isfinite(predicted[i])) { pick = best = -2; continue; }
            if (pick == -1 || (pick >= 0 && predicted[i] < predicted[pick])) pick = i;
            if (best == -1 || (best >= 0 && measured[i] < measured[best])) best = i;
        }
        if (pick < 0 || best < 0) { gap4 = NAN; continue; }
        double g = 100 * (measured[pick] / measured[best] - 1);
        printf("  %d ranks: picks ep %d, %.1f%% from the fastest (ep %d)\n", n, cfg[pick].ep, g, cfg[best].ep);
        gap4 = g;
        if (n == 2) gap = g;
    }
    printf("RESULT moe layer_vs_dense=%.3f layer_vs_dense_bf16=%.3f alltoall_vs_mpi=%.3f alltoall_vs_mpi_4=%.3f alltoall_registered_vs_mpi=%.3f "
           "alltoall_registered_vs_mpi_4=%.3f pick_gap_pct=%.1f cost_mape=%.1f pick_gap_pct_4=%.1f\n",
           layer_vs_dense, layer_vs_dense_bf16, vs_mpi[0], vs_mpi[1], vs_mpi[2], vs_mpi[3], gap, mape, gap4);
    pdde_context_free(ctx);
    return 0;
}
