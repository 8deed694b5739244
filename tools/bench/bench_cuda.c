/* bench_cuda — throughput of pdde's CUDA backend next to cuBLAS called directly, on the first CUDA device.
 *
 *   bench_cuda [--quick | --gpt [--dtype f32|bf16] [--unfused-graph] | --attention [--dtype f32|bf16] [--packed] [--doc-every N]]
 *   bench_cuda --gpt [--dtype f32|bf16] --predict cluster.json [--predict-only] [--device cuda|opencl|cpu]
 *              [--model layers=N,width=N,heads=N,ctx=N,vocab=N,batch=N] [--steps N]
 *   bench_cuda --gpt [--dtype f32|bf16] --cluster cluster.json   PDDE_PROFILE=device's peaks from a measured cluster
 *   bench_cuda --probe [--device NAME]      the device it would run on, or "no ... device"
 *   bench_cuda --gemm [--device NAME] [--model ...]   the GEMMs of a GPT step, pdde's paths and torch.matmul
 *              (tools/bench/bench_cuda_gemm.h: per shape ms and TFLOP/s, RESULT gpu_gemm)
 *
 * GEMM (f32, row-major C = A B): pdde's matmul node through a session (cuBLAS underneath, then the
 * built-in tiled kernel as on a machine without cuBLAS) against cublasSgemm on the same sizes.
 * Elementwise: pdde's add and scale nodes against cublasSaxpy / cublasSscal (the same bytes moved),
 * and a few row ops for reference. Then one GPT training step (forward, backward, AdamW) on the GPU.
 * --gpt: only the GPT-2 124M step (B 8, T 1024), under the compute dtype given (mixed precision), with
 * pdde_attention (its path: PDDE_CUDA_ATTENTION) or, --unfused-graph, the attention as matmul, causal
 * softmax and matmul nodes; prints a "GPT ..." line for tools/gpu-check.sh (casts_per_step: the casts run
 * a step after the first, pdde_session_op_runs; PDDE_FOLD_CASTS sets whether weights' bf16 copies are kept
 * and casts folded into their producers). PDDE_PROFILE=device adds a "PROFILE device busy_ms=.. wall_ms=..
 * idle_pct=.. host_issue_ms=.. ops=.. host_wait_ms=.. bytes=.. flops=.. [bound_ms=.. over_bound_ms=.. peaks=..]" line
 * (pdde_session_device_profile: per step, the first left out; the per-op table and its "PROFILE op" lines go to
 * stderr when the session is freed); --cluster FILE gives the session a cluster pdde-bench measured, whose
 * peaks the profile's bound takes where it measured the device (else PDDE_PROFILE_PEAKS).
 * --attention: causal attention alone, forward and backward (B 8, H 12, T 1024, D 64; q, k, v f32 leaves
 * converted under the compute dtype, loss sum(y * w)), median ms; prints an "ATTENTION ..." line. --packed:
 * one f32 leaf qkv [B, T, H*3*D] and pdde_attention_qkv (the GPT block's layout) instead; --doc-every N: documents of N
 * tokens packed in each row kept apart (pdde_attention_docs: key tiles before a query tile's documents skipped).
 * --predict FILE: before the steps, the cost model's step time for the same graph on FILE's device of
 * that backend (pdde-bench's calibration; the session's program as it lowers it, simulated), printed
 * as a "PREDICT ms=.." line with the time by op class; --predict-only stops there (no device needed).
 * --device runs it on another backend's first device, --model another GPT (tools/bench/costmodel_gpu.sh
 * checks the script's pipeline that way where there is no GPU).
 * Times are medians of timed repetitions after warm-up, each repetition synchronised.
 * Prints "no CUDA device" and exits 0 where there is none. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench_common.h"

/* cuBLAS and the driver, called directly for the reference numbers. */
typedef struct {
    int (*MemAlloc)(unsigned long long *, size_t);
    int (*MemFree)(unsigned long long);
    int (*CtxSynchronize)(void);
    int (*MemsetD32)(unsigned long long, unsigned, size_t);
    void *handle;
    int (*Create)(void **);
    int (*Destroy)(void *);
    int (*Sgemm)(void *, int, int, int, int, int, const float *, const float *, int, const float *, int, const float *,
                 float *, int);
    int (*Saxpy)(void *, int, const float *, const float *, int, float *, int);
    int (*Sscal)(void *, int, const float *, float *, int);
} direct_api;

