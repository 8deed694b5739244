/* test_gpt_golden — pdde's GPT and LLaMA-style model against PyTorch (llm.c style). tools/gen_golden.py
 * wrote tests/data/gpt_golden.bin and gpt_golden_llama.bin (RMSNorm, SwiGLU, RoPE, grouped-query
 * attention) with torch: fixed weights and batch, the logits, the loss, every parameter gradient, the
 * losses of 10 AdamW steps and the parameters after them. Tolerances below are stated per quantity;
 * float32 reassociation alone moves results by ~1e-6 relative. With a path: that fixture only.
 * tools/gen_llmc_golden.py wrote tests/data/gpt2_llmc*.bin: a GPT-2 in llm.c's model file (f32 and bf16)
 * and PyTorch's logits and loss on it, computed in llm.c's layout: examples/gpt_llmc.h reads it into
 * pdde's model and writes it back. */
#include "tests/gpt_golden.h"
#include "tests/test_util.h"
#include "examples/gpt_llmc.h"
#include <stdlib.h>
#include <string.h>

/* Tolerances: about 10x the worst measured (OpenBLAS and the portable GEMM builds; printed each run) */
typedef struct { double logits, loss, grad, param; } golden_tolerances;
static const golden_tolerances gpt_tol = {
    .logits = 2e-6,  /* measured 1.7e-7 */
    .loss = 1.5e-6,  /* measured 1.2e-7 */
    .grad = 7e-6,    /* measured 6.5e-7 */
    .param = 1e-4,   /* measured 5.9e-5 (AdamW divides by small second moments) */
};
static const golden_tolerances llama_tol = {
    .logits = 2e-6,  /* measured 1.5e-7, 2.2e-7 in the portable build */
    .loss = 1.5e-6,  /* measured 1.2e-7 */
    .grad = 7e-6,    /* measured 6.0e-7 */
    .param = 4e-4,   /* measured 4.2e-5 */
};

static void check_fixture(const char *path) {
    const char *why = "";
    golden_fixture fx;
    int ok = golden_load(path, &fx, &why);
    CHECK(ok, "fixture %s: %s", path, why);
    if (!ok) return;
    printf("%s: %s\n", path, gpt_arch_name(fx.cfg.arch));
    const golden_tolerances *tol = fx.cfg.arch == GPT_ARCH_LLAMA ? &llama_tol : &gpt_tol;
    const double TOL_LOGITS = tol->logits, TOL_LOSS = tol->loss, TOL_GRAD = tol->grad, TOL_PARAM = tol->param;
    gpt_config cfg = fx.cfg;
    int n_steps = fx.n_steps, BT = fx.BT;
    uint32_t n_params = fx.n_params;
    const golden_record *grads = fx.grads, *final = fx.final;
    const float *logits_ref = fx.logits, *losses_ref = fx.losses;
    float loss_ref = fx.loss;

    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    gpt_model m = {0};
    CHECK(pdde_context_init(NULL, &ctx) == PDDE_OK, "context");
    CHECK(golden_session(ctx, &fx, PDDE_F32, &g, &m, &s) == PDDE_OK, "model: %s", pdde_last_error(ctx));
    if (test_failed) return;

    /* step 0 in two halves, to look at the gradients before the update */
    CHECK(pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD) == PDDE_OK, "run: %s", pdde_last_error(ctx));
    float *logits = malloc((size_t)BT * cfg.vocab * 4);
    pdde_session_read(s, m.logits, logits, (size_t)BT * cfg.vocab * 4);
    double e = golden_rel_err(logits, logits_ref, (int64_t)BT * cfg.vocab);
    CHECK(e < TOL_LOGITS, "logits differ: rel err %.3g (tolerance %.3g)", e, TOL_LOGITS);
    printf("logits: rel err %.2g (tolerance %.2g)\n", e, TOL_LOGITS);
    float loss0 = pdde_session_loss(s);
    double worst_loss = test_close_all("step 0 loss", &loss0, &loss_ref, 1, 0, TOL_LOSS);
    double worst = 0;
    for (uint32_t i = 0; i < n_params; i++) {
        pdde_tensor *t = pdde_graph_find(g, grads[i].name);
        float *gbuf = malloc((size_t)grads[i].n * 4);
        pdde_session_read(s, t->grad, gbuf, (size_t)grads[i].n * 4);
        e = golden_rel_err(gbuf, grads[i].data, grads[i].n);
        CHECK(e < TOL_GRAD, "gradient of %s: rel err %.3g (tolerance %.3g)", grads[i].name, e, TOL_GRAD);
        worst = !(e <= worst) ? e : worst;
        free(gbuf);
    }
    printf("loss %.6f (torch %.6f), worst gradient rel err %.2g (tolerance %.2g)\n", pdde_session_loss(s), loss_ref, worst, TOL_GRAD);
    CHECK(pdde_session_run(s, PDDE_RUN_OPTIMIZER) == PDDE_OK, "optimizer run");
    for (int step = 1; step < n_steps; step++) {
        CHECK(pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK, "step %d", step);
        float l = pdde_session_loss(s);
        char what[32];
        snprintf(what, sizeof what, "step %d loss", step);
        double el = test_close_all(what, &l, &losses_ref[step], 1, 0, TOL_LOSS);
        worst_loss = !(el <= worst_loss) ? el : worst_loss;
        printf("step %d loss %.6f torch %.6f\n", step, l, losses_ref[step]);
    }
    worst = 0;
    for (uint32_t i = 0; i < n_params; i++) {
        pdde_tensor *t = pdde_graph_find(g, final[i].name);
        float *pbuf = malloc((size_t)final[i].n * 4);
        pdde_session_read(s, t, pbuf, (size_t)final[i].n * 4);
        e = golden_rel_err(pbuf, final[i].data, final[i].n);
        CHECK(e < TOL_PARAM, "parameter %s after %d steps: rel err %.3g (tolerance %.3g)", final[i].name, n_steps, e, TOL_PARAM);
        worst = !(e <= worst) ? e : worst;
        free(pbuf);
    }
    printf("losses: worst rel err %.2g (tolerance %.2g)\n", worst_loss, TOL_LOSS);
    printf("parameters after %d AdamW steps: worst rel err %.2g (tolerance %.2g)\n", n_steps, worst, TOL_PARAM);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    golden_free(&fx);
    free(logits);
}

