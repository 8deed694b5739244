/* peer_llmc — llm.c's CPU GPT-2 trainer (train_gpt2.c of an llm.c checkout: bench_llmc.sh builds this
 * with -I<checkout>) run exactly as bench_llmc runs pdde: the model file, the shards read in order (its
 * own data loader, unshuffled), the mean loss of the first val-batches batches, then steps of forward,
 * backward and its AdamW (lr 1e-4, betas 0.9 and 0.999, eps 1e-8, no weight decay).
 *   peer_llmc MODEL.bin TRAIN.bin VAL.bin B T STEPS VAL_BATCHES
 * Prints "LLMC val_loss=<> step_ms=<median of the steps after the first> losses=<a,b,..>". */
#define TESTING
#include "train_gpt2.c"
#include "tools/bench/bench_common.h"

int main(int argc, char **argv) {
    if (argc != 8) { fprintf(stderr, "usage: peer_llmc MODEL.bin TRAIN.bin VAL.bin B T STEPS VAL_BATCHES\n"); return 2; }
    int B = atoi(argv[4]), T = atoi(argv[5]), steps = atoi(argv[6]), val_batches = atoi(argv[7]);
    GPT2 model;
    gpt2_build_from_checkpoint(&model, argv[1]);
    DataLoader train, val;
    dataloader_init(&train, argv[2], B, T, 0, 1, 0);
    dataloader_init(&val, argv[3], B, T, 0, 1, 0);
    double vsum = 0;
    for (int i = 0; i < val_batches; i++) {
        dataloader_next_batch(&val);
        gpt2_forward(&model, val.inputs, val.targets, B, T);
        vsum += model.mean_loss;
    }
    printf("val loss %f\n", vsum / val_batches);
    double *ms = malloc((size_t)steps * sizeof *ms);
    char losses[4096] = "";
    size_t len = 0;
    for (int step = 0; step < steps; step++) {
        dataloader_next_batch(&train);
        double t0 = bench_now();
        gpt2_forward(&model, train.inputs, train.targets, B, T);
        gpt2_zero_grad(&model);
        gpt2_backward(&model);
        gpt2_update(&model, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.0f, step + 1);
        ms[step] = 1e3 * (bench_now() - t0);
        printf("step %d: train loss %f (took %f ms)\n", step, model.mean_loss, ms[step]);
        if (len < sizeof losses - 32) len += (size_t)snprintf(losses + len, sizeof losses - len, "%s%.6f", step ? "," : "", model.mean_loss);
    }
    printf("LLMC val_loss=%.6f step_ms=%.1f losses=%s\n", vsum / val_batches, steps > 1 ? bench_median(ms + 1, steps - 1) : ms[0], losses);
    dataloader_free(&train), dataloader_free(&val);
    gpt2_free(&model);
    free(ms);
    return 0;
}
