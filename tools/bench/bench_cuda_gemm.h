/* bench_cuda_gemm.h — bench_cuda --gemm: the matmuls of one GPT training step (GPT-2 124M: B 8, T 1024, bf16
 * operands), each distinct shape through pdde's GEMM paths on the device, next to torch.matmul on the same
 * shapes (tools/bench/gemm_torch.py, run from here when python3 has torch with CUDA).
 *
 * The shapes, M = B*T rows: for each linear layer (qkv C -> 3C, proj C -> C, fc C -> 4C, fcproj 4C -> C; x12)
 * the forward x W [M, out], the input gradient dy W^T [M, in] and the weight gradient x^T dy [in, out]; the
 * head (tied embedding, V = vocab) logits x E^T [M, V], dx = dlogits E [M, C], dE = dlogits^T x [V, C].
 * Paths, each node built by hand and run through the backend's compute (pdde's dispatch, as a session runs
 * it), a fresh context per set of switches:
 *   gemmex_f32   a matmul without epilogue: cublasGemmStridedBatchedEx, bf16 in, f32 out (every shape)
 *   gemmex_bf16  PDDE_CUDA_GEMMEX_LOWP=1 (PDDE_CUDA_LT=0): the same writing bf16 (the forward and the input
 *                gradients)
 *   lt_bf16      cublasLt (PDDE_CUDA_LT=1), a bf16 output (the forward and the input gradients: PDDE_FUSE_EPILOGUE
 *                folds their casts)
 *   lt_bias      the same with a bias (the forward: cublasLt's bias is of D's dtype, so its f32 sum, then a cast)
 *   lt_bias_f32  the forward with its bias, f32 out (one cublasLtMatmul, BIAS epilogue)
 *   lt_bias_lowp PDDE_CUDA_LT_LOWP_BIAS=1: lt_bias as one cublasLtMatmul, its bias rounded to bf16 first (a cast kernel
 *                of out elements, then BIAS with a bf16 bias and D: the work of torch's F.linear under autocast)
 *   lt_bias_lowp_tn  the same with the weight stored [out, in], torch's layout (its peer F.linear runs in that layout)
 *   lt_gelu      fc's forward with PDDE_FUSE_GELU's epilogue (GELU_AUX_BIAS: X and gelu(X)), f32 out
 *   lt_gelu_lowp the same bf16 out under PDDE_CUDA_LT_LOWP_BIAS=1: the bias rounded to bf16, then GELU_AUX_BIAS
 *                (without it, the kernels after the f32 GEMM)
 *   lt_dgelu     fcproj's input gradient times gelu'(X) (DGELU, X and the output bf16)
 *   lt_bf16_rall lt_bf16 under PDDE_CUDA_LT_REDUCTION=all (split-K partial sums reduced in bf16 allowed)
 *   lt_bf16_ws1  lt_bf16 under PDDE_CUDA_LT_WORKSPACE=1 (a 1 MiB workspace, not 32)
 *   lt_bf16_tn   lt_bf16 of a forward with the weight stored [out, in] (B transposed), as torch's linear keeps it:
 *                pdde's [in, out] weight makes the forward NN and the input gradient TN, torch's the other way
 *   lt_beta1     the weight gradients accumulated in place (PDDE_FUSE_GRAD: beta 1, f32)
 *   lt_bgrad     the weight gradients with their bias gradient (PDDE_FUSE_BGRAD: BGRADA)
 *   *_tuned      the lt_* paths again under PDDE_CUDA_LT_TUNE=1 (the fastest of cublasLt's candidates; the
 *                others take the heuristic's first)
 *   gemm1_f32    PDDE_CUDA_GEMM_SINGLE=1: gemmex_f32 through cublasGemmEx (batch 1), not the strided-batched entry
 *   gemm1_bf16   the same for gemmex_bf16
 *   f32_cast     gemmex_f32 and then the cast node to bf16 (what a bf16 output costs without an epilogue)
 * Inputs are random (not zero); where a shape's operands are small against the L2 cache, several copies
 * are rotated so that each call reads cold memory. Times: CUDA events around 10 calls, the median of 11
 * such runs (elsewhere, as --device opencl for a check of the code, host time after a sync).
 * Each shape and path also gets a RATIO line: torch's time for the same work (its peer: torch.matmul for a
 * bf16 output, F.linear for a bias (a bf16 bias and the weight [out, in]: lt_bias_lowp_tn's work; lt_bias adds the f32
 * bias and casts, lt_bias_lowp takes pdde's [in, out] weight), torch._addmm_activation (cublasLt's GELU_BIAS) for the GELU, the matmul and
 * gelu_backward for DGELU, mm with out_dtype f32 / addmm into f32 for the f32 outputs where that torch has them)
 * over pdde's: above 1, pdde is faster.
 * Totals weigh each shape by its calls a step; RESULT gpu_gemm: pdde_tflops (gemmex_f32, every shape), pdde_best_tflops
 * (each shape's fastest path), torch_tflops, ratio = pdde / torch, best_ratio, lt_tune_gain (the lt paths'
 * time / the tuned ones'), single_gain (gemmex_f32's time / gemm1_f32's), and the bf16-output shapes' totals a step
 * on each bf16-out path and torch's (bf16out_*_ms; na where a path skipped a shape). */
