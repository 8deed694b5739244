/* test_rank_devices — every rank on its own device (pdde_device_select, gpt --device).
 * PoCL is the accelerator here: POCL_DEVICES="pthread pthread" gives this host two OpenCL devices, so
 * local rank r must take OpenCL device r. The library call: the local rank from pdde-run's, Open MPI's
 * and Slurm's variables, more ranks than devices an error naming the count unless shared, a missing
 * backend an error naming what is missing, auto the CPU here with the reason. The job: pdde-run -n 2
 * gpt --device opencl under dp=2, tp=2 and pp=2 (every rank's step on its own OpenCL device) against
 * one process on the CPU: every step's loss within 1e-6 relative (the README's bound for a distributed
 * run against one process; CLBlast against oneDNN GEMMs measured ~1e-7), NaN failing. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char g_dir[512], g_tmp[256];

static const char *LAUNCH_VARS[] = {"PDDE_RANK", "PDDE_WORLD_SIZE", "PDDE_LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                    "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                    "PDDE_DEVICE", "PDDE_DEVICE_SHARE", NULL};
static void clear_env(void) {
    for (int i = 0; LAUNCH_VARS[i]; i++) unsetenv(LAUNCH_VARS[i]);
}

static pdde_status select_dev(pdde_context *ctx, const char *backend, int lr, int share, const pdde_graph *g, pdde_device_choice *c) {
    pdde_device_select_params p = PDDE_DEVICE_SELECT_PARAMS_INIT;
    p.backend = backend, p.local_rank = lr >= 0 ? &lr : NULL, p.share = share, p.graph = g;
    return pdde_device_select(ctx, &p, c);
}

/* The library call, in this process (no launcher but the variables it sets). */
static void test_select(pdde_context *ctx, int n_ocl) {
    pdde_device_choice c;
    pdde_status st;
    /* given local ranks: rank r on device r */
    for (int r = 0; r < n_ocl; r++) {
        st = select_dev(ctx, "opencl", r, 0, NULL, &c);
        CHECK(st == PDDE_OK && c.device == pdde_device_find(ctx, "opencl", r) && c.index == r && c.count == n_ocl && !c.shared &&
              !strcmp(c.backend, "opencl"), "local rank %d takes opencl device %d: st %d, device %d index %d (%s)", r, r, st, c.device, c.index,
              pdde_last_error(ctx));
    }
    /* one rank more than devices: an error naming the count; shared: modulo */
    st = select_dev(ctx, "opencl", n_ocl, 0, NULL, &c);
    char want[64];
    snprintf(want, sizeof want, "has %d opencl device", n_ocl);
    CHECK(st == PDDE_ERR_UNAVAILABLE && strstr(pdde_last_error(ctx), want) && strstr(pdde_last_error(ctx), "share"),
          "local rank %d of %d devices: an error naming the count: %d %s", n_ocl, n_ocl, st, pdde_last_error(ctx));
    st = select_dev(ctx, "opencl", n_ocl + 1, 1, NULL, &c);
    CHECK(st == PDDE_OK && c.index == (n_ocl + 1) % n_ocl && c.shared, "shared: local rank %d takes device %d: index %d shared %d", n_ocl + 1,
          (n_ocl + 1) % n_ocl, c.index, c.shared);
    setenv("PDDE_DEVICE_SHARE", "1", 1);
    st = select_dev(ctx, "opencl", n_ocl, 0, NULL, &c);
    CHECK(st == PDDE_OK && c.index == 0 && c.shared, "PDDE_DEVICE_SHARE=1 shares too: st %d index %d", st, c.index);
    unsetenv("PDDE_DEVICE_SHARE");
    /* the CPU is every local rank's */
    st = select_dev(ctx, "cpu", 3, 0, NULL, &c);
    CHECK(st == PDDE_OK && c.device == 0 && !strcmp(c.backend, "cpu"), "local rank 3 on the CPU: st %d device %d (%s)", st, c.device,
          pdde_last_error(ctx));
    /* BACKEND:INDEX names a device whatever the local rank */
    st = select_dev(ctx, "opencl:1", 0, 0, NULL, &c);
    CHECK(st == PDDE_OK && c.index == 1, "opencl:1 is device 1: st %d index %d", st, c.index);
    st = select_dev(ctx, "opencl:7", 0, 0, NULL, &c);
    CHECK(st == PDDE_ERR_UNAVAILABLE && strstr(pdde_last_error(ctx), "0..1"), "opencl:7 refused naming the range: %s", pdde_last_error(ctx));
    /* the launchers' local ranks (comm/env.c reads them) */
    static const struct { const char *vars[3], *launcher; } launchers[] = {
        {{"PDDE_RANK=3", "PDDE_WORLD_SIZE=4", "PDDE_LOCAL_RANK=1"}, "pdde-run"},
        {{"OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_SIZE=8", "OMPI_COMM_WORLD_LOCAL_RANK=1"}, "openmpi"},
        {{"SLURM_PROCID=7", "SLURM_NTASKS=8", "SLURM_LOCALID=1"}, "slurm"},
    };
    int comm = (pdde_features() & PDDE_FEATURE_COMM) != 0; /* (comm/env.c reads the launchers' variables) */
    if (!comm) test_skip("ucx", "the launchers' local ranks: pdde was built without comm");
    for (size_t i = 0; comm && i < sizeof launchers / sizeof *launchers; i++) {
        clear_env();
        for (int k = 0; k < 3; k++) putenv((char *)launchers[i].vars[k]);
        st = select_dev(ctx, "opencl", -1, 0, NULL, &c);
        CHECK(st == PDDE_OK && c.index == 1 && c.local_rank == 1 && strstr(c.why, launchers[i].launcher),
              "%s's local rank 1 takes opencl device 1: st %d index %d why '%s'", launchers[i].launcher, st, c.index, c.why);
    }
    clear_env();
    st = select_dev(ctx, "opencl", -1, 0, NULL, &c);
    CHECK(st == PDDE_OK && c.index == 0 && c.local_rank == 0 && strstr(c.why, "no launcher"), "no launcher: local rank 0: %s", c.why);
    /* PDDE_DEVICE when the caller names none */
    setenv("PDDE_DEVICE", "opencl:1", 1);
    st = select_dev(ctx, NULL, 0, 0, NULL, &c);
    CHECK(st == PDDE_OK && c.index == 1 && !strcmp(c.backend, "opencl") && strstr(c.why, "PDDE_DEVICE"), "PDDE_DEVICE=opencl:1: %s", c.why);
    unsetenv("PDDE_DEVICE");
    /* bad names and missing backends */
    st = select_dev(ctx, "bogus", 0, 0, NULL, &c);
    CHECK(st == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "no such backend") && strstr(pdde_last_error(ctx), "opencl (2 devices)"),
          "an unknown backend names those there are: %s", pdde_last_error(ctx));
    int cuda_b = -1;
    for (int b = 0; b < pdde_backend_count(ctx); b++)
        if (!strcmp(pdde_backend_name(ctx, b), "cuda")) cuda_b = b;
    const char *why = NULL;
    if (cuda_b >= 0 && pdde_backend_status(ctx, cuda_b, &why) != PDDE_OK) {
        st = select_dev(ctx, "cuda", 0, 0, NULL, &c);
        CHECK(st == PDDE_ERR_UNAVAILABLE && strstr(pdde_last_error(ctx), "cuda backend is unavailable") && why && strstr(pdde_last_error(ctx), why),
              "--device cuda without a GPU names what is missing ('%s'): %s", why ? why : "", pdde_last_error(ctx));
    } else {
        test_skip("cuda", "a CUDA device is here: the missing-driver error is not reachable");
    }
}