static int direct_open(direct_api *d) {
    memset(d, 0, sizeof *d);
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    void *bl = NULL;
    const char *names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so", "/usr/local/cuda/lib64/libcublas.so.13",
                           "/usr/local/cuda/lib64/libcublas.so.12"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !bl; i++) bl = dlopen(names[i], RTLD_NOW);
    if (!cu || !bl) return -1;
    *(void **)&d->MemAlloc = dlsym(cu, "cuMemAlloc_v2");
    *(void **)&d->MemFree = dlsym(cu, "cuMemFree_v2");
    *(void **)&d->CtxSynchronize = dlsym(cu, "cuCtxSynchronize");
    *(void **)&d->MemsetD32 = dlsym(cu, "cuMemsetD32_v2");
    *(void **)&d->Create = dlsym(bl, "cublasCreate_v2");
    *(void **)&d->Destroy = dlsym(bl, "cublasDestroy_v2");
    *(void **)&d->Sgemm = dlsym(bl, "cublasSgemm_v2");
    *(void **)&d->Saxpy = dlsym(bl, "cublasSaxpy_v2");
    *(void **)&d->Sscal = dlsym(bl, "cublasSscal_v2");
    if (!d->MemAlloc || !d->Create || !d->Sgemm || !d->Saxpy || !d->Sscal || !d->CtxSynchronize) return -1;
    return d->Create(&d->handle) == 0 ? 0 : -1;
}

/* median seconds of fn over reps after warm */
typedef void (*bench_fn)(void *arg);
static double time_median(bench_fn fn, void *arg, int warm, int reps, void (*sync)(void *), void *sarg) {
    for (int i = 0; i < warm; i++) fn(arg);
    sync(sarg);
    double t[64];
    if (reps > 64) reps = 64;
    for (int i = 0; i < reps; i++) {
        double t0 = bench_now();
        fn(arg);
        sync(sarg);
        t[i] = bench_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof *t, bench_cmp);
    return t[reps / 2];
}

#include "bench_cuda_gemm.h"

/* ---- pdde: a one-node graph in a session ---- */
typedef struct {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    int ok;
} one_node;

static void run_session(void *arg) {
    one_node *o = arg;
    if (pdde_session_run(o->s, PDDE_RUN_FORWARD) != PDDE_OK) o->ok = 0;
}
static void no_sync(void *arg) { (void)arg; } /* session runs end synchronised */

static void fill_inputs(one_node *o, int n_in, pdde_tensor **in) {
    for (int i = 0; i < n_in; i++) {
        int64_t n = pdde_tensor_numel(in[i]);
        float *v = malloc((size_t)n * 4);
        for (int64_t k = 0; k < n; k++) v[k] = (float)((k * 37 + i) % 101) / 101.0f - 0.5f;
        pdde_session_write(o->s, in[i], v, (size_t)n * 4);
        free(v);
    }
}

static int session_open(one_node *o, int dev, pdde_tensor *y, int n_in, pdde_tensor **in) {
    pdde_mark_output(y);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev;
    if (pdde_session_init(o->g, &sp, &o->s) != PDDE_OK) {
        fprintf(stderr, "session: %s\n", pdde_last_error(o->ctx));
        return -1;
    }
    fill_inputs(o, n_in, in);
    o->ok = 1;
    return 0;
}

static void session_close(one_node *o) {
    pdde_session_free(o->s);
    pdde_graph_free(o->g);
    o->s = NULL, o->g = NULL;
}

static double pdde_gemm(pdde_context *ctx, int dev, int64_t M, int64_t N, int64_t K, int reps) {
    one_node o = {.ctx = ctx};
    pdde_graph_init(ctx, &o.g);
    pdde_tensor *in[2] = {pdde_input(o.g, "a", PDDE_F32, 2, (int64_t[]){M, K}),
                          pdde_input(o.g, "b", PDDE_F32, 2, (int64_t[]){K, N})};
    if (session_open(&o, dev, pdde_matmul(o.g, in[0], in[1], 0, 0), 2, in)) return 0;
    double t = time_median(run_session, &o, 3, reps, no_sync, NULL);
    session_close(&o);
    return o.ok ? 2.0 * (double)M * (double)N * (double)K / t / 1e12 : 0;
}

