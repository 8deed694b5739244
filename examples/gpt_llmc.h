/* gpt_llmc.h — Demonstrates how to read another trainer's weights into a pdde model and write them back:
 * GPT-2 in llm.c's model file (gpt2_124M.bin, gpt2_124M_bf16.bin) to and from gpt.h's model, so training
 * starts from OpenAI's GPT-2 as llm.c converts it and a model trained here goes back to llm.c.
 *
 * The file: a header of 256 int32 (magic 20240326; version 3: f32 values, 5: bf16; then max_seq_len,
 * vocab_size, num_layers, num_heads, channels, padded_vocab_size), then 16 tensors, each over all layers:
 *   wte [Vp, C]  wpe [maxT, C]  ln1w, ln1b [L, C]  qkvw [L, 3C, C]  qkvb [L, 3C]  attprojw [L, C, C]
 *   attprojb [L, C]  ln2w, ln2b [L, C]  fcw [L, 4C, C]  fcb [L, 4C]  fcprojw [L, C, 4C]  fcprojb [L, C]
 *   lnfw, lnfb [C]
 * Linear weights are [out, in] (PyTorch's nn.Linear), gpt.h's are [in, out]; qkv rows are [3, H, D] (q of
 * every head, then k, then v), gpt.h's fused columns head-major [H, 3, D]. The rows of wte past
 * vocab_size are padding (zeros): gpt.h's vocabulary is vocab_size, as their zero logits would take
 * probability from every real token. */
#ifndef PDDE_GPT_LLMC_H
#define PDDE_GPT_LLMC_H
#include "pdde.h"
#include "gpt.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GPT_LLMC_MAGIC 20240326

typedef struct {
    int version; /* 3: f32 values, 5: bf16 */
    int max_ctx, vocab, layers, heads, width, padded_vocab;
} gpt_llmc_header;

/* The 16 tensors in file order: elements a layer (or whole, for the 4 without layers) */
static inline void gpt_llmc_sizes(const gpt_llmc_header *h, int64_t n[16]) {
    int64_t C = h->width;
    const int64_t per[16] = {(int64_t)h->padded_vocab * C, (int64_t)h->max_ctx * C, C, C, 3 * C * C, 3 * C, C * C, C, C, C,
                             4 * C * C, 4 * C, 4 * C * C, C, C, C};
    memcpy(n, per, sizeof per);
}

static inline int gpt_llmc_layered(int k) { return k >= 2 && k < 14; }

/* Reads and checks the header of `path`; 0, or -1 with why[] naming the field and what was expected */
static inline int gpt_llmc_read_header(const char *path, gpt_llmc_header *h, char *why, size_t why_size) {
    int32_t head[256];
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(why, why_size, "%s", strerror(errno)), -1;
    size_t got = fread(head, sizeof *head, 256, f);
    long size = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
    fclose(f);
    if (got != 256) return snprintf(why, why_size, "%zu bytes: shorter than llm.c's 1 KiB header", got * sizeof *head), -1;
    if (head[0] != GPT_LLMC_MAGIC)
        return snprintf(why, why_size, "header[0] = %d: not llm.c's GPT-2 model file (magic %d; a token shard is read by --data)", head[0], GPT_LLMC_MAGIC), -1;
    if (head[1] != 3 && head[1] != 5)
        return snprintf(why, why_size, "header[1] = %d: version 3 (f32) or 5 (bf16) expected", head[1]), -1;
    *h = (gpt_llmc_header){.version = head[1], .max_ctx = head[2], .vocab = head[3], .layers = head[4], .heads = head[5], .width = head[6],
                           .padded_vocab = head[7]};
    static const char *const field[] = {"max_seq_len", "vocab_size", "num_layers", "num_heads", "channels"};
    const int v[] = {h->max_ctx, h->vocab, h->layers, h->heads, h->width}, most[] = {1 << 24, 1 << 24, 4096, 1 << 16, 1 << 16};
    for (int k = 0; k < 5; k++) /* (bounds that keep the sizes below in int64) */
        if (v[k] < 1 || v[k] > most[k]) return snprintf(why, why_size, "header[%d] %s = %d: 1 .. %d expected", k + 2, field[k], v[k], most[k]), -1;
    if (h->width % h->heads) return snprintf(why, why_size, "header[6] channels = %d is not divisible by header[5] num_heads = %d", h->width, h->heads), -1;
    if (h->padded_vocab < h->vocab || h->padded_vocab > 1 << 24)
        return snprintf(why, why_size, "header[7] padded_vocab_size = %d: vocab_size %d .. 2^24 expected", h->padded_vocab, h->vocab), -1;
    int64_t n[16], want = 0;
    gpt_llmc_sizes(h, n);
    for (int k = 0; k < 16; k++) want += n[k] * (gpt_llmc_layered(k) ? h->layers : 1);
    want = 1024 + want * (h->version == 3 ? 4 : 2);
    if ((int64_t)size != want)
        return snprintf(why, why_size, "%lld bytes, but its header's sizes (%d layers, %d heads, width %d, vocab %d padded to %d, context %d, %s) "
                        "make %lld", (long long)size, h->layers, h->heads, h->width, h->vocab, h->padded_vocab, h->max_ctx,
                        h->version == 3 ? "f32" : "bf16", (long long)want), -1;
    return 0;
}

