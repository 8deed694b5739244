/* test_profile_roofline — PDDE_PROFILE=device's bytes, FLOPs and bound per op, on the OpenCL device (PoCL
 * in CI): a forward pass of y = x w ([64, 128] x [128, 96], f32) and two elementwise products z = (y b) b.
 *  - each op's bytes and FLOPs in its "PROFILE op" line are the cost model's counts exactly: the matmul
 *    4 (64*128 + 128*96 + 64*96) bytes and 2*64*96*128 FLOPs, each product 3 * 4 * 64*96 bytes and none;
 *    the "PROFILE device" line's bytes and FLOPs are their sums;
 *  - GB/s and TFLOP/s are those over the op's device ms;
 *  - with PDDE_PROFILE_PEAKS=GBPS,TFLOPS[,F32_TFLOPS] each op's bound is max(bytes / bandwidth, FLOPs /
 *    the GEMM rate of its dtype) summed over its nodes (the f32 matmul at the third figure where given,
 *    else the second), the device line's bound_ms their sum and over_bound_ms the ops' ms less it;
 *  - a cluster pdde-bench measured the device in (pdde_session_params.cluster) gives the peaks instead:
 *    its best f32 GEMM rate and memory bandwidth; a cluster that did not measure it (no GEMMs, or another
 *    backend at that id) leaves them to PDDE_PROFILE_PEAKS;
 *  - without peaks, and with a bad PDDE_PROFILE_PEAKS (said once, at the session's start), there is no
 *    bound column and no bound_ms, and the runs go on;
 *  - without PDDE_PROFILE nothing of this is printed;
 *  - a training step of an MLP (bias, relu, cross-entropy, backward, AdamW's multi-tensor update): each
 *    op's bytes and FLOPs are the sums of the cost model's simulated program of the same session on that
 *    device (pdde_cost_program_from_plan: the program as the session lowers it; the update group is its
 *    nodes).
 */
#define _GNU_SOURCE /* setenv, dup */
#include "pdde.h"
#include "tests/test_util.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define M 64
#define K 128
#define N 96
#define RUNS 3

static const double MATMUL_BYTES = 4.0 * (M * K + K * N + M * N), MATMUL_FLOPS = 2.0 * M * N * K, MUL_BYTES = 3 * 4.0 * M * N;

typedef struct {
    int ok;
    char init_err[4096]; /* what pdde_session_init wrote to stderr */
    char report[16384];  /* what pdde_session_free wrote */
    pdde_device_profile prof;
} run_result;

static int capture_begin(FILE **f) {
    fflush(stderr);
    *f = tmpfile();
    int saved = dup(2);
    if (*f) dup2(fileno(*f), 2);
    return saved;
}

static void capture_end(int saved, FILE *f, char *out, size_t cap) {
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    out[0] = 0;
    if (!f) return;
    rewind(f);
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = 0;
    fclose(f);
}

/* RUNS forward passes on device under PDDE_PROFILE=profile and PDDE_PROFILE_PEAKS=peaks (NULL: unset) */
static void forward(pdde_context *ctx, int device, const char *profile, const char *peaks, const pdde_cluster *cluster, run_result *r) {
    memset(r, 0, sizeof *r);
    if (profile) setenv("PDDE_PROFILE", profile, 1);
    else unsetenv("PDDE_PROFILE");
    if (peaks) setenv("PDDE_PROFILE_PEAKS", peaks, 1);
    else unsetenv("PDDE_PROFILE_PEAKS");
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){M, K}), *w = pdde_input(g, "w", PDDE_F32, 2, (int64_t[]){K, N});
    pdde_tensor *b = pdde_input(g, "b", PDDE_F32, 2, (int64_t[]){M, N});
    pdde_tensor *z = pdde_mul(g, pdde_mul(g, pdde_matmul(g, x, w, 0, 0), b), b);
    if (z) pdde_mark_output(z);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device, sp.cluster = cluster;
    pdde_session *s = NULL;
    FILE *f;
    int saved = capture_begin(&f);
    int ok = z && pdde_session_init(g, &sp, &s) == PDDE_OK;
    capture_end(saved, f, r->init_err, sizeof r->init_err);
    float *data = calloc(K * N, sizeof *data);
    for (int i = 0; data && i < K * N; i++) data[i] = (float)(i % 7) * 0.25f;
    ok = ok && data && pdde_session_write(s, x, data, sizeof(float) * M * K) == PDDE_OK &&
         pdde_session_write(s, w, data, sizeof(float) * K * N) == PDDE_OK && pdde_session_write(s, b, data, sizeof(float) * M * N) == PDDE_OK;
    for (int i = 0; ok && i < RUNS; i++) ok = pdde_session_run(s, PDDE_RUN_FORWARD) == PDDE_OK;
    if (!ok) fprintf(stderr, "forward (PDDE_PROFILE=%s, PDDE_PROFILE_PEAKS=%s): %s\n", profile ? profile : "", peaks ? peaks : "", pdde_last_error(ctx));
    if (ok && profile) pdde_session_device_profile(s, &r->prof);
    free(data);
    saved = capture_begin(&f);
    pdde_session_free(s);
    capture_end(saved, f, r->report, sizeof r->report);
    pdde_graph_free(g);
    unsetenv("PDDE_PROFILE");
    unsetenv("PDDE_PROFILE_PEAKS");
    r->ok = ok;
}