#include "pdde_extension.h"

#include <math.h>
#include <stdio.h>

typedef struct {
    char name[16];
    int64_t M, N, K;
    int ta, tb, count, kind; /* kind: 0 forward (a bias), 1 input gradient, 2 weight gradient (a bias gradient: bias 1) */
    int bias;
    int act; /* 1: GELU follows (fc's forward), 2: gelu' follows (fcproj's input gradient) */
} gemm_shape;

enum { GP_GEMMEX, GP_GEMMEX_BF16, GP_LT_BF16, GP_LT_BIAS, GP_LT_BETA1, GP_LT_BGRAD, GP_LT_BF16_T, GP_LT_BIAS_T, GP_LT_BETA1_T, GP_LT_BGRAD_T,
       GP_GEMM1, GP_GEMM1_BF16, GP_F32_CAST, GP_LT_BIAS_F32, GP_LT_BIAS_LOWP, GP_LT_GELU, GP_LT_GELU_LOWP, GP_LT_DGELU, GP_LT_BF16_RALL,
       GP_LT_BF16_WS1, GP_LT_BF16_TN, GP_LT_BIAS_LOWP_TN, GP_COUNT };
static const char *const gemm_path_names[GP_COUNT] = {"gemmex_f32", "gemmex_bf16", "lt_bf16", "lt_bias", "lt_beta1", "lt_bgrad",
                                                      "lt_bf16_tuned", "lt_bias_tuned", "lt_beta1_tuned", "lt_bgrad_tuned",
                                                      "gemm1_f32", "gemm1_bf16", "f32_cast", "lt_bias_f32", "lt_bias_lowp",
                                                      "lt_gelu", "lt_gelu_lowp", "lt_dgelu", "lt_bf16_rall", "lt_bf16_ws1", "lt_bf16_tn",
                                                      "lt_bias_lowp_tn"};
/* the torch peer of each path (gemm_torch.py's keys): ms (bf16 out, pdde's layout), bias_ms, gelu_ms, dgelu_ms, f32_ms, acc_ms,
 * linear_ms (a forward without bias in torch's layout: the weight [out, in]) */
enum { TP_MS, TP_BIAS, TP_GELU, TP_DGELU, TP_F32, TP_ACC, TP_LINEAR, TP_COUNT };
static const char *const gemm_peer_names[TP_COUNT] = {"ms", "bias_ms", "gelu_ms", "dgelu_ms", "f32_ms", "acc_ms", "linear_ms"};
static int gemm_peer(int path) {
    switch (path) {
    case GP_LT_BIAS: case GP_LT_BIAS_T: case GP_LT_BIAS_F32: case GP_LT_BIAS_LOWP: case GP_LT_BIAS_LOWP_TN: return TP_BIAS;
    case GP_LT_GELU: case GP_LT_GELU_LOWP: return TP_GELU;
    case GP_LT_DGELU: return TP_DGELU;
    case GP_GEMMEX: case GP_GEMM1: case GP_LT_BGRAD: case GP_LT_BGRAD_T: return TP_F32;
    case GP_LT_BETA1: case GP_LT_BETA1_T: return TP_ACC;
    case GP_LT_BF16_TN: return TP_LINEAR;
    default: return TP_MS;
    }
}

static int gemm_shapes(const gpt_config *c, gemm_shape *s) {
    int64_t M = (int64_t)c->batch * c->ctx, C = c->width, V = c->vocab;
    struct { const char *name; int64_t in, out; } lin[4] = {{"qkv", C, 3 * C}, {"proj", C, C}, {"fc", C, 4 * C}, {"fcproj", 4 * C, C}};
    int n = 0;
    for (int i = 0; i < 4; i++) {
        s[n] = (gemm_shape){"", M, lin[i].out, lin[i].in, 0, 0, c->layers, 0, 1, i == 2};
        snprintf(s[n++].name, sizeof s->name, "%s_fwd", lin[i].name);
        s[n] = (gemm_shape){"", M, lin[i].in, lin[i].out, 0, 1, c->layers, 1, 0, i == 3 ? 2 : 0};
        snprintf(s[n++].name, sizeof s->name, "%s_dx", lin[i].name);
        s[n] = (gemm_shape){"", lin[i].in, lin[i].out, M, 1, 0, c->layers, 2, 1, 0};
        snprintf(s[n++].name, sizeof s->name, "%s_dw", lin[i].name);
    }
    s[n++] = (gemm_shape){"head_fwd", M, V, C, 0, 1, 1, 0, 0, 0};
    s[n++] = (gemm_shape){"head_dx", M, C, V, 0, 0, 1, 1, 0, 0};
    s[n++] = (gemm_shape){"head_dw", V, C, M, 1, 0, 1, 2, 0, 0};
    return n;
}