/* Whether model c can take the file's weights: 0, or -1 with why[] naming gpt's flag, its value and the file's */
static inline int gpt_llmc_fits(const gpt_llmc_header *h, const gpt_config *c, char *why, size_t why_size) {
    if (c->arch != GPT_ARCH_GPT || c->moe_experts > 1)
        return snprintf(why, why_size, "llm.c's file holds a dense GPT-2: not --arch llama or --moe-experts"), -1;
    static const char *const flag[] = {"--layers", "--heads", "--width", "--vocab"};
    const int mine[] = {c->layers, c->heads, c->width, c->vocab}, file[] = {h->layers, h->heads, h->width, h->vocab};
    for (int k = 0; k < 4; k++)
        if (mine[k] != file[k]) return snprintf(why, why_size, "%s %d, but the file's model has %d", flag[k], mine[k], file[k]), -1;
    if (gpt_ffn(c) != 4 * (int64_t)c->width) return snprintf(why, why_size, "an MLP of %lld units, the file's has 4 x width", (long long)gpt_ffn(c)), -1;
    if (c->ctx > h->max_ctx) return snprintf(why, why_size, "--ctx %d, but the file's positions stop at %d", c->ctx, h->max_ctx), -1;
    return 0;
}

/* gpt.h's name of file tensor k (%d: the layer), and how its values are laid out there */
enum { GPT_LLMC_SAME, GPT_LLMC_TRANSPOSE, GPT_LLMC_QKV_W, GPT_LLMC_QKV_B };
static const struct { const char *name; int how; } gpt_llmc_map[16] = {
    {"wte", GPT_LLMC_SAME}, {"wpe", GPT_LLMC_SAME}, {"h%d.ln1.g", GPT_LLMC_SAME}, {"h%d.ln1.b", GPT_LLMC_SAME},
    {"h%d.attn.w", GPT_LLMC_QKV_W}, {"h%d.attn.b", GPT_LLMC_QKV_B}, {"h%d.proj.w", GPT_LLMC_TRANSPOSE}, {"h%d.proj.b", GPT_LLMC_SAME},
    {"h%d.ln2.g", GPT_LLMC_SAME}, {"h%d.ln2.b", GPT_LLMC_SAME}, {"h%d.fc.w", GPT_LLMC_TRANSPOSE}, {"h%d.fc.b", GPT_LLMC_SAME},
    {"h%d.fcproj.w", GPT_LLMC_TRANSPOSE}, {"h%d.fcproj.b", GPT_LLMC_SAME}, {"lnf.g", GPT_LLMC_SAME}, {"lnf.b", GPT_LLMC_SAME}};