/* ---- cuBLAS direct ---- */
typedef struct {
    direct_api *d;
    int M, N, K;
    unsigned long long a, b, c;
    int n;
    int op;
} direct_job;

static void direct_sync(void *arg) { ((direct_api *)arg)->CtxSynchronize(); }

static void direct_gemm_fn(void *arg) {
    direct_job *j = arg;
    float one = 1.0f, zero = 0.0f;
    /* row-major C[M,N] = A[M,K] B[K,N] as column-major C^T = B^T A^T */
    j->d->Sgemm(j->d->handle, 0, 0, j->N, j->M, j->K, &one, (const float *)(uintptr_t)j->b, j->N,
                (const float *)(uintptr_t)j->a, j->K, &zero, (float *)(uintptr_t)j->c, j->N);
}

static void direct_elem_fn(void *arg) {
    direct_job *j = arg;
    float s = 1.0001f;
    if (j->op == 0) j->d->Saxpy(j->d->handle, j->n, &s, (const float *)(uintptr_t)j->a, 1, (float *)(uintptr_t)j->b, 1);
    else j->d->Sscal(j->d->handle, j->n, &s, (float *)(uintptr_t)j->a, 1);
}

static double direct_gemm(direct_api *d, int M, int N, int K, int reps) {
    direct_job j = {.d = d, .M = M, .N = N, .K = K};
    if (d->MemAlloc(&j.a, (size_t)M * K * 4) || d->MemAlloc(&j.b, (size_t)K * N * 4) || d->MemAlloc(&j.c, (size_t)M * N * 4))
        return 0;
    d->MemsetD32(j.a, 0x3c000000u, (size_t)M * K); /* 2^-7: finite, nonzero */
    d->MemsetD32(j.b, 0x3c000000u, (size_t)K * N);
    double t = time_median(direct_gemm_fn, &j, 3, reps, direct_sync, d);
    d->MemFree(j.a), d->MemFree(j.b), d->MemFree(j.c);
    return 2.0 * M * (double)N * K / t / 1e12;
}

static double direct_elem(direct_api *d, int n, int op, int reps) {
    direct_job j = {.d = d, .n = n, .op = op};
    if (d->MemAlloc(&j.a, (size_t)n * 4) || d->MemAlloc(&j.b, (size_t)n * 4)) return 0;
    d->MemsetD32(j.a, 0x3f800000u, (size_t)n);
    d->MemsetD32(j.b, 0x3f800000u, (size_t)n);
    double t = time_median(direct_elem_fn, &j, 3, reps, direct_sync, d);
    d->MemFree(j.a), d->MemFree(j.b);
    double bytes = op == 0 ? 3.0 * n * 4 : 2.0 * n * 4;
    return bytes / t / 1e9;
}

/* pdde elementwise / row ops on [rows, C]; returns GB/s counting the bytes each op must move */
static double pdde_elem(pdde_context *ctx, int dev, const char *op, int64_t rows, int64_t C, int reps) {
    one_node o = {.ctx = ctx};
    pdde_graph_init(ctx, &o.g);
    pdde_tensor *in[3];
    int n_in = 1;
    in[0] = pdde_input(o.g, "a", PDDE_F32, 2, (int64_t[]){rows, C});
    pdde_tensor *y;
    double passes;
    if (!strcmp(op, "add")) {
        in[1] = pdde_input(o.g, "b", PDDE_F32, 2, (int64_t[]){rows, C}), n_in = 2;
        y = pdde_add(o.g, in[0], in[1]), passes = 3;
    } else if (!strcmp(op, "bias_add")) {
        in[1] = pdde_input(o.g, "b", PDDE_F32, 1, (int64_t[]){C}), n_in = 2;
        y = pdde_add(o.g, in[0], in[1]), passes = 2;
    } else if (!strcmp(op, "scale")) y = pdde_scale(o.g, in[0], 1.0001f), passes = 2;
    else if (!strcmp(op, "gelu")) y = pdde_gelu(o.g, in[0]), passes = 2;
    else if (!strcmp(op, "softmax")) y = pdde_softmax(o.g, in[0], 0), passes = 2;
    else if (!strcmp(op, "sum_rows")) y = pdde_sum(o.g, in[0], 0, 0), passes = 1;
    else {
        in[1] = pdde_input(o.g, "g", PDDE_F32, 1, (int64_t[]){C});
        in[2] = pdde_input(o.g, "b", PDDE_F32, 1, (int64_t[]){C}), n_in = 3;
        y = pdde_layernorm(o.g, in[0], in[1], in[2], 1e-5f), passes = 2;
    }
    if (session_open(&o, dev, y, n_in, in)) return 0;
    double t = time_median(run_session, &o, 3, reps, no_sync, NULL);
    session_close(&o);
    return o.ok ? passes * (double)rows * (double)C * 4 / t / 1e9 : 0;
}