/* the driver's events on the backend's native stream (CUDA); NULL entries: host time instead */
typedef struct {
    int (*EventCreate)(void **, unsigned);
    int (*EventDestroy)(void *);
    int (*EventRecord)(void *, void *);
    int (*EventSynchronize)(void *);
    int (*EventElapsedTime)(float *, void *, void *);
} gemm_events;

typedef struct {
    const pdde_backend_iface *b;
    void *dev, *stream, *native;
    gemm_events ev;
    int have_events;
} gemm_dev;

static void gemm_fill(gemm_dev *g, void *h, int64_t n, pdde_dtype dt, uint64_t seed) {
    size_t es = dt == PDDE_F32 ? 4 : 2;
    char *v = malloc((size_t)n * es);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        float f = (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        if (dt == PDDE_F32) ((float *)v)[i] = f;
        else ((uint16_t *)v)[i] = pdde_f32_to_bf16(f);
    }
    g->b->write(g->dev, g->stream, h, 0, v, (size_t)n * es);
    g->b->stream_sync(g->dev, g->stream);
    free(v);
}

static void gemm_leaf(pdde_tensor *t, pdde_dtype dt, int64_t r, int64_t c, void *h) {
    memset(t, 0, sizeof *t);
    t->dtype = dt, t->ndim = c ? 2 : 1, t->shape[0] = r, t->shape[1] = c, t->data = h, t->device = -1, t->layer = -1;
}