/* One tensor between the file's layout (file) and gpt.h's (mine) of t's shape: to_file 0 reads file into
 * mine, 1 writes mine into file. Linear weights transpose ([out, in] there); qkv's column (h, part, d)
 * here is row part C + h D + d there. */
static inline void gpt_llmc_relayout(int how, const pdde_tensor *t, int64_t heads, int to_file, float *file, float *mine) {
    int64_t rows = t->shape[0], cols = t->ndim > 1 ? t->shape[1] : 1, n = rows * cols;
    if (how == GPT_LLMC_SAME) {
        if (to_file) memcpy(file, mine, (size_t)n * sizeof *file);
        else memcpy(mine, file, (size_t)n * sizeof *file);
        return;
    }
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            int64_t there = j * rows + i; /* TRANSPOSE: file [cols][rows] */
            if (how != GPT_LLMC_TRANSPOSE) { /* QKV: mine [C][3C] (or [3C]): column j = (h, part, d) */
                int64_t C = (how == GPT_LLMC_QKV_W ? cols : rows) / 3, D = C / heads, col = how == GPT_LLMC_QKV_W ? j : i;
                int64_t h = col / (3 * D), part = col / D % 3, d = col % D, row = part * C + h * D + d;
                there = how == GPT_LLMC_QKV_W ? row * C + i : row;
            }
            if (to_file) file[there] = mine[i * cols + j];
            else mine[i * cols + j] = file[there];
        }
}

/* Elements [at, at + count) of layer l of the file's tensor k, as f32, into dst (long is 64-bit on the
 * platforms pdde builds for: files past 2 GiB seek) */
static inline int gpt_llmc_fread(FILE *f, const gpt_llmc_header *h, const int64_t n[16], int k, int l, int64_t at, int64_t count, float *dst) {
    int64_t off = 0, es = h->version == 3 ? 4 : 2;
    for (int j = 0; j < k; j++) off += n[j] * (gpt_llmc_layered(j) ? h->layers : 1);
    off = 1024 + (off + (int64_t)l * n[k] + at) * es;
    uint16_t *half = (uint16_t *)(dst + count) - count; /* bf16: read into the upper half, widen from the front */
    if (fseek(f, (long)off, SEEK_SET) || fread(es == 4 ? (void *)dst : (void *)half, (size_t)es, (size_t)count, f) != (size_t)count) return -1;
    if (es == 2)
        for (int64_t i = 0; i < count; i++) dst[i] = pdde_bf16_to_f32(half[i]);
    return 0;
}

/* Writes the file's weights into the parameters of model m (built by gpt_build with c, which
 * gpt_llmc_fits) in session s: every rank writes the blocks it holds. */
