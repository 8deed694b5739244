/* bench_gpt — one training step (forward, backward, AdamW) of a GPT in pdde: median step time and
 * peak memory. tools/bench/bench_gpt.sh runs it next to PyTorch on the same shapes.
 *   bench_gpt --vocab V --layers L --heads H --width C --ctx T --batch B --steps N --warmup W --threads P
 *             [--clip X] [--backend NAME] [--separate-qkv 1] [--arch gpt|llama] [--kv-heads N] [--doc-every N] [--window W]
 * Prints: PDDE tokens_per_s=<> step_ms=<> cpu_ms=<> peak_mb=<> (cpu_ms: the CPU time of the process per
 * step, all threads, median; on a machine shared with other work it moves much less than step_ms does;
 * peak_mb: peak RSS growth from before the model is built). --backend opencl runs the whole step on that
 * backend's first device (PoCL here) and adds host_syncs=<the host's waits for the device per step>;
 * --clip sets AdamW's clip_norm (default 0: none); --separate-qkv 1 slices and permutes q, k, v around the
 * attention (gpt_config.separate_qkv) instead of the packed form, to compare the two; --arch llama
 * builds the LLaMA-style model (examples/gpt.h), --kv-heads its key/value heads; --doc-every N packs documents of N
 * tokens (id 0 starts each) kept apart by cfg.doc_mask (pdde_attention_docs); --window W attends in windows of W. */
#include "pdde.h"
#include "examples/gpt.h"
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include "bench_common.h"

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double max_rss_mb(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss / 1024.0;
}

int main(int argc, char **argv) {
    gpt_config c = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8};
    int steps = 20, warmup = 3, threads = 0, doc_every = 0;
    float clip = 0;
    const char *backend = "cpu";
    pdde_dtype dtype = PDDE_F32;
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--dtype")) { /* the matmuls' compute dtype (mixed precision) */
            dtype = !strcmp(argv[i + 1], "bf16") ? PDDE_BF16 : !strcmp(argv[i + 1], "f16") ? PDDE_F16 : PDDE_F32;
            if (dtype == PDDE_F32 && strcmp(argv[i + 1], "f32")) { fprintf(stderr, "bench_gpt: --dtype f32|bf16|f16\n"); return 2; }
        }
        else if (!strcmp(argv[i], "--backend")) backend = argv[i + 1];
        else if (!strcmp(argv[i], "--clip")) clip = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--separate-qkv")) c.separate_qkv = v;
        else if (!strcmp(argv[i], "--arch")) {
            if (strcmp(argv[i + 1], "gpt") && strcmp(argv[i + 1], "llama")) { fprintf(stderr, "bench_gpt: --arch gpt|llama\n"); return 2; }
            c.arch = strcmp(argv[i + 1], "llama") ? GPT_ARCH_GPT : GPT_ARCH_LLAMA;
        }
        else if (!strcmp(argv[i], "--kv-heads")) c.kv_heads = v;
        else if (!strcmp(argv[i], "--doc-every")) doc_every = v, c.doc_mask = v > 0, c.doc_token = 0;
        else if (!strcmp(argv[i], "--window")) c.window = v;
        else if (!strcmp(argv[i], "--vocab")) c.vocab = v;
        else if (!strcmp(argv[i], "--layers")) c.layers = v;
        else if (!strcmp(argv[i], "--heads")) c.heads = v;
        else if (!strcmp(argv[i], "--width")) c.width = v;
        else if (!strcmp(argv[i], "--ctx")) c.ctx = v;
        else if (!strcmp(argv[i], "--batch")) c.batch = v;
        else if (!strcmp(argv[i], "--steps")) steps = v;
        else if (!strcmp(argv[i], "--warmup")) warmup = v;
        else if (!strcmp(argv[i], "--threads")) threads = v;
        else { fprintf(stderr, "bench_gpt: unknown flag %s\n", argv[i]); return 2; }
    }
    double rss0 = max_rss_mb();
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = threads;
    /* a CPU benchmark: no device runtime in the process (its memory would count) */
    char backends[64];
    snprintf(backends, sizeof backends, strcmp(backend, "cpu") ? "cpu,%s" : "%s", backend);
    cp.backends = backends;
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    gpt_model m;
    pdde_context_init(&cp, &ctx);
    pdde_graph_init(ctx, &g);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.weight_decay = 0.1f, op.clip_norm = clip;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = -1;
    for (int d = 0; d < pdde_device_count(ctx) && sp.device < 0; d++) {
        pdde_device_props p;
        if (pdde_device_get_props(ctx, d, &p) == PDDE_OK && !strcmp(p.backend, backend)) sp.device = d;
    }
    if (sp.device < 0) { fprintf(stderr, "bench_gpt: --backend %s: no device of that backend (see build/pdde-info)\n", backend); return 1; }
    if (pdde_graph_set_compute_dtype(g, dtype) || gpt_build(g, &c, &m) || pdde_backward(g, m.loss) || pdde_optimizer_adamw(g, &op) || pdde_session_init(g, &sp, &s)) {
        fprintf(stderr, "bench_gpt: %s\n", pdde_last_error(ctx));
        return 1;
    }
    size_t bt = (size_t)c.batch * c.ctx;
    int32_t *x = malloc(bt * 4), *y = malloc(bt * 4);
    double *times = malloc((size_t)steps * sizeof *times), *cpu = malloc((size_t)steps * sizeof *cpu);
    int64_t syncs = 0;
    for (int i = 0; i < warmup + steps; i++) {
        for (size_t k = 0; k < bt; k++) x[k] = (int32_t)((k * 31 + (size_t)i * 7) % (size_t)c.vocab), y[k] = (int32_t)((k * 17 + (size_t)i) % (size_t)c.vocab);
        for (size_t k = 0; k < bt && doc_every; k++) x[k] = k % (size_t)c.ctx % (size_t)doc_every ? x[k] % (c.vocab - 1) + 1 : 0; /* (0: a start) */
        gpt_write_micro(s, &m, 0, x, y, (size_t)c.batch);
        double t = bench_now(), c = cpu_s();
        int64_t syncs0 = pdde_session_host_syncs(s);
        if (pdde_session_run(s, PDDE_RUN_STEP)) { fprintf(stderr, "bench_gpt: %s\n", pdde_last_error(ctx)); return 1; }
        if (i >= warmup) times[i - warmup] = bench_now() - t, cpu[i - warmup] = cpu_s() - c, syncs += pdde_session_host_syncs(s) - syncs0;
    }
    qsort(times, (size_t)steps, sizeof *times, bench_cmp);
    qsort(cpu, (size_t)steps, sizeof *cpu, bench_cmp);
    double med = times[steps / 2];
    printf("PDDE tokens_per_s=%.1f step_ms=%.2f cpu_ms=%.2f peak_mb=%.1f loss=%.4f", (double)bt / med, med * 1e3,
           cpu[steps / 2] * 1e3, max_rss_mb() - rss0, pdde_session_loss(s));
    if (strcmp(backend, "cpu")) printf(" host_syncs=%.2f", (double)syncs / steps);
    printf("\n");
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    free(x), free(y), free(times), free(cpu);
    return 0;
}
