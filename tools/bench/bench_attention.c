/* bench_attention — fused causal attention (pdde_attention: tiles with an online softmax, memory
 * O(B*H*T*D)) against the unfused reference (pdde_attention_unfused: matmul, causal softmax, matmul,
 * [B,H,T,T] scores) in the same run, on the CPU and the OpenCL device, at T = 256, 1024 and 4096.
 *
 * Each point is one training pass (forward + backward: q, k and v are parameters, the loss is
 * sum(attention * w)); the time is the median of a few passes after a warm-up (wall clock, and the CPU
 * time of the process's threads, which a loaded machine disturbs less), the memory what the
 * session holds from the backends' allocators (pdde_memory_stats.allocated_bytes: the activation
 * arena and the parameters, gradients and inputs). Last line:
 *   RESULT attention mem_ratio=<fused / unfused memory, CPU, T=4096> speed_ratio=<fused / unfused
 *   time, CPU, T=1024> opencl_mem_ratio=.. opencl_speed_ratio=.. bf16_speed_ratio=<fused / unfused
 *   time, both under compute dtype bf16, CPU, T=1024> bf16_vs_f32=<fused bf16 / fused f32 time, CPU,
 *   T=1024>
 * The bf16 rows (CPU, T = 256 and 1024) build the graphs under pdde_graph_set_compute_dtype(PDDE_BF16):
 * q, k, v converted, the fused tiles on oneDNN's bf16 GEMM.
 *
 *   bench_attention [--heads H] [--dim D] [--batch B] [--max-t T] [--cpu-only 1] */
#include "pdde.h"
#include "bench_common.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    double ms;      /* median pass, wall clock */
    double cpu_ms;  /* median pass, CPU time of all the process's threads (steadier on a loaded machine) */
    double mb;      /* allocated by the session */
} point;

static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One configuration: builds, runs warm + reps passes, measures. 0 on success. */
static int run_point(pdde_context *ctx, int device, int fused, pdde_dtype dt, const int64_t *shape, int reps, point *out) {
    pdde_graph *g;
    if (pdde_graph_init(ctx, &g)) return 1;
    pdde_tensor *q = pdde_param(g, "q", 4, shape, 1.0f), *k = pdde_param(g, "k", 4, shape, 1.0f);
    pdde_tensor *v = pdde_param(g, "v", 4, shape, 1.0f), *w = pdde_input(g, "w", PDDE_F32, 4, shape);
    pdde_graph_set_compute_dtype(g, dt);
    pdde_tensor *y = fused ? pdde_attention(g, q, k, v) : pdde_attention_unfused(g, q, k, v);
    pdde_graph_set_compute_dtype(g, PDDE_F32);
    pdde_tensor *loss = pdde_sum(g, pdde_mul(g, y, w), -1, 0);
    pdde_session *s = NULL;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device;
    int rc = pdde_graph_status(g) || pdde_backward(g, loss) || pdde_session_init(g, &sp, &s);
    size_t n = (size_t)pdde_tensor_numel(w);
    float *wv = malloc(n * sizeof *wv);
    for (size_t i = 0; !rc && wv && i < n; i++) wv[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    rc = rc || !wv || pdde_session_write(s, w, wv, n * sizeof *wv);
    if (reps > 1) rc = rc || pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD); /* warm-up (kernels built at the first point) */
    double t[16], c[16];
    for (int r = 0; r < reps && !rc; r++) {
        double t0 = bench_now(), c0 = cpu_now();
        rc = pdde_session_run(s, PDDE_RUN_FORWARD_BACKWARD) != PDDE_OK;
        t[r] = bench_now() - t0, c[r] = cpu_now() - c0;
    }
    pdde_memory_stats ms;
    if (!rc && !(rc = pdde_session_memory(s, &ms) != PDDE_OK)) {
        out->ms = bench_median(t, reps) * 1e3, out->cpu_ms = bench_median(c, reps) * 1e3;
        out->mb = (double)ms.allocated_bytes / 1e6;
    }
    if (rc) fprintf(stderr, "bench_attention: %s %s T=%lld on device %d: %s\n", fused ? "fused" : "unfused", pdde_dtype_name(dt),
                    (long long)shape[2], device, pdde_last_error(ctx));
    free(wv);
    pdde_session_free(s);
    pdde_graph_free(g);
    return rc;
}

