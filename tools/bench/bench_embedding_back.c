/* bench_embedding_back — the embedding's backward on a device: the sorted form (ids sorted with their
 * positions, each row's dy summed in the order of the ids: reproducible, the CPU's bits) against the
 * float-atomic form, in the same run on the same ids (backends/gpu_dispatch.h, PGD_EMB_*). A graph
 * loss = sum(embedding(table, ids) * dy) in two sessions, one per form (<PREFIX>EMBEDDING_BACK set when
 * each is made); a step is its forward and backward, the backward's share is the step minus a forward
 * (medians over the steps, then over R repeats, the two forms alternating). GPT's shape by default
 * (vocabulary 50304, 8 x 1024 ids drawn skewed as tokens are, width 768); --recsys: DLRM's local table
 * (256 x 26 ids drawn from 20000 into a [6657, 16] table, as bench_sparse_collect); --large: a recommender
 * batch past one group's sort (26 tables x 4096 = 106496 ids drawn skewed into [1000000, 16]).
 * --sorts: the sorted form's two GPU sorts apart (<PREFIX>EMBEDDING_SORT=radix, the many groups' radix sort;
 * =network, one group's bitonic network) against the atomics, three sessions; under PDDE_PROFILE=device each
 * form's device time of the embedding_back node per step is reported too (medians over the repeats).
 * Last line:
 *   RESULT embedding_back device=<backend> V=.. C=.. n=.. us_sorted=.. us_atomic=.. ratio=<sorted / atomic>
 *          step_us_sorted=.. step_us_atomic=..
 *   with --sorts:
 *   RESULT embedding_back_sorts device=.. V=.. C=.. n=.. us_radix=.. us_network=.. us_atomic=.. ratio=<radix / network>
 *          [dev_ms_radix=.. dev_ms_network=.. dev_ms_atomic=.. dev_ratio=<radix / network>]
 *
 *   bench_embedding_back [--backend opencl|cuda] [--recsys | --large] [--sorts] [--vocab V] [--width C] [--ids N]
 *                        [--steps S] [--reps R] */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include "pdde_extension.h"
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    pdde_graph *g;
    pdde_session *s;
    pdde_tensor *ids, *dy;
} emb_run;

/* A session of the graph on device dev with the backward's form `form` and, where sort_var is given, the
 * sort `sort` (its backend's variables set while the session's stream is made). */
static pdde_status emb_open(pdde_context *ctx, int dev, const char *var, const char *form, const char *sort_var, const char *sort,
                            int64_t V, int64_t C, int64_t n, emb_run *r) {
    memset(r, 0, sizeof *r);
    pdde_graph_init(ctx, &r->g);
    pdde_tensor *table = pdde_param(r->g, "table", 2, (int64_t[]){V, C}, 0.02f);
    r->ids = pdde_input(r->g, "ids", PDDE_I32, 1, (int64_t[]){n});
    r->dy = pdde_input(r->g, "dy", PDDE_F32, 2, (int64_t[]){n, C});
    pdde_tensor *loss = pdde_sum(r->g, pdde_mul(r->g, pdde_embedding(r->g, table, r->ids), r->dy), -1, 0);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev, sp.no_cpu_fallback = 1;
    pdde_status st = pdde_graph_status(r->g);
    if (!st) st = pdde_backward(r->g, loss);
    setenv(var, form, 1);
    if (sort_var) setenv(sort_var, sort, 1);
    if (!st) st = pdde_session_init(r->g, &sp, &r->s);
    unsetenv(var);
    if (sort_var) unsetenv(sort_var);
    return st;
}

static void emb_close(emb_run *r) {
    pdde_session_free(r->s);
    pdde_graph_free(r->g);
}

/* The embedding_back node's device ms summed over the session's runs after its first (0 without
 * PDDE_PROFILE=device) */
static double emb_device_total_ms(const emb_run *r) {
    pdde_device_profile p;
    if (pdde_session_device_profile(r->s, &p)) return 0;
    return pdde_session_device_op_ms(r->s, PDDE_OP_EMBEDDING_BACK) * (double)p.runs;
}