/* gpt_n_params (the MFU's and the planner's count) against the parameters a session of the model holds; under LoRA
 * gpt_n_lora_params (the pretrained weights are then frozen inputs, not parameters) */
static void check_n_params(const char *what, const gpt_config *cfg) {
    pdde_context *ctx;
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    gpt_model m;
    pdde_memory_stats ms = {0};
    pdde_status st = pdde_context_init(NULL, &ctx);
    if (!st) st = pdde_graph_init(ctx, &g);
    if (!st) st = gpt_build(g, cfg, &m);
    if (!st) st = pdde_session_init(g, NULL, &s);
    if (!st) pdde_session_memory(s, &ms);
    int64_t want = cfg->lora_rank > 0 ? gpt_n_lora_params(cfg) : gpt_n_params(cfg);
    CHECK(!st && ms.param_bytes == (size_t)want * 4, "%s: gpt_n_params (or gpt_n_lora_params) %lld, the session holds %zu bytes of parameters (%s)",
          what, (long long)want, ms.param_bytes, st ? pdde_last_error(ctx) : "");
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
}

/* A session of model c (forward, its logits kept) in *s, *g; the parameters of `from` (a session of the same
 * parameters) copied in by name where given. 0, or the failure's status */
static pdde_status doc_session(pdde_context *ctx, const gpt_config *c, pdde_session *from, pdde_graph *from_g, pdde_graph **g, gpt_model *m,
                               pdde_session **s) {
    pdde_status st = pdde_graph_init(ctx, g);
    if (!st) st = gpt_build(*g, c, m);
    if (!st) pdde_mark_output(m->logits), st = pdde_session_init(*g, NULL, s);
    for (int i = 0; from && !st && i < pdde_graph_tensor_count(from_g); i++) {
        pdde_tensor *p = pdde_graph_tensor(from_g, i);
        if (!(p->flags & PDDE_TENSOR_PARAM)) continue;
        size_t n = pdde_tensor_nbytes(p);
        void *buf = malloc(n);
        st = !buf ? PDDE_ERR_OOM : pdde_session_read(from, p, buf, n);
        if (!st) st = pdde_session_write(*s, pdde_graph_find(*g, p->name), buf, n);
        free(buf);
    }
    return st;
}

/* Two documents packed in one window under cfg.doc_mask (a document starts at token doc_token) give the logits each
 * gives alone in the plain causal model: attention stays inside each, and GPT's positions restart (LLaMA's RoPE
 * scores depend on distances alone). The second document alone starts at position 0. */
