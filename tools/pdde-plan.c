/* pdde-plan — shows what a parallel plan of the example GPT does, without running it: the program
 * with every tensor's distributed attribute and the reshards (communication) it implies, and the
 * parameter, gradient and optimizer bytes each rank holds (per pipeline stage).
 *   pdde-plan --dp 2 --tp 2 --pp 2 --zero 1 [--layers 2 --width 64 --heads 4 --ctx 32 --vocab 256 --batch 8]
 *             [--recompute] [--show-program] */
#include "pdde.h"
#include "examples/gpt.h"
#include <stdlib.h>
#include <string.h>

static int64_t local_numel(const pdde_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        int a = t->dist.mesh ? t->dist.dims_mapping[d] : -1;
        n *= a >= 0 ? t->shape[d] / t->dist.mesh->shape[a] : t->shape[d];
    }
    return n;
}

int main(int argc, char **argv) {
    gpt_config c = {.vocab = 256, .ctx = 32, .layers = 2, .heads = 4, .width = 64, .batch = 8};
    int dp = 1, tp = 1, pp = 1, zero = 0, show = 0, recompute = 0;
    for (int i = 1; i < argc; i++) {
        int *v = NULL;
        if (!strcmp(argv[i], "--show-program")) { show = 1; continue; }
        if (!strcmp(argv[i], "--recompute")) { recompute = 1; continue; }
        if (!strcmp(argv[i], "--dp")) v = &dp;
        else if (!strcmp(argv[i], "--tp")) v = &tp;
        else if (!strcmp(argv[i], "--pp")) v = &pp;
        else if (!strcmp(argv[i], "--zero")) v = &zero;
        else if (!strcmp(argv[i], "--layers")) v = &c.layers;
        else if (!strcmp(argv[i], "--width")) v = &c.width;
        else if (!strcmp(argv[i], "--heads")) v = &c.heads;
        else if (!strcmp(argv[i], "--ctx")) v = &c.ctx;
        else if (!strcmp(argv[i], "--vocab")) v = &c.vocab;
        else if (!strcmp(argv[i], "--batch")) v = &c.batch;
        if (!v || i + 1 >= argc) {
            fprintf(stderr, "usage: pdde-plan [--dp N] [--tp N] [--pp N] [--zero 0-3] [--recompute] [--layers N --width N --heads N --ctx N --vocab N --batch N] [--show-program]\n");
            return 2;
        }
        char *end;
        long x = strtol(argv[i + 1], &end, 10);
        long lo = v == &zero ? 0 : 1, hi = v == &zero ? 3 : 1 << 24;
        if (end == argv[i + 1] || *end || x < lo || x > hi) {
            fprintf(stderr, "pdde-plan: %s wants an integer in %ld..%ld, got '%s'\n", argv[i], lo, hi, argv[i + 1]);
            return 2;
        }
        *v = (int)x;
        i++;
    }
    if (c.width % c.heads || (long)dp * tp * pp > 1 << 24) {
        fprintf(stderr, "pdde-plan: --width %d must be a multiple of --heads %d, and --dp x --tp x --pp at most 2^24\n", c.width, c.heads);
        return 2;
    }
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context *ctx;
    pdde_graph *g;
    gpt_model m;
    if (pdde_context_init(&cp, &ctx) || pdde_graph_init(ctx, &g)) {
        fprintf(stderr, "pdde-plan: cannot create a context\n");
        return 1;
    }
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    gpt_plan plan = {dp, tp, pp, 1, zero, recompute, 0, NULL};
    pdde_status st = gpt_build_plan(g, &c, &plan, &op, &m);
    if (st) {
        fprintf(stderr, "pdde-plan: %s: %s\n", pdde_status_str(st), pdde_last_error(ctx));
        return 1;
    }
    if (show) pdde_graph_dump_dist(g, stdout);
    printf("plan: dp %d x tp %d x pp %d, ZeRO-%d on %d ranks%s; GPT %d layers, width %d: %.2fM parameters\n", dp, tp, pp, zero,
           dp * tp * pp, recompute ? ", blocks recomputed" : "", c.layers, c.width, (double)gpt_n_params(&c) / 1e6);
    /* per rank, ranks holding the same amounts (a pipeline stage's) on one line */
    enum { MAX_RANKS = 256 };
    int n = dp * tp * pp < MAX_RANKS ? dp * tp * pp : MAX_RANKS;
    double total[3] = {0}, bytes[MAX_RANKS][3] = {{0}};
    for (int i = 0; i < pdde_graph_n_tensors(g); i++) {
        const pdde_tensor *t = pdde_graph_tensor(g, i);
        int kind = t->flags & PDDE_TENSOR_PARAM ? 0 : t->flags & PDDE_TENSOR_GRAD ? 1 : t->flags & PDDE_TENSOR_STATE ? 2 : -1;
        if (kind < 0 || t->op != PDDE_OP_NONE) continue;
        total[kind] += 4.0 * (double)pdde_tensor_numel(t);
        int coords[PDDE_MAX_MESH_DIMS];
        for (int r = 0; r < n; r++)
            if (!t->dist.mesh || pdde_mesh_coords(t->dist.mesh, r, coords) == PDDE_OK) bytes[r][kind] += 4.0 * (double)local_numel(t);
    }
    for (int r = 0; r < n; r++) {
        int first = 0;
        while (memcmp(bytes[first], bytes[r], sizeof bytes[r])) first++;
        if (first < r) continue; /* printed with an earlier rank */
        printf("ranks");
        for (int q = r; q < n; q++)
            if (!memcmp(bytes[q], bytes[r], sizeof bytes[r])) printf(" %d", q);
        printf(": parameters %.2f MB, gradients %.2f MB, optimizer %.2f MB each\n", bytes[r][0] / 1e6, bytes[r][1] / 1e6, bytes[r][2] / 1e6);
    }
    printf("one process: parameters %.2f MB, gradients %.2f MB, optimizer %.2f MB\n", total[0] / 1e6, total[1] / 1e6, total[2] / 1e6);
    printf("completion conflicts resolved: %d\n", pdde_complete_n_conflicts(g));
    pdde_graph_free(g);
    pdde_context_free(ctx);
    return 0;
}