/* Medians over `steps` of a forward + backward and of a forward (us). */
static pdde_status emb_time(emb_run *r, int steps, double *fb, double *f) {
    double *t = malloc((size_t)steps * 2 * sizeof *t);
    if (!t) return PDDE_ERR_OOM;
    pdde_status st = PDDE_OK;
    for (int i = -1; i < steps && !st; i++) { /* (one warm-up step) */
        double t0 = bench_now();
        st = pdde_session_run(r->s, PDDE_RUN_FORWARD_BACKWARD);
        double t1 = bench_now();
        if (!st) st = pdde_session_run(r->s, PDDE_RUN_FORWARD);
        if (i >= 0) t[i] = 1e6 * (t1 - t0), t[steps + i] = 1e6 * (bench_now() - t1);
    }
    if (!st) *fb = bench_median(t, steps), *f = bench_median(t + steps, steps);
    free(t);
    return st;
}

int main(int argc, char **argv) {
    const char *fam = "opencl";
    int64_t V = 50304, C = 768, n = 8192;
    int steps = 10, reps = 5, recsys = 0, large = 0, sorts = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--recsys")) recsys = 1, V = 6657, C = 16, n = 256 * 26;
        else if (!strcmp(argv[i], "--large")) large = 1, V = 1000000, C = 16, n = 26 * 4096;
        else if (!strcmp(argv[i], "--sorts")) sorts = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--backend")) fam = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--vocab")) V = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--width")) C = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--ids")) n = atoll(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--steps")) steps = atoi(argv[++i]);
        else if (i + 1 < argc && !strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--backend opencl|cuda] [--recsys | --large] [--sorts] [--vocab V] [--width C] [--ids N] [--steps S] [--reps R]\n",
                    argv[0]);
            return 2;
        }
    }
    if (V < 1 || C < 1 || n < 1 || steps < 1 || reps < 1 || V > INT32_MAX) {
        fprintf(stderr, "bench_embedding_back: vocabulary, width, ids, steps and repeats must be positive\n");
        return 2;
    }
    const char *var = !strcmp(fam, "cuda") ? "PDDE_CUDA_EMBEDDING_BACK" : "PDDE_OPENCL_EMBEDDING_BACK";
    const char *sort_var = !strcmp(fam, "cuda") ? "PDDE_CUDA_EMBEDDING_SORT" : "PDDE_OPENCL_EMBEDDING_SORT";
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) return 1;
    int dev = pdde_device_find(ctx, fam, 0);
    if (dev < 0) {
        fprintf(stderr, "bench_embedding_back: no %s device\n", fam);
        pdde_context_free(ctx);
        return 1;
    }
    /* ids: recsys uniform over 20000 remapped to local rows (first seen, first row), GPT skewed as u^3 */
    int32_t *ids = malloc((size_t)n * sizeof *ids), *local = recsys ? calloc(20000, sizeof *local) : NULL;
    float *dy = malloc((size_t)(n * C) * sizeof *dy);
    if (!ids || !dy || (recsys && !local)) return 1;
    uint32_t rs = 12345;
    int32_t next = 0;
    for (int64_t i = 0; i < n; i++) {
        rs = rs * 1103515245u + 12345u;
        double u = (double)(rs >> 8) / 16777216.0;
        if (recsys) {
            int32_t id = (int32_t)((rs >> 8) % 20000);
            if (!local[id]) local[id] = ++next;
            ids[i] = (local[id] - 1) % (int32_t)V;
        } else ids[i] = (int32_t)(u * u * u * (double)V);
    }
    for (int64_t i = 0; i < n * C; i++) rs = rs * 1103515245u + 12345u, dy[i] = (float)((rs >> 8) % 2001) / 1000.0f - 1.0f;
    emb_run runs[3];
    /* the forms: sorted (the backend's sort) and atomic; with --sorts radix, network, atomic */
    const char *forms[3] = {"sorted", "atomic", NULL}, *form_sorts[3] = {NULL, NULL, NULL};
    int nforms = 2;
    if (sorts) {
        nforms = 3;
        forms[0] = forms[1] = "sorted", forms[2] = "atomic";
        form_sorts[0] = "radix", form_sorts[1] = "network";
    }
    pdde_status st = PDDE_OK;
    for (int k = 0; k < nforms && !st; k++) {
        st = emb_open(ctx, dev, var, forms[k], form_sorts[k] ? sort_var : NULL, form_sorts[k], V, C, n, &runs[k]);
        if (!st) st = pdde_session_write(runs[k].s, runs[k].ids, ids, (size_t)n * sizeof *ids);
        if (!st) st = pdde_session_write(runs[k].s, runs[k].dy, dy, (size_t)(n * C) * sizeof *dy);
    }
    double *back[3], *step[3], *dev_ms[3];
    for (int k = 0; k < nforms; k++)
        back[k] = malloc((size_t)reps * sizeof(double)), step[k] = malloc((size_t)reps * sizeof(double)),
        dev_ms[k] = malloc((size_t)reps * sizeof(double));
    for (int r = 0; r < reps && !st; r++)
        for (int k = 0; k < nforms && !st; k++) {
            double fb = 0, f = 0, before = emb_device_total_ms(&runs[k]);
            st = emb_time(&runs[k], steps, &fb, &f);
            back[k][r] = fb - f, step[k][r] = fb;
            /* (the session's first run is not in the totals: the first repeat has one step fewer) */
            dev_ms[k][r] = (emb_device_total_ms(&runs[k]) - before) / (double)(steps + (r > 0));
        }
    if (st) {
        fprintf(stderr, "bench_embedding_back: %s\n", pdde_last_error(ctx));
        return 1;
    }
    double us[3], sus[3], dms[3];
    for (int k = 0; k < nforms; k++) us[k] = bench_median(back[k], reps), sus[k] = bench_median(step[k], reps), dms[k] = bench_median(dev_ms[k], reps);
    const char *shape = recsys ? "recsys" : large ? "large" : "gpt";
    if (sorts) {
        printf("%s: %s ids (%lld) into [%lld, %lld]: the backward (step - forward) radix %.0f us, network %.0f us, atomic %.0f us\n", fam, shape,
               (long long)n, (long long)V, (long long)C, us[0], us[1], us[2]);
        char dev_part[200] = "";
        if (dms[0] > 0)
            snprintf(dev_part, sizeof dev_part, " dev_ms_radix=%.3f dev_ms_network=%.3f dev_ms_atomic=%.3f dev_ratio=%.3f", dms[0], dms[1], dms[2],
                     dms[0] / dms[1]);
        printf("RESULT embedding_back_sorts device=%s V=%lld C=%lld n=%lld us_radix=%.0f us_network=%.0f us_atomic=%.0f ratio=%.3f%s\n", fam,
               (long long)V, (long long)C, (long long)n, us[0], us[1], us[2], us[0] / us[1], dev_part);
        for (int k = 0; k < nforms; k++) emb_close(&runs[k]), free(back[k]), free(step[k]), free(dev_ms[k]);
        free(ids), free(dy), free(local);
        pdde_context_free(ctx);
        return 0;
    }
    printf("%s: %s ids into [%lld, %lld]: the backward (step - forward) sorted %.0f us, atomic %.0f us; steps %.0f, %.0f us\n", fam,
           shape, (long long)V, (long long)C, us[0], us[1], sus[0], sus[1]);
    printf("RESULT embedding_back device=%s V=%lld C=%lld n=%lld us_sorted=%.0f us_atomic=%.0f ratio=%.3f step_us_sorted=%.0f step_us_atomic=%.0f\n",
           fam, (long long)V, (long long)C, (long long)n, us[0], us[1], us[0] / us[1], sus[0], sus[1]);
    for (int k = 0; k < nforms; k++) emb_close(&runs[k]), free(back[k]), free(step[k]), free(dev_ms[k]);
    free(ids), free(dy), free(local);
    pdde_context_free(ctx);
    return 0;
}