static void check_doc_mask(gpt_arch arch) {
    enum { T = 16, A = 7, V = 64 };
    gpt_config c = {.vocab = V, .ctx = T, .layers = 2, .heads = 2, .width = 32, .batch = 1, .arch = arch, .doc_mask = 1, .doc_token = 5};
    int32_t packed[T], alone[T];
    for (int t = 0; t < T; t++) packed[t] = t == 0 || t == A ? 5 : (t * 11 + 3) % V == 5 ? 6 : (t * 11 + 3) % V;
    for (int t = 0; t < T; t++) alone[t] = t < T - A ? packed[A + t] : 9; /* (the second document, then anything) */
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_graph *g = NULL, *g2 = NULL;
    pdde_session *s = NULL, *s2 = NULL;
    gpt_model m, m2;
    float *lp = malloc(T * V * sizeof *lp), *la = malloc(T * V * sizeof *la), *lb = malloc(T * V * sizeof *lb);
    pdde_status st = doc_session(ctx, &c, NULL, NULL, &g, &m, &s);
    if (!st) st = gpt_write_micro(s, &m, 0, packed, NULL, 1);
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s, m.logits, lp, T * V * sizeof *lp);
    gpt_config plain = c;
    plain.doc_mask = 0;
    if (!st) st = doc_session(ctx, &plain, s, g, &g2, &m2, &s2);
    if (!st) st = gpt_write_micro(s2, &m2, 0, packed, NULL, 1); /* the first document: the window as it is */
    if (!st) st = pdde_session_run(s2, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s2, m2.logits, la, T * V * sizeof *la);
    if (!st) st = gpt_write_micro(s2, &m2, 0, alone, NULL, 1);
    if (!st) st = pdde_session_run(s2, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s2, m2.logits, lb, T * V * sizeof *lb);
    CHECK(!st, "%s doc_mask sessions: %s", gpt_arch_name(arch), pdde_last_error(ctx));
    if (!st) {
        char what[64];
        float largest = 0; /* (errors relative to the largest logit: f32 sums in another order) */
        for (int i = 0; i < T * V; i++) largest = fabsf(la[i]) > largest ? fabsf(la[i]) : largest;
        snprintf(what, sizeof what, "%s: the first of two packed documents", gpt_arch_name(arch));
        double e1 = test_close_all(what, lp, la, A * V, largest, 1e-5);
        snprintf(what, sizeof what, "%s: the second, as alone", gpt_arch_name(arch));
        double e2 = test_close_all(what, lp + A * V, lb, (T - A) * V, largest, 1e-5);
        double moved = 0; /* (without the mask the second document sees the first: other logits) */
        for (int i = A * V; i < T * V; i++) moved = fabs(la[i] - lp[i]) > moved ? fabs(la[i] - lp[i]) : moved;
        CHECK(moved > 1e-3, "%s: the plain model's second document sees the first (logits differ by %.2g)", gpt_arch_name(arch), moved);
        printf("%s doc_mask: packed vs alone: rel err %.2g, %.2g (plain model: %.2g apart)\n", gpt_arch_name(arch), e1, e2, moved);
    }
    pdde_session_free(s), pdde_session_free(s2), pdde_graph_free(g), pdde_graph_free(g2), pdde_context_free(ctx);
    free(lp), free(la), free(lb);
}

/* A one-block LLaMA of window W (cfg.window): the logits at position t >= W - 1 are the plain model's at position W - 1
 * given tokens t - W + 1 .. t (RoPE's scores depend on distances alone; one block: nothing reaches further back). With
 * --doc-mask too, a document that starts inside the window cuts it shorter. */
