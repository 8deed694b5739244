/* test_gpt_golden — pdde's GPT against PyTorch (llm.c style). tools/gen_golden.py wrote
 * tests/data/gpt_golden.bin with torch: fixed weights and batch, the logits, the loss, every parameter
 * gradient, the losses of 10 AdamW steps and the parameters after them. Tolerances below are stated
 * per quantity; float32 reassociation alone moves results by ~1e-6 relative. */
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>

/* Tolerances: about 10x the worst measured (OpenBLAS and the portable GEMM builds; printed each run) */
#define TOL_LOGITS 2e-6   /* measured 1.7e-7 */
#define TOL_LOSS 1.5e-6   /* measured 1.2e-7 */
#define TOL_GRAD 7e-6     /* measured 6.5e-7 */
#define TOL_PARAM 1e-4    /* measured 5.9e-5 (AdamW divides by small second moments) */

typedef struct { char name[64]; int64_t n; float *data; } record;
typedef struct { const unsigned char *p, *end; } reader;

static int rd(reader *r, void *dst, size_t n) {
    if ((size_t)(r->end - r->p) < n) return 0;
    memcpy(dst, r->p, n), r->p += n;
    return 1;
}

static int read_records(reader *r, record *recs, uint32_t n) {
    for (uint32_t i = 0; i < n; i++) {
        uint16_t len;
        uint32_t ndim, dim;
        if (!rd(r, &len, 2) || len >= 64 || !rd(r, recs[i].name, len)) return 0;
        recs[i].name[len] = 0;
        if (!rd(r, &ndim, 4)) return 0;
        recs[i].n = 1;
        for (uint32_t d = 0; d < ndim; d++) { if (!rd(r, &dim, 4)) return 0; recs[i].n *= dim; }
        recs[i].data = malloc((size_t)recs[i].n * 4);
        if (!rd(r, recs[i].data, (size_t)recs[i].n * 4)) return 0;
    }
    return 1;
}

/* max |a-b| / (max|b| + 1e-8) over a tensor: a scale-aware error that tiny gradients do not inflate */
static double rel_err(const float *a, const float *b, int64_t n) {
    double maxdiff = 0, maxref = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= maxdiff)) maxdiff = d; /* NaN counts as huge */
        if (fabs(b[i]) > maxref) maxref = fabs(b[i]);
    }
    return maxdiff / (maxref + 1e-8);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "tests/data/gpt_golden.bin";
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return test_finish();
    static unsigned char buf[1 << 21];
    size_t size = fread(buf, 1, sizeof buf, f);
    fclose(f);
    reader r = {buf, buf + size};
    char magic[8];
    uint32_t version = 0, n_params = 0;
    int32_t hdr[7];
    float lr, wd;
    CHECK(rd(&r, magic, 8) && memcmp(magic, "PDDEGOLD", 8) == 0 && rd(&r, &version, 4) && version == 1, "bad fixture header");
    rd(&r, hdr, sizeof hdr), rd(&r, &lr, 4), rd(&r, &wd, 4);
    gpt_config cfg = {.vocab = hdr[0], .ctx = hdr[1], .layers = hdr[2], .heads = hdr[3], .width = hdr[4], .batch = hdr[5]};
    int n_steps = hdr[6], BT = cfg.batch * cfg.ctx;
    int32_t *ids = malloc((size_t)BT * 4), *targets = malloc((size_t)BT * 4);
    rd(&r, ids, (size_t)BT * 4), rd(&r, targets, (size_t)BT * 4), rd(&r, &n_params, 4);
    record *init = calloc(n_params, sizeof *init), *grads = calloc(n_params, sizeof *grads), *final = calloc(n_params, sizeof *final);
    float *logits_ref = malloc((size_t)BT * cfg.vocab * 4), loss_ref, losses_ref[64];
    int ok = read_records(&r, init, n_params) && rd(&r, logits_ref, (size_t)BT * cfg.vocab * 4) && rd(&r, &loss_ref, 4) &&
             read_records(&r, grads, n_params) && n_steps <= 64 && rd(&r, losses_ref, (size_t)n_steps * 4) &&
             read_records(&r, final, n_params);
    CHECK(ok, "fixture %s is truncated", path);
    if (!ok) return test_finish();

    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    gpt_model m;
    CHECK(pdde_context_init(NULL, &ctx) == PDDE_OK, "context");
    pdde_graph_init(ctx, &g);
    CHECK(gpt_build(g, &cfg, &m) == PDDE_OK, "build: %s", pdde_last_error(ctx));
    pdde_mark_output(m.logits);
    CHECK(pdde_backward(g, m.loss) == PDDE_OK, "backward: %s", pdde_last_error(ctx));
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = lr, op.weight_decay = wd;
    CHECK(pdde_optimizer_adamw(g, &op) == PDDE_OK, "optimizer: %s", pdde_last_error(ctx));
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "session: %s", pdde_last_error(ctx));
    if (test_failed) return test_finish();

    for (uint32_t i = 0; i < n_params; i++) {
        pdde_tensor *t = pdde_graph_find(g, init[i].name);
        CHECK(t && pdde_tensor_numel(t) == init[i].n, "parameter %s missing or of another size", init[i].name);
        if (t) pdde_session_write(s, t, init[i].data, (size_t)init[i].n * 4);
    }
    pdde_session_write(s, m.ids, ids, (size_t)BT * 4);
    pdde_session_write(s, m.targets, targets, (size_t)BT * 4);

    /* step 0 in two halves, to look at the gradients before the update */
    CHECK(pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD) == PDDE_OK, "run: %s", pdde_last_error(ctx));
    float *logits = malloc((size_t)BT * cfg.vocab * 4);
    pdde_session_read(s, m.logits, logits, (size_t)BT * cfg.vocab * 4);
    double e = rel_err(logits, logits_ref, (int64_t)BT * cfg.vocab);
    CHECK(e < TOL_LOGITS, "logits differ: rel err %.3g (tolerance %.3g)", e, TOL_LOGITS);
    printf("logits: rel err %.2g (tolerance %.2g)\n", e, TOL_LOGITS);
    float loss0 = pdde_session_loss(s);
    double worst_loss = test_close_all("step 0 loss", &loss0, &loss_ref, 1, 0, TOL_LOSS);
    double worst = 0;
    for (uint32_t i = 0; i < n_params; i++) {
        pdde_tensor *t = pdde_graph_find(g, grads[i].name);
        float *gbuf = malloc((size_t)grads[i].n * 4);
        pdde_session_read(s, t->grad, gbuf, (size_t)grads[i].n * 4);
        e = rel_err(gbuf, grads[i].data, grads[i].n);
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
        e = rel_err(pbuf, final[i].data, final[i].n);
        CHECK(e < TOL_PARAM, "parameter %s after %d steps: rel err %.3g (tolerance %.3g)", final[i].name, n_steps, e, TOL_PARAM);
        worst = !(e <= worst) ? e : worst;
        free(pbuf);
    }
    printf("losses: worst rel err %.2g (tolerance %.2g)\n", worst_loss, TOL_LOSS);
    printf("parameters after %d AdamW steps: worst rel err %.2g (tolerance %.2g)\n", n_steps, worst, TOL_PARAM);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    for (uint32_t i = 0; i < n_params; i++) free(init[i].data), free(grads[i].data), free(final[i].data);
    free(init), free(grads), free(final), free(ids), free(targets), free(logits_ref), free(logits);
    return test_finish();
}