/* ms a call of one path on shape s (0: the path does not take it or failed) */
static double gemm_time(gemm_dev *g, const gemm_shape *s, int path) {
    int p = path >= GP_LT_BF16_T && path <= GP_LT_BGRAD_T ? path - 4 : path == GP_GEMM1 ? GP_GEMMEX : path == GP_GEMM1_BF16 ? GP_GEMMEX_BF16 : path;
    if (path == GP_LT_BIAS_LOWP || path == GP_LT_BIAS_LOWP_TN) p = GP_LT_BIAS; /* (the same node: the switch differs) */
    if (path == GP_LT_BF16_RALL || path == GP_LT_BF16_WS1 || path == GP_LT_BF16_TN) p = GP_LT_BF16;
    int tn = path == GP_LT_BF16_TN || path == GP_LT_BIAS_LOWP_TN;
    if (tn && s->kind != 0) return 0;
    gemm_shape flipped; /* (lt_bf16_tn, lt_bias_lowp_tn: the same forward, its weight stored transposed) */
    if (tn) flipped = *s, flipped.tb = !s->tb, s = &flipped;
    if (path == GP_LT_GELU_LOWP) p = GP_LT_GELU;
    int cast = p == GP_F32_CAST, bias_f32 = p == GP_LT_BIAS_F32, act = p == GP_LT_GELU ? PDDE_MATMUL_GELU : p == GP_LT_DGELU ? PDDE_MATMUL_DGELU : 0;
    if (cast && s->kind == 2) return 0;
    if (cast) p = GP_GEMMEX;
    if (bias_f32) p = GP_LT_BIAS;
    if (((p == GP_LT_BF16 || p == GP_GEMMEX_BF16) && s->kind == 2) || (p == GP_LT_BIAS && (s->kind != 0 || !s->bias)) || (p == GP_LT_BETA1 && s->kind != 2) ||
        (p == GP_LT_BGRAD && (s->kind != 2 || !s->bias)) || (p == GP_LT_GELU && s->act != 1) || (p == GP_LT_DGELU && s->act != 2))
        return 0;
    pdde_dtype ddt = (p == GP_LT_BF16 || p == GP_LT_BIAS || p == GP_GEMMEX_BF16 || path == GP_LT_GELU_LOWP || p == GP_LT_DGELU) && !bias_f32 ? PDDE_BF16 : PDDE_F32;
    int64_t ar = s->ta ? s->K : s->M, ac = s->ta ? s->M : s->K, br = s->tb ? s->N : s->K, bc = s->tb ? s->K : s->N;
    size_t abytes = (size_t)(s->M * s->K) * 2, bbytes = (size_t)(s->K * s->N) * 2, dbytes = (size_t)(s->M * s->N) * pdde_dtype_size(ddt);
    size_t d_round = (dbytes + 255) & ~(size_t)255; /* (pdde_lowp_copy_offset: what a node writes beside its values starts there) */
    size_t extra = p == GP_LT_BGRAD ? d_round + (size_t)s->N * 4 : cast ? d_round + dbytes / 2 : act == PDDE_MATMUL_GELU ? d_round + dbytes : dbytes;
    size_t set = abytes + bbytes + extra + (act == PDDE_MATMUL_DGELU ? dbytes : 0);
    int sets = set < ((size_t)128 << 20) ? (int)(((size_t)256 << 20) / set) : 1; /* (L2: 50 MB on an H100 / H200) */
    if (sets > 8) sets = 8;
    if (sets < 1) sets = 1;
    void *ha[8] = {0}, *hb[8] = {0}, *hd[8] = {0}, *hx[8] = {0}, *hbias = NULL;
    pdde_tensor A[8], B[8], D[8], bias, Cast[8], X[8]; /* (f32_cast: D's bf16 cast, beside it; DGELU: X, the GELU's input) */
    int ok = 1;
    for (int i = 0; i < sets && ok; i++) {
        ok = !g->b->buffer_alloc(g->dev, abytes, &ha[i]) && !g->b->buffer_alloc(g->dev, bbytes, &hb[i]) && !g->b->buffer_alloc(g->dev, extra, &hd[i]);
        if (!ok) break;
        gemm_fill(g, ha[i], s->M * s->K, PDDE_BF16, 11 + (uint64_t)i), gemm_fill(g, hb[i], s->K * s->N, PDDE_BF16, 101 + (uint64_t)i);
        if (p == GP_LT_BETA1) gemm_fill(g, hd[i], s->M * s->N, PDDE_F32, 1001 + (uint64_t)i);
        gemm_leaf(&A[i], PDDE_BF16, ar, ac, ha[i]), gemm_leaf(&B[i], PDDE_BF16, br, bc, hb[i]);
        gemm_leaf(&D[i], ddt, s->M, s->N, hd[i]);
        if (p == GP_LT_BETA1) { /* acc += op(A) op(B): the accumulation computes its matmul (PDDE_FUSE_GRAD's node) */
            D[i].op = PDDE_OP_GRAD_ACCUM, D[i].nsrc = 3, D[i].src[1] = &A[i], D[i].src[2] = &B[i];
            static pdde_tensor acc[8];
            acc[i] = D[i], acc[i].op = PDDE_OP_NONE, acc[i].nsrc = 0, D[i].src[0] = &acc[i];
        } else {
            D[i].op = PDDE_OP_MATMUL, D[i].nsrc = 2, D[i].src[0] = &A[i], D[i].src[1] = &B[i];
        }
        pdde_op_set_i32(&D[i], PDDE_P_MATMUL_TRANS_A, s->ta), pdde_op_set_i32(&D[i], PDDE_P_MATMUL_TRANS_B, s->tb);
        if (p == GP_LT_BGRAD) pdde_op_set_i32(&D[i], PDDE_P_MATMUL_BGRAD, 1);
        if (act) pdde_op_set_i32(&D[i], PDDE_P_MATMUL_ACT, act);
        if (act == PDDE_MATMUL_DGELU) { /* X of D's shape and dtype */
            ok = !g->b->buffer_alloc(g->dev, dbytes, &hx[i]);
            if (!ok) break;
            gemm_fill(g, hx[i], s->M * s->N, ddt, 3001 + (uint64_t)i);
            gemm_leaf(&X[i], ddt, s->M, s->N, hx[i]);
            D[i].src[D[i].nsrc++] = &X[i];
        }
        if (p == GP_LT_BIAS || act == PDDE_MATMUL_GELU) {
            if (!hbias) {
                ok = !g->b->buffer_alloc(g->dev, (size_t)s->N * 4, &hbias);
                if (ok) gemm_fill(g, hbias, s->N, PDDE_F32, 7);
                gemm_leaf(&bias, PDDE_F32, s->N, 0, hbias);
            }
            D[i].src[D[i].nsrc++] = &bias;
        }
        snprintf(D[i].name, sizeof D[i].name, "%s", s->name);
        if (cast) {
            gemm_leaf(&Cast[i], PDDE_BF16, s->M, s->N, hd[i]);
            Cast[i].offset = (dbytes + 255) & ~(size_t)255, Cast[i].op = PDDE_OP_CAST, Cast[i].nsrc = 1, Cast[i].src[0] = &D[i];
        }
        if (ok && !g->b->supports_op(g->dev, &D[i])) ok = 0;
    }
    double ms = 0;
    if (ok) {
        int calls = 10, runs = 11, k = 0;
        double t[11];
        for (int w = 0; w < 3 && ok; w++, k++) /* (PDDE_CUDA_LT_TUNE tunes here) */
            ok = g->b->compute(g->dev, g->stream, &D[k % sets]) == PDDE_OK && (!cast || g->b->compute(g->dev, g->stream, &Cast[k % sets]) == PDDE_OK);
        g->b->stream_sync(g->dev, g->stream);
        void *e0 = NULL, *e1 = NULL;
        int ev = g->have_events && !g->ev.EventCreate(&e0, 0) && !g->ev.EventCreate(&e1, 0);
        for (int r = 0; r < runs && ok; r++) {
            double h0 = bench_now();
            if (ev) g->ev.EventRecord(e0, g->native);
            for (int c = 0; c < calls && ok; c++, k++)
                ok = g->b->compute(g->dev, g->stream, &D[k % sets]) == PDDE_OK && (!cast || g->b->compute(g->dev, g->stream, &Cast[k % sets]) == PDDE_OK);
            float el = 0;
            if (ev) g->ev.EventRecord(e1, g->native), g->ev.EventSynchronize(e1), g->ev.EventElapsedTime(&el, e0, e1);
            g->b->stream_sync(g->dev, g->stream);
            t[r] = (ev ? (double)el : (bench_now() - h0) * 1e3) / calls;
        }
        if (e0) g->ev.EventDestroy(e0);
        if (e1) g->ev.EventDestroy(e1);
        if (ok) qsort(t, (size_t)runs, sizeof *t, bench_cmp), ms = t[runs / 2];
    }
    for (int i = 0; i < sets; i++) {
        if (ha[i]) g->b->buffer_free(g->dev, ha[i]);
        if (hb[i]) g->b->buffer_free(g->dev, hb[i]);
        if (hd[i]) g->b->buffer_free(g->dev, hd[i]);
        if (hx[i]) g->b->buffer_free(g->dev, hx[i]);
    }
    if (hbias) g->b->buffer_free(g->dev, hbias);
    return ms;
}