static void check_window(void) {
    enum { T = 16, W = 5, V = 64, DOC = 11 };
    gpt_config c = {.vocab = V, .ctx = T, .layers = 1, .heads = 2, .width = 32, .batch = 1, .arch = GPT_ARCH_LLAMA, .window = W, .doc_token = 5};
    int32_t ids[T], part[T];
    for (int t = 0; t < T; t++) ids[t] = t == DOC ? 5 : (t * 13 + 7) % V == 5 ? 6 : (t * 13 + 7) % V;
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_graph *g = NULL, *g2 = NULL, *g3 = NULL;
    pdde_session *s = NULL, *s2 = NULL, *s3 = NULL;
    gpt_model m, m2, m3;
    float *lw = malloc(T * V * sizeof *lw), *ld = malloc(T * V * sizeof *ld), *lp = malloc(T * V * sizeof *lp);
    double worst = 0, worst_doc = 0;
    pdde_status st = doc_session(ctx, &c, NULL, NULL, &g, &m, &s);
    if (!st) st = gpt_write_micro(s, &m, 0, ids, NULL, 1);
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s, m.logits, lw, T * V * sizeof *lw);
    gpt_config docs = c, plain = c;
    docs.doc_mask = 1, plain.window = 0;
    if (!st) st = doc_session(ctx, &docs, s, g, &g3, &m3, &s3);
    if (!st) st = gpt_write_micro(s3, &m3, 0, ids, NULL, 1);
    if (!st) st = pdde_session_run(s3, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s3, m3.logits, ld, T * V * sizeof *ld);
    if (!st) st = doc_session(ctx, &plain, s, g, &g2, &m2, &s2);
    for (int t = W - 1; t < T && !st; t++) {
        int from = t >= DOC && t - DOC < W ? DOC : t - W + 1; /* (under the doc mask: the window or the document, the shorter) */
        for (int pass = 0; pass < 2 && !st; pass++) {
            int first = pass ? from : t - W + 1, n = t - first + 1;
            for (int i = 0; i < T; i++) part[i] = i < n ? ids[first + i] : 9;
            st = gpt_write_micro(s2, &m2, 0, part, NULL, 1);
            if (!st) st = pdde_session_run(s2, PDDE_RUN_FORWARD);
            if (!st) st = pdde_session_read(s2, m2.logits, lp, T * V * sizeof *lp);
            const float *got = (pass ? ld : lw) + t * V, *want = lp + (n - 1) * V;
            for (int v = 0; v < V && !st; v++) {
                double e = fabs(got[v] - want[v]) / (fabs(want[v]) > 1 ? fabs(want[v]) : 1);
                if (pass) worst_doc = e > worst_doc ? e : worst_doc;
                else worst = e > worst ? e : worst;
            }
        }
    }
    CHECK(!st, "window sessions: %s", pdde_last_error(ctx));
    CHECK(!st && worst < 1e-5 && worst_doc < 1e-5, "window %d: the logits are the plain model's on the window's tokens (rel err %.2g; with "
          "documents %.2g)", W, worst, worst_doc);
    printf("llama window %d: vs the plain model on the window alone: rel err %.2g; with documents: %.2g\n", W, worst, worst_doc);
    pdde_session_free(s), pdde_session_free(s2), pdde_session_free(s3), pdde_graph_free(g), pdde_graph_free(g2), pdde_graph_free(g3);
    pdde_context_free(ctx);
    free(lw), free(ld), free(lp);
}

/* The llm.c fixture's model read into a session of cfg (batch B, context T) with ids and targets written */
static pdde_status llmc_session(pdde_context *ctx, const char *path, int B, int T, const int32_t *ids, const int32_t *targets, pdde_graph **g,
                                gpt_model *m, pdde_session **s) {
    gpt_llmc_header h;
    char why[300];
    if (gpt_llmc_read_header(path, &h, why, sizeof why)) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: %s", path, why);
    gpt_config cfg = {.vocab = h.vocab, .ctx = T, .layers = h.layers, .heads = h.heads, .width = h.width, .batch = B};
    pdde_status st = pdde_graph_init(ctx, g);
    if (!st) st = gpt_build(*g, &cfg, m);
    if (!st) pdde_mark_output(m->logits), st = pdde_session_init(*g, NULL, s);
    if (!st) st = gpt_llmc_load(*s, *g, &cfg, path);
    if (!st) st = pdde_session_write(*s, m->ids, ids, (size_t)B * T * 4);
    if (!st) st = pdde_session_write(*s, m->targets, targets, (size_t)B * T * 4);
    return st;
}

static void llmc_free(pdde_session *s, pdde_graph *g) { pdde_session_free(s), pdde_graph_free(g); }

/* A copy of src with `size` bytes (cut or extended with zeros) and int32 header[at] = value (at < 0: none) */
static void llmc_variant(const char *src, const char *dst, long size, int at, int32_t value) {
    FILE *f = fopen(src, "rb"), *o = fopen(dst, "wb");
    if (!f || !o) { CHECK(0, "copy %s to %s", src, dst); if (f) fclose(f); if (o) fclose(o); return; }
    char *buf = calloc((size_t)size + 1, 1);
    size_t n = fread(buf, 1, (size_t)size, f);
    (void)n;
    if (at >= 0) memcpy(buf + 4 * at, &value, 4);
    fwrite(buf, 1, (size_t)size, o);
    fclose(f), fclose(o), free(buf);
}