int main(int argc, char **argv) {
    int64_t B = 1, H = 4, D = 64, max_t = 4096;
    int cpu_only = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--heads")) H = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--dim")) D = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) B = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--max-t")) max_t = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "--cpu-only")) cpu_only = atoi(argv[i + 1]);
        else { fprintf(stderr, "usage: %s [--heads H] [--dim D] [--batch B] [--max-t T] [--cpu-only 1]\n", argv[0]); return 2; }
    }
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) { fprintf(stderr, "bench_attention: no context\n"); return 1; }
    int devices[2] = {0, cpu_only ? -1 : pdde_device_find(ctx, "opencl", 0)};
    static const int64_t Ts[3] = {256, 1024, 4096};
    double mem_ratio[2] = {NAN, NAN}, speed_ratio[2] = {NAN, NAN}, bf16_speed_ratio = NAN, bf16_vs_f32 = NAN, f32_fused_1024 = NAN;
    printf("causal attention, forward + backward, B=%lld H=%lld D=%lld (q, k, v parameters)\n", (long long)B, (long long)H, (long long)D);
    printf("%-8s %6s %10s %10s %7s %10s %10s %7s %10s %10s %7s\n", "device", "T", "fused ms", "unfused", "ratio", "cpu ms",
           "unfused", "ratio", "fused MB", "unfused", "ratio");
    int failed = 0;
    for (int di = 0; di < 2; di++) {
        if (devices[di] < 0) { printf("SKIP opencl: %s\n", cpu_only ? "--cpu-only" : "no OpenCL device"); continue; }
        pdde_device_props props;
        pdde_device_get_props(ctx, devices[di], &props);
        for (int ti = 0; ti < 3 && Ts[ti] <= max_t; ti++) {
            int64_t shape[4] = {B, H, Ts[ti], D};
            /* T = 4096 once: its ratio of interest is the memory, and the unfused pass takes a minute
             * on OpenCL on a CPU */
            int reps = Ts[ti] >= 4096 ? 1 : 5;
            point f, u;
            if (run_point(ctx, devices[di], 1, PDDE_F32, shape, reps, &f) || run_point(ctx, devices[di], 0, PDDE_F32, shape, reps, &u)) { failed = 1; continue; }
            printf("%-8s %6lld %10.2f %10.2f %7.3f %10.2f %10.2f %7.3f %10.1f %10.1f %7.3f\n", props.backend, (long long)Ts[ti], f.ms,
                   u.ms, f.ms / u.ms, f.cpu_ms, u.cpu_ms, f.cpu_ms / u.cpu_ms, f.mb, u.mb, f.mb / u.mb);
            fflush(stdout);
            if (Ts[ti] == 4096) mem_ratio[di] = f.mb / u.mb;
            if (Ts[ti] == 1024) speed_ratio[di] = f.ms / u.ms;
            if (Ts[ti] == 1024 && di == 0) f32_fused_1024 = f.ms;
        }
    }
    for (int ti = 0; ti < 2 && Ts[ti] <= max_t; ti++) { /* mixed precision on the CPU */
        int64_t shape[4] = {B, H, Ts[ti], D};
        point f, u;
        if (run_point(ctx, 0, 1, PDDE_BF16, shape, 5, &f) || run_point(ctx, 0, 0, PDDE_BF16, shape, 5, &u)) { failed = 1; continue; }
        printf("%-8s %6lld %10.2f %10.2f %7.3f %10.2f %10.2f %7.3f %10.1f %10.1f %7.3f\n", "cpu bf16", (long long)Ts[ti], f.ms, u.ms,
               f.ms / u.ms, f.cpu_ms, u.cpu_ms, f.cpu_ms / u.cpu_ms, f.mb, u.mb, f.mb / u.mb);
        fflush(stdout);
        if (Ts[ti] == 1024) bf16_speed_ratio = f.ms / u.ms, bf16_vs_f32 = f.ms / f32_fused_1024;
    }
    pdde_context_free(ctx);
    printf("RESULT attention mem_ratio=%.3f speed_ratio=%.3f opencl_mem_ratio=%.3f opencl_speed_ratio=%.3f bf16_speed_ratio=%.3f "
           "bf16_vs_f32=%.3f\n", mem_ratio[0], speed_ratio[0], mem_ratio[1], speed_ratio[1], bf16_speed_ratio, bf16_vs_f32);
    return failed;
}