/* times[shape][path] for the paths of one set of switches (a fresh context) */
#define GEMM_ENVS 7
static const char *const gemm_env_names[GEMM_ENVS] = {"PDDE_CUDA_LT", "PDDE_CUDA_LT_TUNE", "PDDE_CUDA_GEMMEX_LOWP", "PDDE_CUDA_GEMM_SINGLE",
                                                      "PDDE_CUDA_LT_LOWP_BIAS", "PDDE_CUDA_LT_REDUCTION", "PDDE_CUDA_LT_WORKSPACE"};
static int gemm_run_paths(const char *backend, const char *const env[GEMM_ENVS], const gemm_shape *s, int n, const int *paths, int n_paths,
                          double (*times)[GP_COUNT]) {
    const char *const *names = gemm_env_names;
    for (int i = 0; i < GEMM_ENVS; i++) {
        if (env[i]) setenv(names[i], env[i], 1);
        else unsetenv(names[i]);
    }
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx) != PDDE_OK) return -1;
    int dev = pdde_device_find(ctx, backend, 0);
    gemm_dev g = {0};
    if (dev < 0 || pdde_device_backend(ctx, dev, &g.b, &g.dev) != PDDE_OK || g.b->stream_create(g.dev, &g.stream) != PDDE_OK) {
        pdde_context_free(ctx);
        return -1;
    }
    int idx = 0;
    void *cu = !strcmp(backend, "cuda") ? dlopen("libcuda.so.1", RTLD_NOW) : NULL;
    if (cu && g.b->native && g.b->native(g.dev, g.stream, &g.native, &idx) == PDDE_OK) {
        *(void **)&g.ev.EventCreate = dlsym(cu, "cuEventCreate");
        *(void **)&g.ev.EventDestroy = dlsym(cu, "cuEventDestroy_v2");
        *(void **)&g.ev.EventRecord = dlsym(cu, "cuEventRecord");
        *(void **)&g.ev.EventSynchronize = dlsym(cu, "cuEventSynchronize");
        *(void **)&g.ev.EventElapsedTime = dlsym(cu, "cuEventElapsedTime");
        g.have_events = g.ev.EventCreate && g.ev.EventDestroy && g.ev.EventRecord && g.ev.EventSynchronize && g.ev.EventElapsedTime;
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < n_paths; k++) times[i][paths[k]] = gemm_time(&g, &s[i], paths[k]);
    g.b->stream_free(g.dev, g.stream);
    pdde_context_free(ctx);
    if (cu) dlclose(cu);
    return 0;
}

/* torch's ms a call of each shape and peer, from gemm_torch.py's "TORCH shape=NAME ... ms=X bias_ms=X ..." lines (0: none) */
static int gemm_torch(const gemm_shape *s, int n, double (*peer)[TP_COUNT]) {
    char cmd[4096];
    const char *py = getenv("PDDE_TORCH_PYTHON");
    int len = snprintf(cmd, sizeof cmd, "%s tools/bench/gemm_torch.py --shapes ", py && *py ? py : "python3");
    for (int i = 0; i < n && len < (int)sizeof cmd - 128; i++)
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, "%s%s:%lld:%lld:%lld:%d:%d:%d:%d:%d:%d", i ? "," : "", s[i].name, (long long)s[i].M,
                        (long long)s[i].N, (long long)s[i].K, s[i].ta, s[i].tb, s[i].count, s[i].kind == 0 && s[i].bias, s[i].act, s[i].kind);
    snprintf(cmd + len, sizeof cmd - (size_t)len, " 2>&1");
    FILE *f = popen(cmd, "r");
    if (!f) return -1;
    char line[512];
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        fputs(line, stdout);
        char name[32], key[24];
        double t[TP_COUNT] = {0};
        if (sscanf(line, "TORCH shape=%31s", name) != 1) continue;
        for (int k = 0; k < TP_COUNT; k++) {
            snprintf(key, sizeof key, " %s=", gemm_peer_names[k]);
            char *m = strstr(line, key);
            if (m) t[k] = atof(m + strlen(key));
        }
        for (int i = 0; i < n; i++)
            if (!strcmp(s[i].name, name)) memcpy(peer[i], t, sizeof t), got++;
    }
    pclose(f);
    return got ? 0 : -1;
}