static void check_llmc(void) {
    const char *ref_path = "tests/data/gpt2_llmc_ref.bin";
    FILE *f = fopen(ref_path, "rb");
    char magic[8] = "";
    int32_t dims[3] = {0}, *ids = NULL, *targets = NULL;
    float loss_ref[2] = {NAN, NAN}, *logits_ref = NULL;
    int ok = f && fread(magic, 8, 1, f) == 1 && !memcmp(magic, "LLMCREF1", 8) && fread(dims, 4, 3, f) == 3 && dims[0] > 0 && dims[1] > 0 &&
             dims[2] > 0 && dims[0] * dims[1] <= 1 << 16 && dims[2] <= 1 << 16;
    int B = ok ? dims[0] : 0, T = ok ? dims[1] : 0, V = ok ? dims[2] : 0, BT = B * T;
    if (ok) {
        ids = malloc((size_t)BT * 4), targets = malloc((size_t)BT * 4), logits_ref = malloc((size_t)BT * V * 4);
        ok = fread(ids, 4, (size_t)BT, f) == (size_t)BT && fread(targets, 4, (size_t)BT, f) == (size_t)BT && fread(loss_ref, 4, 2, f) == 2 &&
             fread(logits_ref, 4, (size_t)BT * V, f) == (size_t)BT * V;
    }
    if (f) fclose(f);
    CHECK(ok, "fixture %s: missing or cut", ref_path);
    if (!ok) { free(ids), free(targets), free(logits_ref); return; }

    pdde_context *ctx;
    CHECK(pdde_context_init(NULL, &ctx) == PDDE_OK, "context");
    float *logits = malloc((size_t)BT * V * 4), *again = malloc((size_t)BT * V * 4);
    const char *files[2] = {"tests/data/gpt2_llmc.bin", "tests/data/gpt2_llmc_bf16.bin"};
    for (int k = 0; k < 2; k++) { /* the f32 file, then the bf16 one (its weights rounded, computed in f32) */
        pdde_graph *g = NULL;
        pdde_session *s = NULL;
        gpt_model m = {0};
        pdde_status st = llmc_session(ctx, files[k], B, T, ids, targets, &g, &m, &s);
        CHECK(!st, "%s: %s", files[k], pdde_last_error(ctx));
        if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
        CHECK(!st, "%s: forward: %s", files[k], pdde_last_error(ctx));
        float loss = pdde_session_loss(s);
        double e = test_close_all(k ? "llm.c bf16 file: loss" : "llm.c f32 file: loss", &loss, &loss_ref[k], 1, 0, gpt_tol.loss);
        printf("%s: loss %.6f, PyTorch's %.6f (rel err %.2g)\n", files[k], loss, loss_ref[k], e);
        if (k || st) { llmc_free(s, g); continue; }
        pdde_session_read(s, m.logits, logits, (size_t)BT * V * 4);
        e = golden_rel_err(logits, logits_ref, (int64_t)BT * V);
        CHECK(e < gpt_tol.logits, "llm.c f32 file: logits differ from PyTorch's: rel err %.3g (tolerance %.3g)", e, gpt_tol.logits);

        /* written back and read again: the same logits, bit for bit; the header llm.c's (padded to 128 rows) */
        const char *out = "build/test_gpt_golden_llmc.bin";
        gpt_config cfg = m.cfg;
        st = gpt_llmc_save(s, g, &cfg, out);
        CHECK(!st, "save %s: %s", out, pdde_last_error(ctx));
        gpt_llmc_header h = {0};
        char why[300] = "";
        CHECK(!gpt_llmc_read_header(out, &h, why, sizeof why) && h.version == 3 && h.vocab == V && h.padded_vocab == 384 && h.max_ctx == T,
              "saved header: version %d vocab %d padded %d context %d (want 3, %d, 384, %d) %s", h.version, h.vocab, h.padded_vocab, h.max_ctx,
              V, T, why);
        FILE *sf = fopen(out, "rb");
        float pad[32] = {1};
        int pad_zero = sf && !fseek(sf, 1024 + (long)V * 32 * 4, SEEK_SET) && fread(pad, 4, 32, sf) == 32;
        for (int i = 0; i < 32; i++) pad_zero &= pad[i] == 0.0f;
        if (sf) fclose(sf);
        CHECK(pad_zero, "saved file: the first padding row of wte is zeros");
        llmc_free(s, g);
        s = NULL, g = NULL;
        st = llmc_session(ctx, out, B, T, ids, targets, &g, &m, &s);
        if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
        if (!st) st = pdde_session_read(s, m.logits, again, (size_t)BT * V * 4);
        CHECK(!st && !memcmp(logits, again, (size_t)BT * V * 4), "the saved file read back gives other logits (%s)", st ? pdde_last_error(ctx) : "");
        llmc_free(s, g);
    }

    /* files and models that do not fit are refused naming the field */
    const char *bad = "build/test_gpt_golden_llmc_bad.bin";
    static const struct { long size; int at; int32_t value; const char *says; } cases[] = {
        {147968 - 4, -1, 0, "147964 bytes, but its header's sizes"}, /* cut by one value */
        {147968, 0, 20240520, "header[0] = 20240520: not llm.c's GPT-2 model file"},
        {147968, 1, 4, "header[1] = 4: version 3 (f32) or 5 (bf16) expected"},
        {147968, 5, 5, "channels = 32 is not divisible by header[5] num_heads = 5"},
        {147968, 7, 299, "padded_vocab_size = 299: vocab_size 300"},
        {100, -1, 0, "shorter than llm.c's 1 KiB header"},
        {147968, 6, 1 << 30, "header[6] channels = 1073741824: 1 .. 65536 expected"}, /* (its sizes would overflow) */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        llmc_variant(files[0], bad, cases[i].size, cases[i].at, cases[i].value);
        gpt_llmc_header h;
        char why[300] = "";
        int refused = gpt_llmc_read_header(bad, &h, why, sizeof why) != 0;
        CHECK(refused && strstr(why, cases[i].says), "a bad file (case %zu) refused saying '%s': %s", i, cases[i].says, refused ? why : "accepted");
    }
    gpt_llmc_header h;
    char why[300] = "";
    CHECK(!gpt_llmc_read_header(files[0], &h, why, sizeof why), "%s: %s", files[0], why);
    gpt_config fits = {.vocab = h.vocab, .ctx = h.max_ctx, .layers = h.layers, .heads = h.heads, .width = h.width, .batch = 1}, c;
    CHECK(!gpt_llmc_fits(&h, &fits, why, sizeof why), "the file's own model fits it: %s", why);
    c = fits, c.layers = 3;
    CHECK(gpt_llmc_fits(&h, &c, why, sizeof why) && strstr(why, "--layers 3, but the file's model has 2"), "3 layers refused: %s", why);
    c = fits, c.ctx = h.max_ctx + 1;
    CHECK(gpt_llmc_fits(&h, &c, why, sizeof why) && strstr(why, "--ctx 33, but the file's positions stop at 32"), "a longer context refused: %s", why);
    c = fits, c.arch = GPT_ARCH_LLAMA;
    CHECK(gpt_llmc_fits(&h, &c, why, sizeof why) && strstr(why, "not --arch llama"), "LLaMA refused: %s", why);
    free(ids), free(targets), free(logits_ref), free(logits), free(again);
    pdde_context_free(ctx);
}