/* auto on this machine: PoCL computes on the same cores as the CPU backend, so the CPU, saying why;
 * with measured figures that make the OpenCL device 10x faster, that device, saying what was predicted. */
static void test_auto(pdde_context *ctx) {
    pdde_graph *g;
    gpt_model m;
    const gpt_config cfg = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 4};
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_graph_init(ctx, &g);
    CHECK(gpt_build(g, &cfg, &m) == PDDE_OK && pdde_backward(g, m.loss) == PDDE_OK && pdde_optimizer_adamw(g, &op) == PDDE_OK, "gpt builds");
    pdde_device_choice c;
    pdde_status st = select_dev(ctx, "auto", 1, 0, g, &c);
    CHECK(st == PDDE_OK && c.device == 0 && strstr(c.why, "CPU cores") && strstr(c.why, "opencl:1"),
          "auto takes the CPU over PoCL and says why: device %d: %s", c.device, c.why);
    /* a measured cluster of this machine: the CPU slow, the OpenCL devices fast */
    pdde_cluster *cl;
    CHECK(pdde_cluster_detect(ctx, &cl) == PDDE_OK, "detect");
    for (int s = 0; s < cl->n_specs; s++) {
        pdde_device_spec *sp = &cl->specs[s];
        double rate = !strcmp(sp->backend, "cpu") ? 1e9 : 1e10;
        sp->n_gemm = 1, sp->gemm[0] = (pdde_gemm_point){PDDE_F32, 64, 64, 64, rate};
        for (int k = 0; k < PDDE_OPCLASS_COUNT; k++) sp->n_curve[k] = 1, sp->curve[k][0] = (pdde_curve_point){1e6, 1e6 / rate};
    }
    pdde_device_select_params p = PDDE_DEVICE_SELECT_PARAMS_INIT;
    int lr = 1;
    p.backend = "auto", p.local_rank = &lr, p.graph = g, p.cluster = cl;
    st = pdde_device_select(ctx, &p, &c);
    CHECK(st == PDDE_OK && c.device == pdde_device_find(ctx, "opencl", 1) && strstr(c.why, "predicted") && strstr(c.why, "measured"),
          "auto with figures saying the OpenCL device is faster takes local rank 1's: device %d: %s", c.device, c.why);
    pdde_cluster_free(cl);
    pdde_graph_free(g);
}