/* "layers=N,width=N,..." onto c; 0 on success. */
static int parse_model(const char *spec, gpt_config *c) {
    for (const char *s = spec; *s;) {
        char key[16];
        int v = 0, n = 0;
        if (sscanf(s, "%15[a-z]=%d%n", key, &v, &n) != 2 || v < 1) return -1;
        int *f = !strcmp(key, "layers") ? &c->layers : !strcmp(key, "width") ? &c->width : !strcmp(key, "heads") ? &c->heads
               : !strcmp(key, "ctx") ? &c->ctx : !strcmp(key, "vocab") ? &c->vocab : !strcmp(key, "batch") ? &c->batch : NULL;
        if (!f) return -1;
        *f = v, s += n;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return c->width % c->heads ? -1 : 0;
}

/* The cost model's step of g (run by a session with sp) on the first device of `backend` in the cluster
 * file: a PREDICT line, and the time of each op class; 0 on success. */
static int predict_step(pdde_context *ctx, const pdde_graph *g, const pdde_session_params *sp, const char *path, const char *backend) {
    pdde_cluster *cl = NULL;
    pdde_cost_program *cp = NULL;
    pdde_cost_result *res = NULL;
    int id = -1;
    pdde_status st = pdde_cluster_load(ctx, path, &cl);
    for (int m = 0; !st && m < cl->n_machines && id < 0; m++)
        for (int d = 0; d < cl->machines[m].n_devices && id < 0; d++)
            if (!strcmp(cl->specs[cl->machines[m].devices[d].spec].backend, backend)) id = cl->machines[m].devices[d].id;
    if (!st && id < 0) st = pdde_error(ctx, PDDE_ERR_NOT_FOUND, "%s has no %s device", path, backend);
    pdde_cost_plan plan = {0, &id, NULL, 0};
    if (!st) st = pdde_cost_program_from_plan(cl, g, sp, &plan, &cp);
    if (!st) st = pdde_cost_simulate(ctx, cl, cp, &res);
    if (st) {
        fprintf(stderr, "predict: %s\n", pdde_last_error(ctx));
        pdde_cluster_free(cl);
        return 1;
    }
    double by_class[PDDE_OPCLASS_COUNT] = {0}, attention[2] = {0, 0};
    int count[PDDE_OPCLASS_COUNT] = {0};
    for (int i = 0; i < pdde_cost_program_op_count(cp, 0); i++) {
        const pdde_cost_op *op = pdde_cost_program_op(cp, 0, i);
        if (op->kind != PDDE_COST_COMPUTE) continue;
        double t = pdde_cost_compute_time(ctx, cl, op->placed ? op->placed_device : id, op);
        if (!isfinite(t)) continue;
        if (op->softmax_bytes > 0) attention[op->softmax_backward] += t;
        else by_class[op->op_class] += t, count[op->op_class]++;
    }
    printf("predicted on %s (%s):", path, cl->specs[pdde_cluster_find_device(cl, id, NULL)->spec].name);
    for (int k = 0; k < PDDE_OPCLASS_COUNT; k++)
        if (count[k]) printf(" %s %.2f ms (%d)", pdde_op_class_name((pdde_op_class)k), by_class[k] * 1e3, count[k]);
    printf(" attention %.2f ms, its backward %.2f ms%s\n", attention[0] * 1e3, attention[1] * 1e3,
           res->uncalibrated ? " (some ops from peak figures: uncalibrated)" : "");
    printf("PREDICT ms=%.2f compute_ms=%.2f uncalibrated=%d\n", res->step_time * 1e3, res->compute_time[0] * 1e3, res->uncalibrated);
    pdde_cost_result_free(res);
    pdde_cost_program_free(cp);
    pdde_cluster_free(cl);
    return 0;
}

typedef struct {
    const char *predict, *backend; /* --predict FILE, the device's backend */
    const char *cluster;           /* --cluster FILE: the session's (PDDE_PROFILE=device's peaks) */
    int predict_only, steps;
    gpt_config model;
} gpt_options;

static void bench_gpt(pdde_context *ctx, int dev, int quick, pdde_dtype dt, int unfused_graph, const gpt_options *o) {
    gpt_config c = {.vocab = 50304, .ctx = 1024, .layers = quick ? 2 : 12, .heads = 12, .width = 768, .batch = 8,
                    .unfused_attention = unfused_graph};
    if (o) c = o->model, c.unfused_attention = unfused_graph;
    c.separate_qkv = gpt_separate_qkv("cuda");
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    if (pdde_graph_set_compute_dtype(g, dt) || gpt_build(g, &c, &m) || pdde_graph_set_compute_dtype(g, PDDE_F32) ||
        pdde_backward(g, m.loss) || pdde_optimizer_adamw(g, &op)) {
        fprintf(stderr, "gpt: %s\n", pdde_last_error(ctx));
        pdde_graph_free(g);
        return;
    }
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev;
    if (o && o->predict && (predict_step(ctx, g, &sp, o->predict, o->backend) || o->predict_only)) {
        pdde_graph_free(g);
        return;
    }
    pdde_cluster *cl = NULL;
    if (o && o->cluster && pdde_cluster_load(ctx, o->cluster, &cl) != PDDE_OK)
        fprintf(stderr, "--cluster %s: %s (the profile goes on without it)\n", o->cluster, pdde_last_error(ctx));
    sp.cluster = cl;
    pdde_session *s;
    pdde_status st_init = pdde_session_init(g, &sp, &s);
    pdde_cluster_free(cl); /* (read at the session's start only) */
    if (st_init != PDDE_OK) {
        fprintf(stderr, "gpt session: %s\n", pdde_last_error(ctx));
        pdde_graph_free(g);
        return;
    }
    int BT = c.batch * c.ctx;
    int32_t *x = malloc((size_t)BT * 4), *y = malloc((size_t)BT * 4);
    double t[64];
    int steps = o && o->steps ? o->steps : 8, ok = 1;
    float loss0 = 0, loss = 0;
    int64_t casts0 = 0; /* the casts that ran after the first step (which casts the kept weight copies) */
    for (int st = 0; st < steps + 2 && ok; st++) {
        int ids = c.vocab < 1000 ? c.vocab : 1000; /* (ids and targets inside the vocabulary) */
        for (int i = 0; i < BT; i++) x[i] = (i * 7 + st * 13) % ids, y[i] = (x[i] + 1) % ids; /* learnable */
        pdde_session_write(s, m.ids, x, (size_t)BT * 4);
        pdde_session_write(s, m.targets, y, (size_t)BT * 4);
        double t0 = bench_now();
        ok = pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK;
        if (st >= 2) t[st - 2] = bench_now() - t0;
        if (st == 0) loss0 = pdde_session_loss(s), casts0 = pdde_session_op_runs(s, PDDE_OP_CAST);
        loss = pdde_session_loss(s);
    }
    double casts = (double)(pdde_session_op_runs(s, PDDE_OP_CAST) - casts0) / (steps + 1);
    if (!ok) fprintf(stderr, "gpt step: %s\n", pdde_last_error(ctx));
    else {
        qsort(t, (size_t)steps, sizeof *t, bench_cmp);
        double ms = t[steps / 2] * 1e3, n_params = (double)gpt_n_params(&c);
        /* model FLOPs per token: 6N for the weights' products (forward and backward), 12 L C T for the
         * attention's (PaLM's accounting), against 989 TFLOP/s (dense bf16 of an H100/H200) */
        double flops_tok = 6.0 * n_params + 12.0 * c.layers * c.width * c.ctx, tok_s = BT / (ms / 1e3);
        const char *path = getenv("PDDE_CUDA_ATTENTION");
        printf("gpt step (L=%d C=%d T=%d B=%d V=%d, %.0fM params, AdamW, %s): %.1f ms, %.0f tokens/s, loss %.3f -> %.3f\n",
               c.layers, c.width, c.ctx, c.batch, c.vocab, n_params / 1e6, pdde_dtype_name(dt), ms, tok_s, loss0, loss);
        printf("GPT dtype=%s attention=%s ms=%.2f tok_s=%.0f mfu_pct=%.2f loss0=%.5f loss=%.5f casts_per_step=%.0f\n", pdde_dtype_name(dt),
               unfused_graph ? "graph" : path && *path ? path : "default", ms, tok_s, 100.0 * tok_s * flops_tok / 989e12,
               loss0, loss, casts);
        pdde_device_profile pr; /* PDDE_PROFILE=device: where the step's time goes on the device */
        if (pdde_session_device_profile(s, &pr) == PDDE_OK) {
            printf("PROFILE device busy_ms=%.3f wall_ms=%.3f idle_pct=%.1f host_issue_ms=%.3f ops=%.0f host_wait_ms=%.3f bytes=%.0f flops=%.0f",
                   pr.busy_ms, pr.wall_ms, pr.idle_pct, pr.host_issue_ms, pr.ops, pr.host_wait_ms, pr.bytes, pr.flops);
            if (pr.peaks)
                printf(" bound_ms=%.3f over_bound_ms=%.3f peaks=%s", pr.bound_ms, pr.over_bound_ms,
                       pr.peaks == 1 ? "cluster" : pr.peaks == 2 ? "env" : "cluster+env");
            printf("\n");
        }
    }
    free(x);
    free(y);
    pdde_session_free(s);
    pdde_graph_free(g);
}

/* Attention alone, forward and backward, as in a training graph: f32 q, k, v leaves converted under the
 * compute dtype, y = attention(q, k, v), loss = sum(y * w); tools/bench/attention_torch.py times the same
 * in PyTorch (SDPA). */
static void bench_attention(pdde_context *ctx, int dev, pdde_dtype dt, int packed, int doc_every) {
    int64_t s[4] = {8, 12, 1024, 64}, sy[3] = {8, 1024, 12 * 64};
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *q = NULL, *k = NULL, *v = NULL, *qkv = NULL, *y;
    if (packed) qkv = pdde_param(g, "qkv", 3, (int64_t[]){8, 1024, 12 * 3 * 64}, 1.0f);
    else q = pdde_param(g, "q", 4, s, 1.0f), k = pdde_param(g, "k", 4, s, 1.0f), v = pdde_param(g, "v", 4, s, 1.0f);
    pdde_tensor *w = packed ? pdde_input(g, "w", PDDE_F32, 3, sy) : pdde_input(g, "w", PDDE_F32, 4, s);
    pdde_tensor *starts = doc_every > 0 ? pdde_input(g, "starts", PDDE_I32, 2, (int64_t[]){8, 1024}) : NULL;
    pdde_graph_set_compute_dtype(g, dt);
    if (starts) y = packed ? pdde_attention_qkv_docs(g, qkv, 12, starts) : pdde_attention_docs(g, q, k, v, starts);
    else y = packed ? pdde_attention_qkv(g, qkv, 12) : pdde_attention(g, q, k, v);
    pdde_graph_set_compute_dtype(g, PDDE_F32);
    pdde_tensor *loss = pdde_sum(g, pdde_mul(g, y, w), -1, 0);
    if (!loss || pdde_backward(g, loss) != PDDE_OK) {
        fprintf(stderr, "attention graph: %s\n", pdde_last_error(ctx));
        pdde_graph_free(g);
        return;
    }
    one_node o = {.ctx = ctx, .g = g};
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = dev;
    if (pdde_session_init(g, &sp, &o.s) != PDDE_OK) {
        fprintf(stderr, "attention session: %s\n", pdde_last_error(ctx));
        pdde_graph_free(g);
        return;
    }
    pdde_tensor *in[1] = {w};
    fill_inputs(&o, 1, in);
    o.ok = 1;
    if (starts) { /* (document b * 1024 + t: it starts at t - t % doc_every) */
        int32_t st[8 * 1024];
        for (int i = 0; i < 8 * 1024; i++) st[i] = i % 1024 / doc_every * doc_every;
        o.ok = pdde_session_write(o.s, starts, st, sizeof st) == PDDE_OK;
    }
    double t[32];
    int reps = 20;
    for (int i = 0; i < reps + 3 && o.ok; i++) {
        double t0 = bench_now();
        if (pdde_session_run(o.s, PDDE_RUN_FORWARD_BACKWARD) != PDDE_OK) o.ok = 0;
        if (i >= 3) t[i - 3] = bench_now() - t0;
    }
    if (!o.ok) fprintf(stderr, "attention run: %s\n", pdde_last_error(ctx));
    else {
        qsort(t, (size_t)reps, sizeof *t, bench_cmp);
        const char *path = getenv("PDDE_CUDA_ATTENTION"), *variant = getenv("PDDE_FLASH2_VARIANT"); /* (both read by the backend) */
        printf("ATTENTION dtype=%s attention=%s flash2_variant=%s layout=%s B=8 H=12 T=1024 D=64 doc_every=%d fwd_bwd_ms=%.3f loss=%.6g\n",
               pdde_dtype_name(dt), path && *path ? path : "default", variant && *variant ? variant : "none", packed ? "packed" : "apart",
               doc_every, t[reps / 2] * 1e3, pdde_session_loss(o.s));
    }
    session_close(&o);
}

int main(int argc, char **argv) {
    int quick = 0, gpt_only = 0, attention_only = 0, unfused_graph = 0, probe = 0, packed = 0, gemm_only = 0, doc_every = 0;
    pdde_dtype dt = PDDE_F32;
    gpt_options o = {.backend = "cuda"}; /* (o.model: GPT-2 124M, where --model changes what it names) */
    o.model = (gpt_config){.vocab = 50304, .ctx = 1024, .layers = 12, .heads = 12, .width = 768, .batch = 8};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = 1;
        else if (!strcmp(argv[i], "--gpt")) gpt_only = 1;
        else if (!strcmp(argv[i], "--attention")) attention_only = 1;
        else if (!strcmp(argv[i], "--unfused-graph")) unfused_graph = 1;
        else if (!strcmp(argv[i], "--packed")) packed = 1;
        else if (!strcmp(argv[i], "--doc-every") && i + 1 < argc && atoi(argv[i + 1]) > 0) doc_every = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) dt = !strcmp(argv[++i], "bf16") ? PDDE_BF16 : PDDE_F32;
        else if (!strcmp(argv[i], "--predict") && i + 1 < argc) o.predict = argv[++i];
        else if (!strcmp(argv[i], "--predict-only")) o.predict_only = 1;
        else if (!strcmp(argv[i], "--cluster") && i + 1 < argc) o.cluster = argv[++i];
        else if (!strcmp(argv[i], "--probe")) probe = 1;
        else if (!strcmp(argv[i], "--gemm")) gemm_only = 1;
        else if (!strcmp(argv[i], "--device") && i + 1 < argc) o.backend = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc && atoi(argv[i + 1]) > 0 && atoi(argv[i + 1]) <= 64) o.steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc && !parse_model(argv[i + 1], &o.model)) i++;
        else {
            fprintf(stderr, "usage: bench_cuda [--quick | --gpt [--dtype f32|bf16] [--unfused-graph] | --attention [--dtype f32|bf16] [--packed] [--doc-every N]]\n"
                            "       bench_cuda --gemm [--device cuda|opencl] [--model ...]\n"
                            "       bench_cuda --gpt [--dtype f32|bf16] --predict cluster.json [--predict-only] [--device cuda|opencl|cpu]\n"
                            "       bench_cuda --gpt ... --cluster cluster.json   (PDDE_PROFILE=device: the bound at its measured peaks)\n"
                            "                  [--model layers=N,width=N,heads=N,ctx=N,vocab=N,batch=N] [--steps 1..64]\n");
            return 2;
        }
    }
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx) != PDDE_OK) return 1;
    int dev = pdde_device_find(ctx, o.backend, 0);
    if (dev < 0 && gpt_only && o.predict_only && !probe) dev = 0; /* (the prediction needs no device) */
    if (dev < 0) {
        printf("no %s device\n", !strcmp(o.backend, "cuda") ? "CUDA" : o.backend);
        pdde_context_free(ctx);
        return 0;
    }
    pdde_device_props p;
    pdde_device_get_props(ctx, dev, &p);
    printf("device: %s, %d SMs, %.1f TFLOP/s f32 (peak from clocks), %.0f GB/s\n", p.name, p.compute_units,
           p.peak_flops_f32 / 1e12, p.mem_bandwidth / 1e9);
    if (probe) return pdde_context_free(ctx), 0;
    if (gemm_only) { /* (each set of switches in a context of its own) */
        pdde_context_free(ctx);
        bench_gemm(o.backend, &o.model);
        return 0;
    }
    if (gpt_only || attention_only) { /* PDDE_PROFILE=1 or =device adds the time per op; PDDE_CUDA_TF32=1 lets cuBLAS use TF32 */
        if (gpt_only) bench_gpt(ctx, dev, 0, dt, unfused_graph, &o);
        else bench_attention(ctx, dev, dt, packed, doc_every);
        pdde_context_free(ctx);
        return 0;
    }
    int reps = quick ? 5 : 20;
    static const int sizes[][3] = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 4096, 4096}, {8192, 8192, 8192},
                                   {8192, 3072, 768},  {8192, 768, 3072},  {8192, 50304, 768}};
    int n_sizes = quick ? 3 : (int)(sizeof sizes / sizeof sizes[0]);
    double pd[16] = {0};
    for (int i = 0; i < n_sizes; i++) pd[i] = pdde_gemm(ctx, dev, sizes[i][0], sizes[i][1], sizes[i][2], reps);
    /* the direct calls run in the primary context the backend made current on this thread */
    direct_api d;
    int have_direct = direct_open(&d) == 0;
    printf("\nGEMM f32 (TFLOP/s)          pdde(cuBLAS)  cuBLAS direct\n");
    for (int i = 0; i < n_sizes; i++)
        printf("  %5d x %5d x %5d        %8.2f      %8.2f\n", sizes[i][0], sizes[i][1], sizes[i][2], pd[i],
               have_direct ? direct_gemm(&d, sizes[i][0], sizes[i][1], sizes[i][2], reps) : 0.0);
    int64_t rows = 8192, C = 4096; /* 32M floats, 128 MB a tensor */
    printf("\nelementwise, %lld x %lld f32 (GB/s)\n", (long long)rows, (long long)C);
    printf("  pdde add %8.0f    cublasSaxpy %8.0f\n", pdde_elem(ctx, dev, "add", rows, C, reps),
           have_direct ? direct_elem(&d, (int)(rows * C), 0, reps) : 0.0);
    printf("  pdde scale %6.0f    cublasSscal %8.0f\n", pdde_elem(ctx, dev, "scale", rows, C, reps),
           have_direct ? direct_elem(&d, (int)(rows * C), 1, reps) : 0.0);
    const char *ops[] = {"bias_add", "gelu", "softmax", "layernorm", "sum_rows"};
    for (int i = 0; i < 5; i++) printf("  pdde %-10s %8.0f\n", ops[i], pdde_elem(ctx, dev, ops[i], rows, C, reps));
    if (have_direct) d.Destroy(d.handle);
    bench_gpt(ctx, dev, quick, PDDE_F32, 0, NULL);
    pdde_context_free(ctx);

    /* the built-in GEMM kernel (what runs where cuBLAS is absent) */
    setenv("PDDE_CUDA_NO_CUBLAS", "1", 1);
    pdde_context_init(NULL, &ctx);
    dev = pdde_device_find(ctx, "cuda", 0);
    printf("\nGEMM f32, built-in kernel (TFLOP/s)\n");
    for (int i = 0; i < (quick ? 2 : 5); i++)
        printf("  %5d x %5d x %5d        %8.2f\n", sizes[i][0], sizes[i][1], sizes[i][2],
               pdde_gemm(ctx, dev, sizes[i][0], sizes[i][1], sizes[i][2], quick ? 3 : 5));
    pdde_context_free(ctx);
    return 0;
}
