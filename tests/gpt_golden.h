/* gpt_golden.h — reads a fixture of tools/gen_golden.py (tests/data/gpt_golden*.bin: a PyTorch run of
 * the small GPT or LLaMA-style model, format in that script) and builds the same model in pdde with the fixture's initial
 * parameters and batch. Shared by test_gpt_golden (f32) and test_amp (bf16 autocast). */
#ifndef PDDE_GPT_GOLDEN_H
#define PDDE_GPT_GOLDEN_H
#include "pdde.h"
#include "examples/gpt.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { char name[64]; int64_t n; float *data; } golden_record;

typedef struct {
    gpt_config cfg;
    int n_steps, BT;
    float lr, wd;
    int32_t *ids, *targets;
    uint32_t n_params;
    golden_record *init, *grads, *final;
    float *logits, loss, losses[64];
} golden_fixture;

typedef struct { const unsigned char *p, *end; } golden_reader;

static int golden_rd(golden_reader *r, void *dst, size_t n) {
    if ((size_t)(r->end - r->p) < n) return 0;
    memcpy(dst, r->p, n), r->p += n;
    return 1;
}

static int golden_records(golden_reader *r, golden_record *recs, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        uint16_t len;
        uint32_t ndim, dim;
        if (!golden_rd(r, &len, 2) || len >= 64 || !golden_rd(r, recs[i].name, len)) return 0;
        recs[i].name[len] = 0;
        if (!golden_rd(r, &ndim, 4)) return 0;
        recs[i].n = 1;
        for (uint32_t d = 0; d < ndim; d++) { if (!golden_rd(r, &dim, 4)) return 0; recs[i].n *= dim; }
        recs[i].data = malloc((size_t)recs[i].n * 4);
        if (!golden_rd(r, recs[i].data, (size_t)recs[i].n * 4)) return 0;
    }
    return 1;
}

static void golden_free(golden_fixture *fx) {
    for (uint32_t i = 0; i < fx->n_params; i++) {
        if (fx->init) free(fx->init[i].data);
        if (fx->grads) free(fx->grads[i].data);
        if (fx->final) free(fx->final[i].data);
    }
    free(fx->init), free(fx->grads), free(fx->final), free(fx->ids), free(fx->targets), free(fx->logits);
    memset(fx, 0, sizeof *fx);
}

/* 1 when the whole fixture was read; else 0 with *why set. */
static int golden_load(const char *path, golden_fixture *fx, const char **why) {
    memset(fx, 0, sizeof *fx);
    static unsigned char buf[1 << 21];
    FILE *f = fopen(path, "rb");
    if (!f) { *why = "cannot open it"; return 0; }
    size_t size = fread(buf, 1, sizeof buf, f);
    fclose(f);
    golden_reader r = {buf, buf + size};
    char magic[8];
    uint32_t version = 0;
    int32_t hdr[7];
    int32_t arch[4] = {0, 0, 0, 0}; /* version 2: arch, kv_heads, rope_base (f32), ffn */
    if (!golden_rd(&r, magic, 8) || memcmp(magic, "PDDEGOLD", 8) != 0 || !golden_rd(&r, &version, 4) || version < 1 || version > 2 ||
        !golden_rd(&r, hdr, 6 * 4) || (version == 2 && !golden_rd(&r, arch, sizeof arch)) || !golden_rd(&r, &hdr[6], 4) ||
        !golden_rd(&r, &fx->lr, 4) || !golden_rd(&r, &fx->wd, 4) || hdr[6] > 64 || hdr[6] < 1 || arch[0] < 0 || arch[0] > 1) {
        *why = "bad header";
        return 0;
    }
    float rope_base;
    memcpy(&rope_base, &arch[2], 4);
    fx->cfg = (gpt_config){.vocab = hdr[0], .ctx = hdr[1], .layers = hdr[2], .heads = hdr[3], .width = hdr[4], .batch = hdr[5],
                           .arch = (gpt_arch)arch[0], .kv_heads = arch[1], .rope_base = rope_base, .ffn = arch[3]};
    fx->n_steps = hdr[6], fx->BT = fx->cfg.batch * fx->cfg.ctx;
    fx->ids = malloc((size_t)fx->BT * 4), fx->targets = malloc((size_t)fx->BT * 4);
    fx->logits = malloc((size_t)fx->BT * fx->cfg.vocab * 4);
    int ok = golden_rd(&r, fx->ids, (size_t)fx->BT * 4) && golden_rd(&r, fx->targets, (size_t)fx->BT * 4) &&
             golden_rd(&r, &fx->n_params, 4) && fx->n_params < 4096;
    if (ok) {
        fx->init = calloc(fx->n_params, sizeof *fx->init), fx->grads = calloc(fx->n_params, sizeof *fx->grads);
        fx->final = calloc(fx->n_params, sizeof *fx->final);
        ok = golden_records(&r, fx->init, fx->n_params) && golden_rd(&r, fx->logits, (size_t)fx->BT * fx->cfg.vocab * 4) &&
             golden_rd(&r, &fx->loss, 4) && golden_records(&r, fx->grads, fx->n_params) &&
             golden_rd(&r, fx->losses, (size_t)fx->n_steps * 4) && golden_records(&r, fx->final, fx->n_params);
    }
    if (!ok) *why = "truncated";
    return ok;
}

/* max |a-b| / (max|b| + 1e-8) over a tensor: a scale-aware error that tiny gradients do not inflate */
static double golden_rel_err(const float *a, const float *b, int64_t n) {
    double maxdiff = 0, maxref = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= maxdiff)) maxdiff = d; /* NaN counts as huge */
        if (fabs(b[i]) > maxref) maxref = fabs(b[i]);
    }
    return maxdiff / (maxref + 1e-8);
}

/* The fixture's model in g under compute dtype dt (with backward and its AdamW), compiled into *s with
 * the initial parameters and the batch written. PDDE_OK or the first error. */
static pdde_status golden_session(pdde_context *ctx, const golden_fixture *fx, pdde_dtype dt, pdde_graph **g, gpt_model *m,
                                  pdde_session **s) {
    gpt_config cfg = fx->cfg;
    pdde_status st = pdde_graph_init(ctx, g);
    if (!st) st = pdde_graph_set_compute_dtype(*g, dt);
    if (!st) st = gpt_build(*g, &cfg, m);
    if (!st) pdde_mark_output(m->logits), st = pdde_backward(*g, m->loss);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = fx->lr, op.weight_decay = fx->wd;
    if (!st) st = pdde_optimizer_adamw(*g, &op);
    if (!st) st = pdde_session_init(*g, NULL, s);
    for (uint32_t i = 0; !st && i < fx->n_params; i++) {
        pdde_tensor *t = pdde_graph_find(*g, fx->init[i].name);
        st = t && pdde_tensor_numel(t) == fx->init[i].n ? pdde_session_write(*s, t, fx->init[i].data, (size_t)fx->init[i].n * 4)
                                                       : pdde_error(ctx, PDDE_ERR_MISMATCH, "parameter %s missing or of another size", fx->init[i].name);
    }
    if (!st) st = pdde_session_write(*s, m->ids, fx->ids, (size_t)fx->BT * 4);
    if (!st) st = pdde_session_write(*s, m->targets, fx->targets, (size_t)fx->BT * 4);
    return st;
}
#endif