/* ---- the gpt job ---- */

#define STEPS 6
static const char *GPT_ARGS = "--layers 2 --width 32 --heads 2 --ctx 16 --batch 4 --steps 6 --val-every 0 --sample-len 0 --ckpt-every 0 --threads 1";

/* Runs cmd (through the shell, output into out); its exit status. */
static int sh(const char *cmd, char *out, size_t cap) {
    char full[4608];
    snprintf(full, sizeof full, "%s > %s/out.txt 2>&1", cmd, g_tmp);
    int rc = system(full);
    snprintf(full, sizeof full, "%s/out.txt", g_tmp);
    FILE *f = fopen(full, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* The per-step losses of a --metrics file; how many. */
static int losses(const char *path, float *out) {
    FILE *f = fopen(path, "r");
    char line[512];
    int n = 0;
    while (f && fgets(line, sizeof line, f) && n < STEPS) {
        const char *l = strstr(line, "\"loss\":");
        if (l) out[n++] = strtof(l + 7, NULL);
    }
    if (f) fclose(f);
    return n;
}

static void test_job(void) {
    static char out[1 << 16];
    char cmd[4096], path[400];
    float ref[STEPS], got[STEPS];
    snprintf(path, sizeof path, "%s/ref.jsonl", g_tmp);
    snprintf(cmd, sizeof cmd, "%s/gpt %s --device cpu --metrics %s", g_dir, GPT_ARGS, path);
    int rc = sh(cmd, out, sizeof out);
    CHECK(rc == 0 && losses(path, ref) == STEPS && strstr(out, "rank 0: device 0, cpu:0"), "one process on the CPU: rc %d\n%s", rc, out);
    static const char *plans[] = {"--dp 2", "--tp 2", "--pp 2 --micro 2", "--dp 2 --zero 1"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/job%d.jsonl", g_tmp, i);
        snprintf(cmd, sizeof cmd, "timeout 120 %s/pdde-run -n 2 %s/gpt %s %s --device opencl --metrics %s", g_dir, g_dir, GPT_ARGS, plans[i], path);
        rc = sh(cmd, out, sizeof out);
        int n = losses(path, got);
        CHECK(rc == 0 && n == STEPS, "pdde-run -n 2 gpt %s --device opencl: rc %d, %d losses\n%s", plans[i], rc, n, out);
        /* each rank on its own OpenCL device: local rank r on opencl:r */
        CHECK(strstr(out, "rank 0: device 1, opencl:0") && strstr(out, "rank 1: device 2, opencl:1") && strstr(out, "local rank 1 (pdde-run)"),
              "%s: rank r took opencl:r\n%s", plans[i], out);
        test_diff d = test_diff_f32(got, ref, n == STEPS ? STEPS : 0, 1e-6);
        CHECK(n == STEPS && d.worst <= 1e-6, "%s on OpenCL: losses within 1e-6 of one CPU process: worst %.3g at step %zu (%.9g vs %.9g)",
              plans[i], d.worst, d.index + 1, d.got, d.want);
    }
    /* auto: the CPU here, saying why; one rank (no measured cluster file: --cluster names none) */
    snprintf(cmd, sizeof cmd, "%s/gpt %s --steps 1 --device auto --cluster %s/none.json", g_dir, GPT_ARGS, g_tmp);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "rank 0: device 0, cpu:0") && strstr(out, "CPU cores") && strstr(out, "trained 1 steps"),
          "gpt --device auto trains on the CPU and says why: rc %d\n%s", rc, out);
    /* more ranks than devices without sharing: a clear error */
    snprintf(cmd, sizeof cmd, "POCL_DEVICES=pthread timeout 60 %s/pdde-run -n 2 %s/gpt %s --dp 2 --device opencl", g_dir, g_dir, GPT_ARGS);
    rc = sh(cmd, out, sizeof out);
    CHECK(rc != 0 && strstr(out, "local rank 1 needs opencl device 1, but this host has 1 opencl device"), "two ranks, one device: rc %d\n%s", rc, out);
    /* --device cuda without a GPU */
    snprintf(cmd, sizeof cmd, "%s/gpt %s --device cuda", g_dir, GPT_ARGS);
    rc = sh(cmd, out, sizeof out);
    if (strstr(out, "rank 0: device")) test_skip("cuda", "a CUDA device is here");
    else CHECK(rc != 0 && strstr(out, "cuda backend is unavailable") && strstr(out, "libcuda.so.1"), "gpt --device cuda: rc %d\n%s", rc, out);
}

