/* bench_llmc — pdde's side of the comparison with llm.c's CPU trainer (tools/bench/bench_llmc.sh): the
 * GPT-2 of an llm.c model file, trained on llm.c token shards read in order as llm.c's data loader reads
 * them unshuffled (batch i: tokens [i B T, (i + 1) B T] of the file, targets one further), with llm.c's
 * update (AdamW, lr 1e-4, betas 0.9 and 0.999, eps 1e-8, no weight decay, no clipping).
 *   bench_llmc MODEL.bin TRAIN.bin VAL.bin [--batch 4] [--ctx 64] [--steps 5] [--val-batches 5] [--threads N]
 * Prints the mean loss of the first val-batches batches of VAL, then each step's loss and time, then
 * "PDDE val_loss=<> step_ms=<median> losses=<a,b,..>". */
#include "pdde.h"
#include "examples/gpt.h"
#include "examples/gpt_llmc.h"
#include "bench_common.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens [first, first + n) of an llm.c shard (GPT-2's: magic 20240520, u16 ids after 1 KiB) as int32 */
static int shard_tokens(const char *path, int64_t first, int64_t n, int32_t *out) {
    FILE *f = fopen(path, "rb");
    int32_t head[256];
    uint16_t *ids = malloc((size_t)n * sizeof *ids);
    int ok = f && ids && fread(head, 4, 256, f) == 256 && head[0] == 20240520 && head[1] == 1 && first + n <= head[2] &&
             !fseek(f, 1024 + (long)first * 2, SEEK_SET) && fread(ids, 2, (size_t)n, f) == (size_t)n;
    for (int64_t i = 0; ok && i < n; i++) out[i] = ids[i];
    if (f) fclose(f);
    free(ids);
    if (!ok) fprintf(stderr, "bench_llmc: %s: not a GPT-2 token shard with tokens %lld .. %lld\n", path, (long long)first, (long long)(first + n));
    return ok ? 0 : -1;
}

/* batch i of a shard: ids and targets, B T each */
static int shard_batch(const char *path, int B, int T, int i, int32_t *ids, int32_t *targets) {
    int32_t *w = malloc(((size_t)B * T + 1) * sizeof *w);
    int bad = !w || shard_tokens(path, (int64_t)i * B * T, (int64_t)B * T + 1, w);
    if (!bad) memcpy(ids, w, (size_t)B * T * 4), memcpy(targets, w + 1, (size_t)B * T * 4);
    free(w);
    return bad ? -1 : 0;
}

#define TRY(call)                                                                                          \
    do {                                                                                                   \
        if ((call) != PDDE_OK) { fprintf(stderr, "bench_llmc: %s: %s\n", #call, pdde_last_error(ctx)); return 1; } \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: bench_llmc MODEL.bin TRAIN.bin VAL.bin [--batch B] [--ctx T] [--steps N] [--val-batches N] [--threads N]\n"); return 2; }
    const char *model = argv[1], *train = argv[2], *val = argv[3];
    int B = 4, T = 64, steps = 5, val_batches = 5, threads = 0;
    for (int i = 4; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--batch")) B = v;
        else if (!strcmp(argv[i], "--ctx")) T = v;
        else if (!strcmp(argv[i], "--steps")) steps = v;
        else if (!strcmp(argv[i], "--val-batches")) val_batches = v;
        else if (!strcmp(argv[i], "--threads")) threads = v;
        else { fprintf(stderr, "bench_llmc: unknown flag %s\n", argv[i]); return 2; }
    }
    gpt_llmc_header h;
    char why[300];
    if (gpt_llmc_read_header(model, &h, why, sizeof why)) { fprintf(stderr, "bench_llmc: %s: %s\n", model, why); return 1; }
    gpt_config c = {.vocab = h.vocab, .ctx = T, .layers = h.layers, .heads = h.heads, .width = h.width, .batch = B};
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = threads;
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    gpt_model m;
    if (pdde_context_init(&cp, &ctx)) return 1;
    TRY(pdde_graph_init(ctx, &g));
    TRY(gpt_build(g, &c, &m));
    TRY(pdde_backward(g, m.loss));
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 1e-4f; /* (betas, eps: the defaults, llm.c's; no weight decay, no clipping) */
    TRY(pdde_optimizer_adamw(g, &op));
    TRY(pdde_session_init(g, NULL, &s));
    TRY(gpt_llmc_load(s, g, &c, model));
    int32_t *ids = malloc((size_t)B * T * 4), *targets = malloc((size_t)B * T * 4);
    double vsum = 0;
    for (int i = 0; i < val_batches; i++) {
        if (shard_batch(val, B, T, i, ids, targets)) return 1;
        TRY(pdde_session_write(s, m.ids, ids, (size_t)B * T * 4));
        TRY(pdde_session_write(s, m.targets, targets, (size_t)B * T * 4));
        TRY(pdde_session_run(s, PDDE_RUN_FORWARD));
        vsum += pdde_session_loss(s);
    }
    printf("val loss %f\n", vsum / val_batches);
    double *ms = malloc((size_t)steps * sizeof *ms);
    char losses[4096] = "";
    size_t len = 0;
    for (int step = 0; step < steps; step++) {
        if (shard_batch(train, B, T, step, ids, targets)) return 1;
        double t0 = bench_now();
        TRY(pdde_session_write(s, m.ids, ids, (size_t)B * T * 4));
        TRY(pdde_session_write(s, m.targets, targets, (size_t)B * T * 4));
        TRY(pdde_session_run(s, PDDE_RUN_STEP));
        ms[step] = 1e3 * (bench_now() - t0);
        printf("step %d: train loss %f (took %f ms)\n", step, pdde_session_loss(s), ms[step]);
        if (len < sizeof losses - 32) len += (size_t)snprintf(losses + len, sizeof losses - len, "%s%.6f", step ? "," : "", pdde_session_loss(s));
    }
    /* the first step pays for first touches of memory: the median of the rest */
    printf("PDDE val_loss=%.6f step_ms=%.1f losses=%s\n", vsum / val_batches, steps > 1 ? bench_median(ms + 1, steps - 1) : ms[0], losses);
    free(ids), free(targets), free(ms);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    return 0;
}