static void bench_gemm(const char *backend, const gpt_config *c) {
    gemm_shape s[16];
    int n = gemm_shapes(c, s);
    double t[16][GP_COUNT], peer[16][TP_COUNT], torch_ms[16] = {0};
    memset(t, 0, sizeof t), memset(peer, 0, sizeof peer);
    static const int def[] = {GP_GEMMEX, GP_F32_CAST, GP_GEMMEX_BF16},
                     lt[] = {GP_LT_BF16, GP_LT_BIAS, GP_LT_BETA1, GP_LT_BGRAD, GP_LT_BIAS_F32, GP_LT_GELU, GP_LT_DGELU, GP_LT_BF16_TN},
                     tuned[] = {GP_LT_BF16_T, GP_LT_BIAS_T, GP_LT_BETA1_T, GP_LT_BGRAD_T}, single[] = {GP_GEMM1}, single_bf16[] = {GP_GEMM1_BF16},
                     lowp_bias[] = {GP_LT_BIAS_LOWP, GP_LT_GELU_LOWP, GP_LT_BIAS_LOWP_TN}, rall[] = {GP_LT_BF16_RALL}, ws1[] = {GP_LT_BF16_WS1};
    printf("GEMMs of a GPT step (layers %d, width %d, vocab %d, B %d, T %d), bf16 operands, on %s\n", c->layers, c->width, c->vocab,
           c->batch, c->ctx, backend);
    /* (each: PDDE_CUDA_LT, _LT_TUNE, _GEMMEX_LOWP, _GEMM_SINGLE, _LT_LOWP_BIAS, _LT_REDUCTION, _LT_WORKSPACE) */
    static const char *const env_def[GEMM_ENVS] = {"0"}, *const env_ex[GEMM_ENVS] = {"0", NULL, "1"}, *const env_lt[GEMM_ENVS] = {"1"},
                             *const env_tuned[GEMM_ENVS] = {"1", "1"}, *const env_single[GEMM_ENVS] = {"0", NULL, NULL, "1"},
                             *const env_single_ex[GEMM_ENVS] = {"0", NULL, "1", "1"}, *const env_lowp_bias[GEMM_ENVS] = {"1", NULL, NULL, NULL, "1"},
                             *const env_rall[GEMM_ENVS] = {"1", NULL, NULL, NULL, NULL, "all"},
                             *const env_ws1[GEMM_ENVS] = {"1", NULL, NULL, NULL, NULL, NULL, "1"};
    if (gemm_run_paths(backend, env_def, s, n, def, 2, t) || gemm_run_paths(backend, env_ex, s, n, def + 2, 1, t) ||
        gemm_run_paths(backend, env_lt, s, n, lt, 8, t) || gemm_run_paths(backend, env_tuned, s, n, tuned, 4, t) ||
        gemm_run_paths(backend, env_single, s, n, single, 1, t) || gemm_run_paths(backend, env_single_ex, s, n, single_bf16, 1, t) ||
        gemm_run_paths(backend, env_lowp_bias, s, n, lowp_bias, 3, t) || gemm_run_paths(backend, env_rall, s, n, rall, 1, t) ||
        gemm_run_paths(backend, env_ws1, s, n, ws1, 1, t)) {
        printf("no %s device\n", backend);
        return;
    }
    for (int i = 0; i < GEMM_ENVS; i++) unsetenv(gemm_env_names[i]);
    int have_torch = !strcmp(backend, "cuda") && gemm_torch(s, n, peer) == 0;
    for (int i = 0; i < n; i++) torch_ms[i] = peer[i][TP_MS];
    double flops_all = 0, ms_def = 0, ms_best = 0, ms_torch = 0, ms_lt = 0, ms_lt_t = 0, torch_flops = 0, ms_single = 0, ms_single_def = 0;
    /* the bf16-output shapes (forward, input gradients): each bf16-out path's total, where it ran every one of them */
    static const int bf16_paths[5] = {GP_F32_CAST, GP_LT_BF16, GP_GEMMEX_BF16, GP_GEMM1_BF16, GP_LT_BF16_T};
    double ms_bf16[6] = {0}, ms_fbias[5] = {0}, ms_rall = 0, ms_rall_base = 0, ms_ws1 = 0, ms_ws_base = 0;
    int miss_bf16[6] = {0}, miss_fbias[5] = {0};
    printf("%-10s %6s %6s %6s %2s %2s %3s", "shape", "M", "N", "K", "ta", "tb", "x");
    for (int p = 0; p < GP_COUNT; p++) printf(" %14s", gemm_path_names[p]);
    printf(" %14s\n", "torch");
    for (int i = 0; i < n; i++) {
        double fl = 2.0 * (double)s[i].M * (double)s[i].N * (double)s[i].K, best = 0;
        printf("%-10s %6lld %6lld %6lld %2d %2d %3d", s[i].name, (long long)s[i].M, (long long)s[i].N, (long long)s[i].K, s[i].ta, s[i].tb, s[i].count);
        for (int p = 0; p < GP_COUNT; p++) {
            if (t[i][p] > 0) printf(" %6.3f/%6.1fT", t[i][p], fl / (t[i][p] * 1e-3) / 1e12);
            else printf(" %14s", "-");
            int extra_work = p == GP_LT_GELU || p == GP_LT_GELU_LOWP || p == GP_LT_DGELU || p == GP_LT_BF16_TN || p == GP_LT_BIAS_LOWP_TN; /* (not this GEMM's time) */
            if (t[i][p] > 0 && !extra_work && (best == 0 || t[i][p] < best)) best = t[i][p];
        }
        if (torch_ms[i] > 0) printf(" %6.3f/%6.1fT", torch_ms[i], fl / (torch_ms[i] * 1e-3) / 1e12);
        printf("\n");
        for (int p = 0; p < GP_COUNT; p++)
            if (t[i][p] > 0) printf("GEMM shape=%s m=%lld n=%lld k=%lld ta=%d tb=%d count=%d path=%s ms=%.4f tflops=%.1f\n", s[i].name, (long long)s[i].M,
                                    (long long)s[i].N, (long long)s[i].K, s[i].ta, s[i].tb, s[i].count, gemm_path_names[p], t[i][p],
                                    fl / (t[i][p] * 1e-3) / 1e12);
        for (int p = 0; p < GP_COUNT; p++) { /* (pdde's path against torch doing the same work) */
            int k = peer[i][gemm_peer(p)] > 0 ? gemm_peer(p) : TP_MS; /* (a peer this torch lacks: its bf16 matmul) */
            double tp = peer[i][k];
            if (t[i][p] > 0 && tp > 0)
                printf("RATIO shape=%s path=%s pdde_ms=%.4f torch_peer=%s torch_ms=%.4f torch_over_pdde=%.3f\n", s[i].name, gemm_path_names[p], t[i][p],
                       gemm_peer_names[k], tp, tp / t[i][p]);
        }
        if (s[i].kind == 0 && s[i].bias) { /* the biased forwards: a step's total on each bias path and torch's F.linear */
            static const int bp[4] = {GP_LT_BIAS, GP_LT_BIAS_LOWP, GP_LT_BIAS_F32, GP_LT_BIAS_LOWP_TN};
            for (int q = 0; q < 5; q++) {
                double v = q < 4 ? t[i][bp[q]] : peer[i][TP_BIAS];
                if (v > 0) ms_fbias[q] += v * s[i].count;
                else miss_fbias[q] = 1;
            }
        }
        if (t[i][GP_LT_BF16] > 0 && t[i][GP_LT_BF16_RALL] > 0) ms_rall_base += t[i][GP_LT_BF16] * s[i].count, ms_rall += t[i][GP_LT_BF16_RALL] * s[i].count;
        if (t[i][GP_LT_BF16] > 0 && t[i][GP_LT_BF16_WS1] > 0) ms_ws_base += t[i][GP_LT_BF16] * s[i].count, ms_ws1 += t[i][GP_LT_BF16_WS1] * s[i].count;
        flops_all += fl * s[i].count, ms_def += t[i][GP_GEMMEX] * s[i].count, ms_best += best * s[i].count;
        if (torch_ms[i] > 0) ms_torch += torch_ms[i] * s[i].count, torch_flops += fl * s[i].count;
        for (int p = GP_LT_BF16; p <= GP_LT_BGRAD; p++)
            if (t[i][p] > 0 && t[i][p + 4] > 0) ms_lt += t[i][p] * s[i].count, ms_lt_t += t[i][p + 4] * s[i].count;
        if (t[i][GP_GEMM1] > 0 && t[i][GP_GEMMEX] > 0) ms_single += t[i][GP_GEMM1] * s[i].count, ms_single_def += t[i][GP_GEMMEX] * s[i].count;
        if (s[i].kind == 2) continue;
        for (int q = 0; q < 6; q++) {
            double v = q < 5 ? t[i][bf16_paths[q]] : torch_ms[i];
            if (v > 0) ms_bf16[q] += v * s[i].count;
            else miss_bf16[q] = 1;
        }
    }
    double tf_def = ms_def > 0 ? flops_all / (ms_def * 1e-3) / 1e12 : 0, tf_best = ms_best > 0 ? flops_all / (ms_best * 1e-3) / 1e12 : 0;
    double tf_torch = ms_torch > 0 ? torch_flops / (ms_torch * 1e-3) / 1e12 : 0;
    printf("a step's GEMMs: %.2f TFLOP; gemmex_f32 %.2f ms, each shape's fastest path %.2f ms%s", flops_all / 1e12, ms_def, ms_best,
           have_torch ? "" : "; torch: not run (python3 with torch and CUDA needed: PDDE_TORCH_PYTHON)");
    if (have_torch) printf(", torch.matmul %.2f ms", ms_torch);
    printf("\n");
    char torch_s[32] = "na", ratio_s[32] = "na", best_s[32] = "na", gain_s[32] = "na";
    if (tf_torch > 0) {
        snprintf(torch_s, sizeof torch_s, "%.1f", tf_torch);
        snprintf(ratio_s, sizeof ratio_s, "%.3f", tf_def / tf_torch);
        snprintf(best_s, sizeof best_s, "%.3f", tf_best / tf_torch);
    }
    if (ms_lt_t > 0) snprintf(gain_s, sizeof gain_s, "%.3f", ms_lt / ms_lt_t);
    char single_s[32] = "na", bf16_s[6][32];
    if (ms_single > 0) snprintf(single_s, sizeof single_s, "%.3f", ms_single_def / ms_single);
    for (int q = 0; q < 6; q++) {
        if (miss_bf16[q] || ms_bf16[q] <= 0) snprintf(bf16_s[q], sizeof bf16_s[q], "na");
        else snprintf(bf16_s[q], sizeof bf16_s[q], "%.2f", ms_bf16[q]);
    }
    printf("the bf16-output GEMMs (forward, input gradients) a step: f32 then cast %s ms, cublasLt %s ms (tuned %s), GemmStridedBatchedEx %s ms, "
           "GemmEx %s ms, torch.matmul %s ms\n", bf16_s[0], bf16_s[1], bf16_s[4], bf16_s[2], bf16_s[3], bf16_s[5]);
    char fbias_s[5][32], rall_s[32] = "na", ws1_s[32] = "na";
    if (ms_ws1 > 0) snprintf(ws1_s, sizeof ws1_s, "%.3f", ms_ws_base / ms_ws1);
    for (int q = 0; q < 5; q++) {
        if (miss_fbias[q] || ms_fbias[q] <= 0) snprintf(fbias_s[q], sizeof fbias_s[q], "na");
        else snprintf(fbias_s[q], sizeof fbias_s[q], "%.2f", ms_fbias[q]);
    }
    if (ms_rall > 0) snprintf(rall_s, sizeof rall_s, "%.3f", ms_rall_base / ms_rall);
    printf("the biased forwards a step: f32 sum then cast %s ms, the bias rounded to bf16 and one cublasLtMatmul into bf16 "
           "(PDDE_CUDA_LT_LOWP_BIAS=1) %s ms (the weight [out, in] as torch's: %s ms), into f32 %s ms, torch F.linear (a bf16 bias, "
           "the weight [out, in]) %s ms; on lt_bf16 the gain of PDDE_CUDA_LT_REDUCTION=all %s, of a 1 MiB workspace %s\n", fbias_s[0],
           fbias_s[1], fbias_s[3], fbias_s[2], fbias_s[4], rall_s, ws1_s);
    printf("RESULT gpu_gemm pdde_tflops=%.1f pdde_best_tflops=%.1f torch_tflops=%s ratio=%s best_ratio=%s lt_tune_gain=%s pdde_ms=%.2f "
           "pdde_best_ms=%.2f single_gain=%s bf16out_f32_cast_ms=%s bf16out_lt_ms=%s bf16out_lt_tuned_ms=%s bf16out_gemmex_ms=%s "
           "bf16out_gemm1_ms=%s bf16out_torch_ms=%s fwd_bias_lt_cast_ms=%s fwd_bias_lt_lowp_ms=%s fwd_bias_lt_lowp_tn_ms=%s fwd_bias_lt_f32_ms=%s "
           "fwd_bias_torch_ms=%s reduction_all_gain=%s workspace_1mib_gain=%s\n", tf_def, tf_best, torch_s, ratio_s, best_s, gain_s, ms_def, ms_best,
           single_s, bf16_s[0], bf16_s[1], bf16_s[4], bf16_s[2], bf16_s[3], bf16_s[5], fbias_s[0], fbias_s[1], fbias_s[3], fbias_s[2], fbias_s[4], rall_s,
           ws1_s);
}