/* The held-out logloss of a dlrm run's output (NAN: none). */
static double dlrm_logloss_of(const char *out) {
    const char *l = strstr(out, "held out");
    l = l ? strstr(l, "logloss ") : NULL;
    return l ? strtod(l + 8, NULL) : NAN;
}

/* dlrm --device: its dense layers on the rank's device (the table stays in host memory), the same
 * model as on the CPU (held-out logloss within 2e-3: the dense network's f32 sums in another order);
 * under pdde-run each worker on its local rank's device; a missing backend is a clear error. */
static void test_dlrm(void) {
    static char out[1 << 16];
    char cmd[4096];
    const char *args = "--synthetic 12000 --batch 128 --epochs 1";
    snprintf(cmd, sizeof cmd, "%s/dlrm %s --device cpu", g_dir, args);
    int rc = sh(cmd, out, sizeof out);
    double ref = dlrm_logloss_of(out);
    CHECK(rc == 0 && strstr(out, "rank 0: the dense layers on device 0, cpu:0") && ref > 0, "dlrm --device cpu: rc %d\n%s", rc, out);
    snprintf(cmd, sizeof cmd, "%s/dlrm %s --device opencl", g_dir, args);
    rc = sh(cmd, out, sizeof out);
    double got = dlrm_logloss_of(out);
    CHECK(rc == 0 && strstr(out, "rank 0: the dense layers on device 1, opencl:0") && fabs(got - ref) <= 2e-3,
          "dlrm --device opencl: rc %d, logloss %.4f against the CPU's %.4f\n%s", rc, got, ref, out);
    if (pdde_features() & PDDE_FEATURE_COMM) { /* a server and two workers, each worker on its own device */
        snprintf(cmd, sizeof cmd, "timeout 120 %s/pdde-run -n 3 %s/dlrm %s --servers 1 --mode sync --device opencl", g_dir, g_dir, args);
        rc = sh(cmd, out, sizeof out);
        CHECK(rc == 0 && strstr(out, "rank 1: the dense layers on device 1, opencl:0") && strstr(out, "rank 2: the dense layers on device 2, opencl:1") &&
              dlrm_logloss_of(out) > 0, "pdde-run -n 3 dlrm --servers 1 --device opencl: each worker its local rank's device: rc %d\n%s", rc, out);
    }
    snprintf(cmd, sizeof cmd, "%s/dlrm %s --device cuda", g_dir, args);
    rc = sh(cmd, out, sizeof out);
    if (strstr(out, "the dense layers on device")) test_skip("cuda", "a CUDA device is here");
    else CHECK(rc != 0 && strstr(out, "cuda backend is unavailable") && strstr(out, "libcuda.so.1"), "dlrm --device cuda: rc %d\n%s", rc, out);
}

int main(int argc, char **argv) {
    (void)argc;
    setenv("POCL_DEVICES", "pthread pthread", 1); /* two OpenCL devices on this host */
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    clear_env();
    char self[512];
    if (!realpath(argv[0], self)) snprintf(self, sizeof self, "%s", argv[0]);
    test_binary_dir(self, g_dir, sizeof g_dir);
    snprintf(g_tmp, sizeof g_tmp, "/tmp/pdde-rank-devices.XXXXXX");
    if (!mkdtemp(g_tmp)) { fprintf(stderr, "no temporary folder\n"); return 1; }
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) { fprintf(stderr, "no context\n"); return 1; }
    int n_ocl = 0;
    while (pdde_device_find(ctx, "opencl", n_ocl) >= 0) n_ocl++;
    if (n_ocl != 2) {
        test_skip("opencl", "want two OpenCL devices (POCL_DEVICES=\"pthread pthread\"), have %d", n_ocl);
    } else {
        test_select(ctx, n_ocl);
        test_auto(ctx);
        test_dlrm();
        if (pdde_features() & PDDE_FEATURE_COMM) test_job();
        else test_skip("ucx", "the gpt jobs under pdde-run: pdde was built without comm");
    }
    pdde_context_free(ctx);
    char rm[300];
    snprintf(rm, sizeof rm, "rm -rf %s", g_tmp);
    if (system(rm)) {}
    return test_finish();
}