int main(int argc, char **argv) {
    if (argc > 1) {
        check_fixture(argv[1]);
    } else {
        check_fixture("tests/data/gpt_golden.bin");
        check_fixture("tests/data/gpt_golden_llama.bin");
        check_llmc();
        gpt_config llama = {.vocab = 256, .ctx = 16, .layers = 3, .heads = 8, .width = 64, .batch = 2, .arch = GPT_ARCH_LLAMA, .kv_heads = 2};
        check_n_params("LLaMA, 2 kv heads", &llama);
        CHECK(gpt_ffn(&llama) == 192, "LLaMA's default ffn of width 64: 8/3 x 64 rounded up to a multiple of 32 is 192, got %lld",
              (long long)gpt_ffn(&llama));
        check_doc_mask(GPT_ARCH_GPT);
        check_doc_mask(GPT_ARCH_LLAMA);
        check_window();
        gpt_config qwen3 = llama;
        qwen3.head_dim = 24, qwen3.qk_norm = 1; /* (heads wider than width / heads, each with its norms) */
        check_n_params("LLaMA with heads of 24 (Qwen3's q and k norms)", &qwen3);
        qwen3.lora_rank = 3;
        check_n_params("the same with LoRA rank 3", &qwen3);
        llama.moe_experts = 4, llama.moe_every = 2;
        check_n_params("LLaMA with MoE blocks", &llama);
        llama.arch = GPT_ARCH_GPT, llama.kv_heads = 0;
        check_n_params("GPT with MoE blocks", &llama);
    }
    return test_finish();
}