/* The "PROFILE op name=<op> ..." line's figures; bound_ms -1 where the line has none. */
typedef struct {
    int found;
    double ms, calls, bytes, flops, gbps, tflops, bound_ms;
} op_line;

static op_line find_op(const char *report, const char *op) {
    op_line o = {0, 0, 0, 0, 0, 0, 0, -1};
    char key[64];
    snprintf(key, sizeof key, "PROFILE op name=%s ", op);
    const char *l = strstr(report, key);
    if (!l) return o;
    l += strlen(key);
    o.found = sscanf(l, "ms=%lf calls=%lf bytes=%lf flops=%lf gbps=%lf tflops=%lf", &o.ms, &o.calls, &o.bytes, &o.flops, &o.gbps, &o.tflops) == 6;
    const char *end = strchr(l, '\n'), *bound = strstr(l, "bound_ms=");
    if (bound && (!end || bound < end)) sscanf(bound, "bound_ms=%lf", &o.bound_ms);
    return o;
}

/* A field of the "PROFILE device ..." line; NAN where it is missing. */
static double device_field(const char *report, const char *name) {
    const char *l = strstr(report, "PROFILE device ");
    char key[64];
    snprintf(key, sizeof key, " %s=", name);
    const char *end = l ? strchr(l, '\n') : NULL, *v = l ? strstr(l, key) : NULL;
    return v && (!end || v < end) ? atof(v + strlen(key)) : NAN;
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* The counts, the rates over the device ms, and the bound at bandwidth bw (B/s) and f32 GEMM rate f32 (FLOP/s). */
static void check_report(const char *what, const run_result *r, double bw, double f32) {
    op_line mm = find_op(r->report, "matmul"), mul = find_op(r->report, "mul");
    CHECK(r->ok && mm.found && mul.found, "%s: the op lines:\n%s", what, r->report);
    if (!mm.found || !mul.found) return;
    CHECK(mm.bytes == MATMUL_BYTES && mm.flops == MATMUL_FLOPS && mm.calls == 1, "%s: the matmul moves %.0f bytes (%.0f), %.0f FLOPs (%.0f), %g calls", what,
          mm.bytes, MATMUL_BYTES, mm.flops, MATMUL_FLOPS, mm.calls);
    CHECK(mul.bytes == 2 * MUL_BYTES && mul.flops == 0 && mul.calls == 2, "%s: the two products move %.0f bytes (%.0f), %.0f FLOPs, %g calls", what,
          mul.bytes, 2 * MUL_BYTES, mul.flops, mul.calls);
    CHECK(device_field(r->report, "bytes") == MATMUL_BYTES + 2 * MUL_BYTES && device_field(r->report, "flops") == MATMUL_FLOPS &&
              r->prof.bytes == MATMUL_BYTES + 2 * MUL_BYTES && r->prof.flops == MATMUL_FLOPS,
          "%s: the device line's sums: bytes %.0f, flops %.0f; pdde_session_device_profile's %.0f, %.0f", what, device_field(r->report, "bytes"),
          device_field(r->report, "flops"), r->prof.bytes, r->prof.flops);
    CHECK(mm.ms > 0 && mul.ms > 0 && test_close(mm.gbps, mm.bytes / mm.ms / 1e6, 1e-3, 0) && test_close(mul.gbps, mul.bytes / mul.ms / 1e6, 1e-3, 0) &&
              test_close(mm.tflops, mm.flops / mm.ms / 1e9, 1e-3, 0) && mul.tflops == 0,
          "%s: GB/s and TFLOP/s over the device ms: matmul %g GB/s %g TFLOP/s in %g ms, products %g GB/s in %g ms", what, mm.gbps, mm.tflops,
          mm.ms, mul.gbps, mul.ms);
    if (bw <= 0) {
        CHECK(mm.bound_ms < 0 && mul.bound_ms < 0 && isnan(device_field(r->report, "bound_ms")) && isnan(device_field(r->report, "over_bound_ms")) &&
                  !strstr(r->report, "bound ms") && strstr(r->report, "no bound column") && r->prof.peaks == 0 && r->prof.bound_ms == 0,
              "%s: no peaks, no bound column:\n%s", what, r->report);
        return;
    }
    double mm_bound = 1e3 * fmax(MATMUL_BYTES / bw, MATMUL_FLOPS / f32), mul_bound = 2e3 * MUL_BYTES / bw;
    CHECK(test_close(mm.bound_ms, mm_bound, 0, 2e-6) && test_close(mul.bound_ms, mul_bound, 0, 2e-6) && strstr(r->report, "bound ms"),
          "%s: the bounds: matmul %.6f ms (%.6f), products %.6f ms (%.6f)", what, mm.bound_ms, mm_bound, mul.bound_ms, mul_bound);
    double bound = device_field(r->report, "bound_ms"), over = device_field(r->report, "over_bound_ms");
    CHECK(test_close(bound, mm_bound + mul_bound, 0, 2e-3) && test_close(over, mm.ms + mul.ms - bound, 0, 3e-3) &&
              test_close(r->prof.bound_ms, mm_bound + mul_bound, 1e-9, 0) && test_close(r->prof.over_bound_ms, mm.ms + mul.ms - r->prof.bound_ms, 0, 1e-5),
          "%s: the device line: bound_ms %g (%g), over_bound_ms %g (%g ms of ops)", what, bound, mm_bound + mul_bound, over, mm.ms + mul.ms);
}

static pdde_cluster *make_cluster(int device, const char *backend, double f32, double bw) {
    pdde_cluster *c;
    if (pdde_cluster_init("roofline", &c)) return NULL;
    pdde_device_spec sp = {.kind = PDDE_DEVICE_GPU, .mem_bandwidth = bw};
    snprintf(sp.name, sizeof sp.name, "PoCL model");
    snprintf(sp.backend, sizeof sp.backend, "%s", backend);
    if (f32 > 0) { /* (pdde-bench's table: a slower shape, the best, and bf16's, which the f32 matmul must not take) */
        sp.gemm[sp.n_gemm++] = (pdde_gemm_point){PDDE_F32, 64, 64, 64, 0.25 * f32};
        sp.gemm[sp.n_gemm++] = (pdde_gemm_point){PDDE_F32, 512, 512, 512, f32};
        sp.gemm[sp.n_gemm++] = (pdde_gemm_point){PDDE_BF16, 512, 512, 512, 8 * f32};
        sp.peak_flops = f32;
    }
    int si = pdde_cluster_add_spec(c, &sp);
    int mi = pdde_cluster_add_machine(c, &(pdde_cluster_machine){.id = 0, .intra = {-1, -1, PDDE_LINK_PCIE, 1e10, 1e-5, -1},
                                                                   .nic = {-1, -1, PDDE_LINK_NET, 1e9, 5e-6, -1}});
    pdde_cluster_add_device(c, mi, &(pdde_cluster_device){device, si, 1ull << 30});
    return c;
}

static void test_opencl(pdde_context *ctx) {
    int device = pdde_device_find(ctx, "opencl", 0);
    if (device < 0) {
        test_skip("opencl", "no OpenCL device (PoCL in CI)");
        return;
    }
    run_result r;
    /* the f32 matmul at the third figure: FLOP-bound (1.57 ms against 1.06 ms of bytes); the products by their bytes */
    forward(ctx, device, "device", "0.1,0.002,0.001", NULL, &r);
    check_report("PDDE_PROFILE_PEAKS=0.1,0.002,0.001", &r, 0.1e9, 0.001e12);
    CHECK(strstr(r.report, "): PDDE_PROFILE_PEAKS: 0.1 GB/s, GEMMs f32 0.001 TFLOP/s, bf16 0.002") && strstr(r.report, " peaks=env") && r.prof.peaks == 2 && !r.init_err[0],
          "the header says where the peaks come from:\n%s%s", r.init_err, r.report);
    /* two figures: every GEMM at the second (the matmul then bound by its bytes) */
    forward(ctx, device, "device", "0.1,0.002", NULL, &r);
    check_report("PDDE_PROFILE_PEAKS=0.1,0.002", &r, 0.1e9, 0.002e12);
    /* a measured cluster: its best f32 rate (the matmul FLOP-bound: 3.1 ms against 1.06 ms of bytes) and
     * bandwidth, before PDDE_PROFILE_PEAKS */
    pdde_cluster *measured = make_cluster(device, "opencl", 5e8, 1e8), *unmeasured = make_cluster(device, "opencl", 0, 1e8),
                 *other = make_cluster(device, "cuda", 5e8, 1e8);
    forward(ctx, device, "device", "0.1,0.002", measured, &r);
    check_report("a measured cluster", &r, 1e8, 5e8);
    CHECK(strstr(r.report, "the cluster's \"PoCL model\", measured by pdde-bench: 0.1 GB/s, GEMMs f32 0.0005 TFLOP/s") && strstr(r.report, " peaks=cluster") && r.prof.peaks == 1,
          "the header names the cluster:\n%s", r.report);
    forward(ctx, device, "device", "0.1,0.002", unmeasured, &r);
    check_report("a cluster without GEMMs measured", &r, 0.1e9, 0.002e12);
    forward(ctx, device, "device", "0.1,0.002", other, &r);
    check_report("a cluster of another backend at that id", &r, 0.1e9, 0.002e12);
    forward(ctx, device, "device", NULL, unmeasured, &r);
    check_report("no peaks", &r, 0, 0);
    pdde_cluster_free(measured), pdde_cluster_free(unmeasured), pdde_cluster_free(other);
    /* bad values: one message at the start, no bound column, the runs as without */
    const char *bad[] = {"fast", "4800", "4800,", "4800,-989", "0,989", "4800,989,67,1", "inf,989", "4800;989", "4800,989x", "nan,989"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        forward(ctx, device, "device", bad[i], NULL, &r);
        char what[64];
        snprintf(what, sizeof what, "PDDE_PROFILE_PEAKS=%s", bad[i]);
        CHECK(r.ok && count(r.init_err, "PDDE_PROFILE_PEAKS=") == 1 && strstr(r.init_err, "expected GBPS,TFLOPS") && !strstr(r.report, "PDDE_PROFILE_PEAKS=\""),
              "%s: said once, at the start: %s", what, r.init_err);
        check_report(what, &r, 0, 0);
    }
    /* without PDDE_PROFILE: nothing */
    forward(ctx, device, NULL, "0.1,0.002", NULL, &r);
    CHECK(r.ok && !strstr(r.report, "PROFILE") && !r.init_err[0], "nothing without PDDE_PROFILE: %s%s", r.init_err, r.report);
}

/* A training step's per-op bytes and FLOPs against the cost model's program of the graph on the device. */
static void test_training_step(pdde_context *ctx) {
    int device = pdde_device_find(ctx, "opencl", 0);
    if (device < 0) return; /* (skipped above) */
    setenv("PDDE_PROFILE", "device", 1);
    unsetenv("PDDE_PROFILE_PEAKS");
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){M, K}), *y = pdde_input(g, "y", PDDE_I32, 1, (int64_t[]){M});
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){K, N}, 0.05f), *b1 = pdde_param(g, "b1", 1, (int64_t[]){N}, PDDE_INIT_ZEROS);
    pdde_tensor *w2 = pdde_param(g, "w2", 2, (int64_t[]){N, 10}, 0.05f);
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, x, w1, 0, 0), b1)), w2, 0, 0), y);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    pdde_session *s = NULL;
    int ok = loss && pdde_backward(g, loss) == PDDE_OK && pdde_optimizer_adamw(g, &op) == PDDE_OK && pdde_session_init(g, &sp, &s) == PDDE_OK;
    float *xd = calloc(M * K, sizeof *xd);
    int32_t yd[M];
    for (int i = 0; i < M; i++) yd[i] = i % 10;
    for (int i = 0; ok && xd && i < M * K; i++) xd[i] = (float)(i % 13) / 13.0f - 0.5f;
    ok = ok && xd && pdde_session_write(s, x, xd, sizeof(float) * M * K) == PDDE_OK && pdde_session_write(s, y, yd, sizeof yd) == PDDE_OK;
    for (int i = 0; ok && i < RUNS; i++) ok = pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK;
    if (!ok) fprintf(stderr, "training step: %s\n", pdde_last_error(ctx));
    run_result r;
    memset(&r, 0, sizeof r);
    FILE *f;
    int saved = capture_begin(&f);
    pdde_session_free(s);
    capture_end(saved, f, r.report, sizeof r.report);
    unsetenv("PDDE_PROFILE");
    /* the cost model's simulated program of this session on a cluster device standing for this one; its ops
     * are named "<phase><micro> <op name, 12 characters at most> <tensor>": the sums by those 12 characters */
    pdde_cluster *c = make_cluster(device, "opencl", 1e9, 1e9);
    pdde_cost_program *cp = NULL;
    pdde_cost_plan plan = {0, &device, NULL, 0};
    ok = ok && c && pdde_cost_program_from_plan(c, g, &sp, &plan, &cp) == PDDE_OK;
    double bytes[PDDE_OP_COUNT] = {0}, flops[PDDE_OP_COUNT] = {0}, seen_bytes[PDDE_OP_COUNT] = {0}, seen_flops[PDDE_OP_COUNT] = {0};
    int key_of[PDDE_OP_COUNT]; /* (the first op whose name has the same 12 characters) */
    for (int k = 0; k < PDDE_OP_COUNT; k++) {
        key_of[k] = k;
        for (int j = 0; j < k; j++)
            if (!strncmp(pdde_op_name((pdde_op)j), pdde_op_name((pdde_op)k), 12)) {
                key_of[k] = key_of[j];
                break;
            }
    }
    for (int i = 0; ok && i < pdde_cost_program_op_count(cp, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(cp, 0, i);
        const char *name = strchr(o->name, ' ');
        for (int k = 0; name && o->kind == PDDE_COST_COMPUTE && k < PDDE_OP_COUNT; k++) {
            char op12[13];
            snprintf(op12, sizeof op12, "%s", pdde_op_name((pdde_op)k));
            if (key_of[k] == k && !strncmp(name + 1, op12, strlen(op12)) && name[1 + strlen(op12)] == ' ') {
                bytes[k] += o->bytes, flops[k] += o->flops > 0 ? o->flops : 2.0 * (double)o->m * (double)o->n * (double)o->k;
                break;
            }
        }
    }
    int kinds = 0, same = 1;
    for (int k = 0; ok && k < PDDE_OP_COUNT; k++) {
        op_line l = find_op(r.report, pdde_op_name((pdde_op)k));
        if (l.found) kinds++, seen_bytes[key_of[k]] += l.bytes, seen_flops[key_of[k]] += l.flops;
    }
    for (int k = 0; ok && k < PDDE_OP_COUNT; k++)
        if (seen_bytes[k] != bytes[k] || seen_flops[k] != flops[k])
            same = 0, fprintf(stderr, "  %.12s: profile %.0f bytes %.0f FLOPs, cost model %.0f bytes %.0f FLOPs\n", pdde_op_name((pdde_op)k),
                              seen_bytes[k], seen_flops[k], bytes[k], flops[k]);
    op_line upd = find_op(r.report, "adamw_update");
    CHECK(ok && kinds >= 8 && same && upd.found && upd.calls == 1 && upd.bytes > 0,
          "a training step: the %d ops' bytes and FLOPs are the cost model's (the update one group of %g calls):\n%s", kinds, upd.calls, r.report);
    pdde_cost_program_free(cp);
    pdde_cluster_free(c);
    free(xd);
    pdde_graph_free(g);
}

int main(void) {
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx) != PDDE_OK) {
        printf("context: failed\n");
        return 1;
    }
    test_opencl(ctx);
    test_training_step(ctx);
    pdde_context_free(ctx);
    return test_finish();
}