static inline pdde_status gpt_llmc_load(pdde_session *s, pdde_graph *g, const gpt_config *c, const char *path) {
    pdde_context *ctx = pdde_graph_context(g);
    gpt_llmc_header h;
    char why[300];
    if (gpt_llmc_read_header(path, &h, why, sizeof why) || gpt_llmc_fits(&h, c, why, sizeof why))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: %s", path, why);
    int64_t n[16], big = 0;
    gpt_llmc_sizes(&h, n);
    for (int k = 0; k < 16; k++) big = n[k] > big ? n[k] : big;
    FILE *f = fopen(path, "rb");
    float *raw = malloc((size_t)big * sizeof *raw), *mine = malloc((size_t)big * sizeof *mine);
    pdde_status st = !f ? pdde_error(ctx, PDDE_ERR_IO, "%s: %s", path, strerror(errno)) : !raw || !mine ? PDDE_ERR_OOM : PDDE_OK;
    for (int k = 0; k < 16 && !st; k++) {
        for (int l = 0; l < (gpt_llmc_layered(k) ? c->layers : 1) && !st; l++) {
            char name[64];
            snprintf(name, sizeof name, gpt_llmc_map[k].name, l);
            pdde_tensor *t = pdde_graph_find(g, name);
            if (!t) { st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: the model has no parameter %s", path, name); break; }
            int64_t count = pdde_tensor_numel(t); /* (wte: vocab rows of the padded ones; wpe: ctx rows of max_seq_len) */
            if (gpt_llmc_fread(f, &h, n, k, l, 0, count, raw)) {
                st = pdde_error(ctx, PDDE_ERR_IO, "%s: reading %s: %s", path, name, ferror(f) ? strerror(errno) : "the file ended");
                break;
            }
            gpt_llmc_relayout(gpt_llmc_map[k].how, t, c->heads, 0, raw, mine);
            st = pdde_session_write_global(s, t, mine, (size_t)count * sizeof *mine);
        }
    }
    if (f) fclose(f);
    free(raw), free(mine);
    return st;
}

/* Writes model m's parameters (gpt_build with c, GPT) from session s as an llm.c model file, version 3
 * (f32): vocab_size = c->vocab, padded to a multiple of 128 with zero rows as llm.c pads; max_seq_len =
 * c->ctx. The calling rank must hold every parameter whole (one process, or data parallel without
 * ZeRO-3); written to path.tmp, then renamed. */
static inline pdde_status gpt_llmc_save(pdde_session *s, pdde_graph *g, const gpt_config *c, const char *path) {
    pdde_context *ctx = pdde_graph_context(g);
    if (c->arch != GPT_ARCH_GPT || c->moe_experts > 1 || gpt_ffn(c) != 4 * (int64_t)c->width || c->untied_head || gpt_norm_eps(c) != 1e-5f ||
        gpt_window(c))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: llm.c's file holds a dense GPT-2 (no --arch llama, --moe-experts, --ffn, --untied-head, "
                          "--norm-eps or --window)", path);
    gpt_llmc_header h = {.version = 3, .max_ctx = c->ctx, .vocab = c->vocab, .layers = c->layers, .heads = c->heads, .width = c->width,
                         .padded_vocab = (c->vocab + 127) / 128 * 128};
    int32_t head[256] = {GPT_LLMC_MAGIC, 3, h.max_ctx, h.vocab, h.layers, h.heads, h.width, h.padded_vocab};
    int64_t n[16], big = 0;
    gpt_llmc_sizes(&h, n);
    for (int k = 0; k < 16; k++) big = n[k] > big ? n[k] : big;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    float *file = calloc((size_t)big, sizeof *file), *mine /* (wte, written first, leaves its padding rows zero) */ = malloc((size_t)big * sizeof *mine);
    pdde_status st = !f ? pdde_error(ctx, PDDE_ERR_IO, "%s: %s", tmp, strerror(errno)) : !file || !mine ? PDDE_ERR_OOM : PDDE_OK;
    if (!st && fwrite(head, sizeof head, 1, f) != 1) st = pdde_error(ctx, PDDE_ERR_IO, "%s: writing the header: %s", tmp, strerror(errno));
    char name[64];
    if (!st && gpt_partial(s, g, name, sizeof name))
        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: this rank holds a part of parameter %s, or none: save from a rank that holds every "
                        "parameter whole (one process: a checkpoint loads under any plan)", path, name);
    for (int k = 0; k < 16 && !st; k++) {
        for (int l = 0; l < (gpt_llmc_layered(k) ? c->layers : 1) && !st; l++) {
            snprintf(name, sizeof name, gpt_llmc_map[k].name, l);
            pdde_tensor *t = pdde_graph_find(g, name);
            st = gpt_read_weight(s, g, c, t, mine); /* (under LoRA: merged) */
            if (st) break;
            gpt_llmc_relayout(gpt_llmc_map[k].how, t, c->heads, 1, file, mine);
            if (fwrite(file, sizeof *file, (size_t)n[k], f) != (size_t)n[k]) st = pdde_error(ctx, PDDE_ERR_IO, "%s: writing %s: %s", tmp, name, strerror(errno));
        }
    }
    if (f && fclose(f) && !st) st = pdde_error(ctx, PDDE_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path)) st = pdde_error(ctx, PDDE_ERR_IO, "%s: %s", path, strerror(errno));
    if (st && f) remove(tmp);
    free(file), free(mine);
    return st;
}

#endif
