/* test_cost — the cost model against cases computed by hand: one GEMM and the curves, collectives
 * (ring, recursive doubling, two-level, a shared NIC, bf16, a measured calibration), and timelines
 * (a 2-stage 1F1B and GPipe pipeline with its bubble and the activations each schedule keeps alive,
 * an overlapped gradient allreduce, a deadlock, CPU ranks' sends moving only in their calls, ranks
 * sharing a machine's cores and contending for its memory), and the
 * simulation of plans' real lowered programs
 * (pdde_cost_program_from_plan: data, tensor and pipeline parallel GPTs). */
#define _GNU_SOURCE
#include "pdde.h"
#include "test_util.h"
#include "examples/gpt.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pdde_context *ctx;

/* Machines of `per` devices each (ids 0..machines*per-1): a device does 1e12 FLOP/s at 1024^3 and
 * 0.5e12 at 64^3; elementwise curve (1e3 B, 1 us) .. (1e6 B, 100 us); intra links 1e9 B/s and 10 us,
 * NICs 1e8 B/s and 5 us each. */
static pdde_cluster *make_cluster(int machines, int per) {
    pdde_cluster *c;
    pdde_cluster_init("test", &c);
    pdde_device_spec s = {.kind = PDDE_DEVICE_GPU, .peak_flops = 2e12, .mem_bandwidth = 1e11};
    snprintf(s.name, sizeof s.name, "dev");
    s.n_gemm = 2;
    s.gemm[0] = (pdde_gemm_point){PDDE_F32, 1024, 1024, 1024, 1e12};
    s.gemm[1] = (pdde_gemm_point){PDDE_F32, 64, 64, 64, 0.5e12};
    s.n_curve[PDDE_OPCLASS_ELEMENTWISE] = 2;
    s.curve[PDDE_OPCLASS_ELEMENTWISE][0] = (pdde_curve_point){1e3, 1e-6};
    s.curve[PDDE_OPCLASS_ELEMENTWISE][1] = (pdde_curve_point){1e6, 1e-4};
    pdde_cluster_add_spec(c, &s);
    for (int m = 0; m < machines; m++) {
        pdde_cluster_machine mm = {.id = m, .intra = {-1, -1, PDDE_LINK_NVLINK, 1e9, 1e-5, -1},
                                   .nic = {-1, -1, PDDE_LINK_NET, 1e8, 5e-6, -1}};
        int mi = pdde_cluster_add_machine(c, &mm);
        for (int d = 0; d < per; d++) pdde_cluster_add_device(c, mi, &(pdde_cluster_device){m * per + d, 0, 1ull << 34});
    }
    return c;
}

static void test_compute(void) {
    pdde_cluster *c = make_cluster(1, 2);
    pdde_cost_op op = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GEMM, .m = 1024, .n = 1024, .k = 1024};
    double t = pdde_cost_compute_time(ctx, c, 1, &op);
    CHECK(test_close(t, 2.0 * 1024 * 1024 * 1024 / 1e12, 1e-12, 0), "a measured shape: %g s", t);
    op.m = op.n = op.k = 64;
    t = pdde_cost_compute_time(ctx, c, 1, &op);
    CHECK(test_close(t, 2.0 * 64 * 64 * 64 / 0.5e12, 1e-12, 0), "the other measured shape: %g s", t);
    op.m = op.n = op.k = 256; /* between the two in log space, equally far: the mean rate */
    t = pdde_cost_compute_time(ctx, c, 1, &op);
    CHECK(test_close(t, 2.0 * 256 * 256 * 256 / 0.75e12, 1e-9, 0), "halfway: %g s", t);
    /* bf16 at bf16's measured rate (pdde-bench measures both): 4x the f32 rate at this shape */
    c->specs[0].gemm[c->specs[0].n_gemm++] = (pdde_gemm_point){PDDE_BF16, 1024, 1024, 1024, 4e12};
    pdde_cost_op half = op;
    half.m = half.n = half.k = 1024, half.dtype = PDDE_BF16;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 1, &half), 2.0 * 1024 * 1024 * 1024 / 4e12, 1e-12, 0), "a bf16 GEMM at the bf16 rate");
    half.dtype = PDDE_F32;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 1, &half), 2.0 * 1024 * 1024 * 1024 / 1e12, 1e-12, 0), "an f32 GEMM at the f32 rate");
    c->specs[0].n_gemm--;
    op.flops = 1e9; /* an explicit FLOP count with the shape's rate */
    op.m = op.n = op.k = 1024;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &op), 1e-3, 1e-12, 0), "explicit flops");
    /* a fused attention on a CPU: its GEMMs, then its softmax's 2e6 bytes at the attention curve's
     * bandwidth (one point: 1e6 B in 50 us); on a GPU its GEMMs alone (the kernel fuses the softmax) */
    c->specs[0].n_curve[PDDE_OPCLASS_ATTENTION] = 1;
    c->specs[0].curve[PDDE_OPCLASS_ATTENTION][0] = (pdde_curve_point){1e6, 50e-6};
    op.softmax_bytes = 2e6;
    t = pdde_cost_compute_time(ctx, c, 0, &op);
    CHECK(test_close(t, 1e-3, 1e-12, 0), "attention on a GPU: 1 ms of GEMM: %g s", t);
    c->specs[0].kind = PDDE_DEVICE_CPU;
    t = pdde_cost_compute_time(ctx, c, 0, &op);
    CHECK(test_close(t, 1e-3 + 100e-6, 1e-12, 0), "attention on a CPU: 1 ms of GEMM and 100 us of softmax: %g s", t);
    /* with a curve of the CPU fused attention itself (pdde-bench), that curve: 2e6 B at 1e6 B in 80 us */
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION] = 1;
    c->specs[0].curve[PDDE_OPCLASS_FUSED_ATTENTION][0] = (pdde_curve_point){1e6, 80e-6};
    t = pdde_cost_compute_time(ctx, c, 0, &op);
    CHECK(test_close(t, 1e-3 + 160e-6, 1e-12, 0), "attention on a CPU: 1 ms of GEMM and 160 us measured fused: %g s", t);
    /* its backward: the forward's curve while the cluster has no backward curve (files from before
     * it predict as they did), then its own: 2e6 B at 1e6 B in 30 us; the forward keeps its curve */
    pdde_cost_op att_back = op;
    att_back.softmax_backward = 1;
    t = pdde_cost_compute_time(ctx, c, 0, &att_back);
    CHECK(test_close(t, 1e-3 + 160e-6, 1e-12, 0), "attention backward without its curve: the fused one: %g s", t);
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD] = 1;
    c->specs[0].curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD][0] = (pdde_curve_point){1e6, 30e-6};
    t = pdde_cost_compute_time(ctx, c, 0, &att_back);
    CHECK(test_close(t, 1e-3 + 60e-6, 1e-12, 0), "attention backward at its own curve: %g s", t);
    t = pdde_cost_compute_time(ctx, c, 0, &op);
    CHECK(test_close(t, 1e-3 + 160e-6, 1e-12, 0), "attention forward keeps the fused curve: %g s", t);
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION] = 0; /* a backward curve alone: the forward falls back to attention's */
    t = pdde_cost_compute_time(ctx, c, 0, &op);
    CHECK(test_close(t, 1e-3 + 100e-6, 1e-12, 0), "attention forward without its curve: %g s", t);
    /* a device: its own fused-attention curves (measured on it: what its kernels take beyond the
     * GEMMs), never the broader ones (its kernels fuse the softmax); the backward only by its own */
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION] = 1;
    c->specs[0].kind = PDDE_DEVICE_GPU;
    t = pdde_cost_compute_time(ctx, c, 0, &op);
    CHECK(test_close(t, 1e-3 + 160e-6, 1e-12, 0), "attention on a GPU with its own fused curve: %g s", t);
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &att_back), 1e-3 + 60e-6, 1e-12, 0), "and its backward's");
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD] = 0;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &att_back), 1e-3, 1e-12, 0), "a GPU's backward without its own curve: the GEMMs");
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION] = 0;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &op), 1e-3, 1e-12, 0), "nor the attention curve: the GEMMs");
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION] = c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD] = 1;
    /* bf16 attention on a GPU with the half curves (its tiled kernels measured whole): the curve alone,
     * no GEMM time (2e6 B at 1e6 B in 200 / 500 us); f32 keeps GEMMs + fused curve; a CPU never takes them */
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_HALF] = c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD] = 1;
    c->specs[0].curve[PDDE_OPCLASS_FUSED_ATTENTION_HALF][0] = (pdde_curve_point){1e6, 200e-6};
    c->specs[0].curve[PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD][0] = (pdde_curve_point){1e6, 500e-6};
    pdde_cost_op hop = op, hback = att_back;
    hop.dtype = hback.dtype = PDDE_BF16;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &hop), 400e-6, 1e-12, 0), "bf16 attention on a GPU: its half curve: %g s",
          pdde_cost_compute_time(ctx, c, 0, &hop));
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &hback), 1e-3, 1e-12, 0), "and its backward's half curve");
    hop.dtype = PDDE_F16;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &hop), 400e-6, 1e-12, 0), "f16 attention too");
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &op), 1e-3 + 160e-6, 1e-12, 0), "f32 attention: its GEMMs and the fused curve");
    /* f32 on CUDA where its f32 tiled kernels are named (PDDE_CUDA_ATTENTION, else PDDE_ATTENTION: flash or flash2) at
     * head size 64 or 128: its GEMMs alone (the softmax fused, no scores in memory); by default, another head size or
     * another backend: GEMMs and the fused curve */
    const char *att_env[2] = {"PDDE_CUDA_ATTENTION", "PDDE_ATTENTION"};
    char *att_was[2], was_backend[sizeof c->specs[0].backend];
    for (int i = 0; i < 2; i++) att_was[i] = getenv(att_env[i]) ? strdup(getenv(att_env[i])) : NULL, unsetenv(att_env[i]);
    memcpy(was_backend, c->specs[0].backend, sizeof was_backend);
    snprintf(c->specs[0].backend, sizeof c->specs[0].backend, "cuda");
    pdde_cost_op fop = op, fback = att_back, gemm_only;
    fop.k = 64, fback.k = 128;
    gemm_only = fop, gemm_only.softmax_bytes = 0;
    double g64 = pdde_cost_compute_time(ctx, c, 0, &gemm_only); /* (the GEMM rate at k 64) */
    gemm_only = fback, gemm_only.softmax_bytes = 0;
    double g128 = pdde_cost_compute_time(ctx, c, 0, &gemm_only);
    CHECK(g64 > 0 && g128 > 0, "the GEMMs' time: %g, %g s", g64, g128);
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &fop), g64 + 160e-6, 1e-12, 0), "f32 attention on CUDA by default: GEMMs + fused curve");
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &fback), g128 + 60e-6, 1e-12, 0), "and its backward");
    setenv("PDDE_CUDA_ATTENTION", "flash", 1);
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &fop), g64, 1e-12, 0), "f32 attention on CUDA's f32 tiled kernels: its GEMMs: %g s",
          pdde_cost_compute_time(ctx, c, 0, &fop));
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &fback), g128, 1e-12, 0), "and the backward at head size 128: its GEMMs");
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &att_back), 1e-3 + 60e-6, 1e-12, 0), "head size 1024 (no tiled kernel): the curve");
    setenv("PDDE_CUDA_ATTENTION", "unfused", 1), setenv("PDDE_ATTENTION", "flash2", 1); /* (the CUDA switch first, as the dispatcher) */
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &fop), g64 + 160e-6, 1e-12, 0), "PDDE_CUDA_ATTENTION=unfused wins");
    unsetenv("PDDE_CUDA_ATTENTION");
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &fop), g64, 1e-12, 0), "PDDE_ATTENTION=flash2 names it too");
    snprintf(c->specs[0].backend, sizeof c->specs[0].backend, "opencl");
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &fop), g64 + 160e-6, 1e-12, 0), "another backend: GEMMs + fused curve");
    for (int i = 0; i < 2; i++) {
        if (att_was[i]) setenv(att_env[i], att_was[i], 1), free(att_was[i]);
        else unsetenv(att_env[i]);
    }
    memcpy(c->specs[0].backend, was_backend, sizeof was_backend);
    c->specs[0].kind = PDDE_DEVICE_CPU;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &hback), 1e-3 + 60e-6, 1e-12, 0), "a CPU's bf16 attention: not the half curve");
    c->specs[0].kind = PDDE_DEVICE_GPU;
    c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_HALF] = c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_HALF_BACKWARD] = 0;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &hop), 1e-3 + 160e-6, 1e-12, 0), "without the half curves: as f32's");
    /* the classes split off for their backward: their own curve, else the broader class's */
    pdde_cost_op gelu = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GELU, .bytes = 500500};
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &gelu), 50.5e-6, 1e-9, 0), "gelu without its curve: the elementwise one");
    c->specs[0].n_curve[PDDE_OPCLASS_GELU] = 1;
    c->specs[0].curve[PDDE_OPCLASS_GELU][0] = (pdde_curve_point){1e5, 40e-6};
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &gelu), 200.2e-6, 1e-9, 0), "gelu at its curve's 0.4 ns a byte");
    pdde_cost_op back = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_ROW_BACKWARD, .bytes = 1e6};
    c->specs[0].n_curve[PDDE_OPCLASS_ROW] = 1;
    c->specs[0].curve[PDDE_OPCLASS_ROW][0] = (pdde_curve_point){1e6, 30e-6};
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &back), 30e-6, 1e-12, 0), "row backward without its curve: the row one");
    back.op_class = PDDE_OPCLASS_LOSS;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &back), 30e-6, 1e-12, 0), "loss without its curve: the row one");
    c->specs[0].n_curve[PDDE_OPCLASS_LOSS] = 1;
    c->specs[0].curve[PDDE_OPCLASS_LOSS][0] = (pdde_curve_point){1e6, 250e-6};
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &back), 250e-6, 1e-12, 0), "loss at its own curve");
    c->specs[0].n_curve[PDDE_OPCLASS_ROW] = 0;
    pdde_cost_op ew = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_ELEMENTWISE, .bytes = 500500};
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &ew), 50.5e-6, 1e-9, 0), "curve midpoint");
    ew.bytes = 2e6;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &ew), 2e-4, 1e-9, 0), "beyond the curve: its last bandwidth");
    ew.bytes = 10;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &ew), 1e-6, 1e-9, 0), "below the curve: its first time");
    ew.op_class = PDDE_OPCLASS_ROW; /* no row curve: the peak bandwidth, flagged */
    ew.bytes = 1e6;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &ew), 1e-5, 1e-12, 0), "row op from mem_bandwidth");
    c->specs[0].mem_bandwidth = 0;
    t = pdde_cost_compute_time(ctx, c, 0, &ew);
    CHECK(isnan(t) && strstr(pdde_last_error(ctx), "no row curve"), "no figure at all: %g, %s", t, pdde_last_error(ctx));
    t = pdde_cost_compute_time(ctx, c, 42, &ew);
    CHECK(isnan(t) && strstr(pdde_last_error(ctx), "no device with id 42"), "unknown device: %s", pdde_last_error(ctx));
    pdde_cluster_free(c);
}

static void test_collectives(void) {
    pdde_cluster *c = make_cluster(1, 4);
    int dev[4] = {0, 1, 2, 3};
    const int64_t n = 1000000; /* 4e6 bytes in f32 */
    /* ring: 2(p-1) steps of latency + (B/p)/bw */
    double t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, dev, 4, n, PDDE_F32);
    CHECK(test_close(t, 6 * (1e-5 + 1e6 / 1e9), 1e-9, 0), "ring allreduce: %g s", t);
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, dev, 4, n, PDDE_BF16);
    CHECK(test_close(t, 6 * (1e-5 + 0.5e6 / 1e9), 1e-9, 0), "bf16 halves the bytes: %g s", t);
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLGATHER, PDDE_ALGO_RING, dev, 4, n, PDDE_F32);
    CHECK(test_close(t, 3 * (1e-5 + 1e6 / 1e9), 1e-9, 0), "ring allgather: %g s", t);
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RECURSIVE, dev, 4, n, PDDE_F32);
    CHECK(test_close(t, 2 * (1e-5 + 4e6 / 1e9), 1e-9, 0), "recursive doubling: log2(4) rounds of the whole buffer: %g s", t);
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RECURSIVE, dev, 3, n, PDDE_F32);
    CHECK(test_close(t, 3 * (1e-5 + 4e6 / 1e9), 1e-9, 0), "3 ranks: a fold in and out around 1 round: %g s", t);
    CHECK(pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, dev, 1, n, PDDE_F32) == 0, "one rank: free");
    /* a measured calibration replaces the model for its op, algorithm and rank count */
    pdde_cluster_add_calib(c, &(pdde_collective_calib){PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, 4, 1, 1e-4, 2e9});
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, dev, 4, n, PDDE_F32);
    CHECK(test_close(t, 1e-4 + 4e6 / 2e9, 1e-9, 0), "calibrated: %g s", t);
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, dev, 2, n, PDDE_F32);
    CHECK(test_close(t, 2 * (1e-5 + 2e6 / 1e9), 1e-9, 0), "not for 2 ranks: %g s", t);
    pdde_cluster_free(c);

    /* two machines of two: the NICs (1e8 B/s, 5 us each end) */
    c = make_cluster(2, 2);
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, dev, 4, n, PDDE_F32);
    CHECK(test_close(t, 6 * (1e-5 + 1e6 / 1e8), 1e-9, 0), "ring across machines: the NIC step: %g s", t);
    int crossed[4] = {0, 2, 1, 3}; /* every edge crosses: two flows leave each NIC at once */
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, crossed, 4, n, PDDE_F32);
    CHECK(test_close(t, 6 * (1e-5 + 2 * 1e6 / 1e8), 1e-9, 0), "a shared NIC halves each flow: %g s", t);
    /* two-level: local reduce-scatter + allgather (2 steps of B/4 on 1e9), the cross allreduce of B/2
     * (2 steps of B/4, two rings through each NIC) */
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_TWO_LEVEL, dev, 4, n, PDDE_F32);
    CHECK(test_close(t, 2 * (1e-5 + 1e6 / 1e9) + 2 * (1e-5 + 2 * 1e6 / 1e8), 1e-9, 0), "two-level: %g s", t);
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, dev, 4, n, PDDE_F32);
    CHECK(test_close(t, 2 * (1e-5 + 1e6 / 1e9) + 2 * (1e-5 + 2 * 1e6 / 1e8), 1e-9, 0), "auto picks two-level across hosts: %g s", t);
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, dev, 4, 1000, PDDE_F32);
    /* round 1 within the machines, round 2 across them with two flows through each NIC */
    CHECK(test_close(t, (1e-5 + 4e3 / 1e9) + (1e-5 + 2 * 4e3 / 1e8), 1e-9, 0), "auto picks recursive doubling when small: %g s", t);
    c->machines[1].nic.bandwidth = 0;
    t = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, dev, 4, n, PDDE_F32);
    CHECK(isnan(t) && strstr(pdde_last_error(ctx), "no bandwidth"), "an unmeasured link: %s", pdde_last_error(ctx));
    pdde_cluster_free(c);
}

static pdde_cost_op gemm_op(const char *name, double flops, int micro, pdde_phase phase) {
    pdde_cost_op op = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GEMM, .m = 1024, .n = 1024, .k = 1024,
                       .flops = flops, .micro = micro, .phase = phase, .last_use = -1};
    snprintf(op.name, sizeof op.name, "%s", name);
    return op;
}

static pdde_cost_op p2p(pdde_cost_op_kind kind, int peer, int tag) {
    pdde_cost_op op = {.kind = kind, .peer = peer, .tag = tag, .count = 1, .dtype = PDDE_F32, .last_use = -1};
    snprintf(op.name, sizeof op.name, "%s %d", kind == PDDE_COST_SEND ? "send" : "recv", tag);
    return op;
}

/* Two stages, 4 micro-batches: F = 1 ms, B = 2 ms, free transfers; each forward keeps A bytes alive until
 * its backward. 1F1B and GPipe both take (M + S - 1)(F + B) = 15 ms with a bubble of (S - 1)(F + B) =
 * 3 ms per stage; the first stage keeps 2 micro-batches alive under 1F1B, 4 under GPipe. */
static void pipeline(int gpipe, pdde_cost_result **out, pdde_cost_program **prog) {
    pdde_cluster *c = make_cluster(1, 2);
    c->machines[0].intra.bandwidth = 1e18, c->machines[0].intra.latency = 0;
    const double A = 1e6;
    pdde_cost_program *p;
    const char *order0 = gpipe ? "FFFFBBBB" : "FFBFBFBB", *order1 = gpipe ? "FFFFBBBB" : "FBFBFBFB";
    pdde_cost_program_init(2, &p);
    pdde_cost_program_set_rank(p, 0, 0, 5e6);
    pdde_cost_program_set_rank(p, 1, 1, 5e6);
    for (int r = 0; r < 2; r++) {
        const char *order = r ? order1 : order0;
        int nf = 0, nb = 0, f_index[4] = {0};
        for (const char *o = order; *o; o++) {
            char name[16];
            if (*o == 'F') {
                int m = nf++;
                if (r == 1) pdde_cost_program_add(p, 1, &(pdde_cost_op[]){p2p(PDDE_COST_RECV, 0, m)}[0]);
                snprintf(name, sizeof name, "F%d", m);
                pdde_cost_op f = gemm_op(name, 1e9, m, PDDE_PHASE_FORWARD);
                f.out_bytes = A;
                f_index[m] = pdde_cost_program_add(p, r, &f);
                if (r == 0) pdde_cost_program_add(p, 0, &(pdde_cost_op[]){p2p(PDDE_COST_SEND, 1, m)}[0]);
            } else {
                int m = nb++;
                if (r == 0) pdde_cost_program_add(p, 0, &(pdde_cost_op[]){p2p(PDDE_COST_RECV, 1, 100 + m)}[0]);
                snprintf(name, sizeof name, "B%d", m);
                pdde_cost_op b = gemm_op(name, 2e9, m, PDDE_PHASE_BACKWARD);
                int bi = pdde_cost_program_add(p, r, &b);
                /* the forward's activations die in the backward: set through a copy of the op */
                pdde_cost_op *fo = (pdde_cost_op *)pdde_cost_program_op(p, r, f_index[m]);
                fo->last_use = bi;
                if (r == 1) pdde_cost_program_add(p, 1, &(pdde_cost_op[]){p2p(PDDE_COST_SEND, 0, 100 + m)}[0]);
            }
        }
    }
    *out = NULL;
    CHECK(pdde_cost_simulate(ctx, c, p, out) == PDDE_OK, "%s", pdde_last_error(ctx));
    *prog = p;
    pdde_cluster_free(c);
}

static void test_pipeline(void) {
    for (int gpipe = 0; gpipe < 2; gpipe++) {
        pdde_cost_result *r;
        pdde_cost_program *p;
        pipeline(gpipe, &r, &p);
        if (!r) { pdde_cost_program_free(p); continue; }
        const char *name = gpipe ? "GPipe" : "1F1B";
        CHECK(test_close(r->step_time, 15e-3, 1e-9, 0), "%s: step %g s", name, r->step_time);
        for (int k = 0; k < 2; k++) {
            CHECK(test_close(r->compute_time[k], 12e-3, 1e-9, 0), "%s rank %d compute %g", name, k, r->compute_time[k]);
            /* the bubble is idle: waiting for a peer to send is not communication (the links here are instant) */
            CHECK(test_close(r->idle[k], 3e-3, 1e-9, 1e-12) && r->comm_wait[k] < 1e-12, "%s rank %d bubble: idle %g, comm wait %g", name, k,
                  r->idle[k], r->comm_wait[k]);
        }
        double want0 = 5e6 + (gpipe ? 4 : 2) * 1e6, want1 = 5e6 + (gpipe ? 4 : 1) * 1e6;
        CHECK(r->peak_memory[0] == want0, "%s: stage 0 peak %g, expected %g", name, r->peak_memory[0], want0);
        CHECK(r->peak_memory[1] == want1, "%s: stage 1 peak %g, expected %g", name, r->peak_memory[1], want1);
        if (!gpipe) {
            char *buf = NULL;
            size_t len = 0;
            FILE *f = open_memstream(&buf, &len);
            pdde_cost_timeline_text(r, f, 30);
            fclose(f);
            /* 30 columns of 0.5 ms: rank 1 waits 1 ms for the first activations (idle: the bubble) */
            CHECK(buf && strstr(buf, "rank   1 |..##"), "timeline text:\n%s", buf ? buf : "");
            printf("%s", buf ? buf : "");
            free(buf);
            char path[64];
            snprintf(path, sizeof path, "/tmp/pdde_test_cost_%d.svg", (int)getpid());
            CHECK(pdde_cost_timeline_svg(ctx, r, p, path) == PDDE_OK, "%s", pdde_last_error(ctx));
            FILE *s = fopen(path, "r");
            char head[8] = {0};
            CHECK(s && fread(head, 1, 4, s) == 4 && !strcmp(head, "<svg"), "svg file");
            if (s) fclose(s);
            remove(path);
        }
        pdde_cost_result_free(r);
        pdde_cost_program_free(p);
    }
}

/* Data parallel on 2 devices: three 1 ms backward ops, then a 1 ms update. The gradient allreduce
 * (1e6 f32 on a 2e9 B/s link: 2 steps of 2e6 B = 2 ms) started after the first backward op overlaps
 * the other two: 4 ms. Run at the update instead, it adds its 2 ms: 6 ms. */
static double dp_step(int async) {
    pdde_cluster *c = make_cluster(1, 2);
    c->machines[0].intra.bandwidth = 2e9, c->machines[0].intra.latency = 0;
    pdde_cost_program *p;
    pdde_cost_program_init(2, &p);
    int g = pdde_cost_program_group(p, 2, (int[]){0, 1});
    pdde_cost_op ar = {.kind = PDDE_COST_COLLECTIVE, .coll = PDDE_COLL_ALLREDUCE, .algo = PDDE_ALGO_RING, .group = g,
                       .count = 1000000, .dtype = PDDE_F32, .async = async, .last_use = -1};
    snprintf(ar.name, sizeof ar.name, "allreduce grads");
    for (int r = 0; r < 2; r++) {
        pdde_cost_program_add(p, r, &(pdde_cost_op){.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GEMM, .m = 1024, .n = 1024, .k = 1024, .flops = 1e9});
        int ai = async ? pdde_cost_program_add(p, r, &ar) : -1;
        for (int i = 0; i < 2; i++)
            pdde_cost_program_add(p, r, &(pdde_cost_op){.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GEMM, .m = 1024, .n = 1024, .k = 1024, .flops = 1e9});
        if (async) pdde_cost_program_add(p, r, &(pdde_cost_op){.kind = PDDE_COST_WAIT, .wait = ai});
        else pdde_cost_program_add(p, r, &ar);
        pdde_cost_program_add(p, r, &(pdde_cost_op){.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GEMM, .m = 1024, .n = 1024, .k = 1024, .flops = 1e9, .phase = PDDE_PHASE_OPTIMIZER});
    }
    pdde_cost_result *r = NULL;
    double t = NAN;
    if (pdde_cost_simulate(ctx, c, p, &r) == PDDE_OK) t = r->step_time;
    else CHECK(0, "%s", pdde_last_error(ctx));
    if (r && !async) CHECK(test_close(r->comm_wait[0], 2e-3, 1e-9, 0), "the blocking allreduce's wait: %g", r->comm_wait[0]);
    pdde_cost_result_free(r);
    pdde_cost_program_free(p);
    pdde_cluster_free(c);
    return t;
}

static void test_overlap_and_errors(void) {
    double t_async = dp_step(1), t_sync = dp_step(0);
    CHECK(test_close(t_async, 4e-3, 1e-9, 0), "overlapped: %g s", t_async);
    CHECK(test_close(t_sync, 6e-3, 1e-9, 0), "at the update: %g s", t_sync);

    pdde_cluster *c = make_cluster(1, 2);
    pdde_cost_program *p;
    pdde_cost_program_init(2, &p);
    pdde_cost_program_add(p, 0, &(pdde_cost_op[]){p2p(PDDE_COST_RECV, 1, 7)}[0]);
    pdde_cost_result *r = NULL;
    CHECK(pdde_cost_simulate(ctx, c, p, &r) == PDDE_ERR_NO_PLAN && !r && strstr(pdde_last_error(ctx), "deadlocks: rank 0 waits at op 0"),
          "%s", pdde_last_error(ctx));
    pdde_cost_program_free(p);
    pdde_cost_program_init(1, &p);
    pdde_cost_program_set_rank(p, 0, 9, 0);
    CHECK(pdde_cost_simulate(ctx, c, p, &r) == PDDE_ERR_NOT_FOUND && strstr(pdde_last_error(ctx), "rank 0 runs on device 9"), "%s", pdde_last_error(ctx));
    pdde_cost_program_free(p);
    pdde_cluster_free(c);
}

/* Sends between CPU ranks move only while the sender is in a communication call (a rendezvous: the
 * receive posted, then the sender's next RECV, collective, WAIT or the end of its step). Rank 0 sends
 * 1 MB, computes 10 ms, receives 1 MB back; rank 1 receives, sends back, computes 5 ms. A transfer
 * takes 10 us + 1e6 B / 1e9 B/s = 1.01 ms. GPUs (their transport is progressed while they compute):
 * rank 1 has the data at 1.01 ms and its answer is in by 2.02 ms, so the step is rank 0's 10 ms.
 * CPUs: rank 0's message moves when it enters its receive at 10 ms (in at 11.01 ms); rank 1's answer,
 * sent after its receive (a call that spans rank 0's receive but is over before the send), moves from
 * its end of step at 16.01 ms (in at 17.02 ms). */
static double ping_pong_step(pdde_device_kind kind) {
    pdde_cluster *c = make_cluster(1, 2);
    c->specs[0].kind = kind;
    pdde_cost_program *p;
    pdde_cost_program_init(2, &p);
    pdde_cost_op there = p2p(PDDE_COST_SEND, 1, 1), back = p2p(PDDE_COST_RECV, 1, 2);
    there.count = back.count = 250000;
    pdde_cost_program_add(p, 0, &there);
    pdde_cost_program_add(p, 0, &(pdde_cost_op[]){gemm_op("compute", 1e10, 0, PDDE_PHASE_FORWARD)}[0]);
    pdde_cost_program_add(p, 0, &back);
    there.kind = PDDE_COST_RECV, there.peer = 0, back.kind = PDDE_COST_SEND, back.peer = 0;
    pdde_cost_program_add(p, 1, &there);
    pdde_cost_program_add(p, 1, &back);
    pdde_cost_program_add(p, 1, &(pdde_cost_op[]){gemm_op("after", 5e9, 0, PDDE_PHASE_FORWARD)}[0]);
    pdde_cost_result *r = NULL;
    CHECK(pdde_cost_simulate(ctx, c, p, &r) == PDDE_OK, "ping-pong: %s", pdde_last_error(ctx));
    double t = r ? r->step_time : NAN;
    pdde_cost_result_free(r);
    pdde_cost_program_free(p);
    pdde_cluster_free(c);
    return t;
}

static void test_rendezvous(void) {
    double gpu = ping_pong_step(PDDE_DEVICE_GPU), cpu = ping_pong_step(PDDE_DEVICE_CPU);
    CHECK(test_close(gpu, 10e-3, 1e-9, 0), "GPU ranks: step %g s, expected 10 ms (the answer is in before it is received)", gpu);
    CHECK(test_close(cpu, 17.02e-3, 1e-9, 0), "CPU ranks: step %g s, expected 17.02 ms (each message moves in its sender's next call)", cpu);
}

/* Ranks sharing a machine's cores (make_cluster's device as a CPU; GEMMs of 1e9 FLOPs: 1 ms of one
 * core; free links). Simulates p on a machine of `cores` cores whose GEMMs run `gemm_contention` and row
 * ops `row_contention` slower with every core busy; the step, and the compute time of each rank in t. */
static double shared_step(pdde_cost_program *p, int cores, pdde_device_kind kind, double gemm_contention, double row_contention,
                          double *t) {
    pdde_cluster *c = make_cluster(1, 3);
    c->specs[0].kind = kind, c->machines[0].cores = cores;
    c->specs[0].contention[PDDE_OPCLASS_GEMM] = gemm_contention, c->specs[0].contention[PDDE_OPCLASS_ROW] = row_contention;
    c->machines[0].intra.latency = 0, c->machines[0].intra.bandwidth = 1e15;
    pdde_cost_result *r = NULL;
    CHECK(pdde_cost_simulate(ctx, c, p, &r) == PDDE_OK, "shared cores: %s", pdde_last_error(ctx));
    double step = r ? r->step_time : NAN;
    for (int k = 0; r && t && k < r->n_ranks; k++) t[k] = r->compute_time[k];
    pdde_cost_result_free(r);
    pdde_cluster_free(c);
    return step;
}

static void test_shared_cores(void) {
    pdde_cost_op ms = gemm_op("1 ms", 1e9, 0, PDDE_PHASE_FORWARD), two = gemm_op("2 ms", 2e9, 0, PDDE_PHASE_FORWARD);
    double t[3];
    /* both compute 2 ms: on one core each at half speed, 4 ms; on two, or cores unknown, 2 ms */
    pdde_cost_program *p;
    pdde_cost_program_init(2, &p);
    pdde_cost_program_add(p, 0, &two), pdde_cost_program_add(p, 1, &two);
    double step = shared_step(p, 1, PDDE_DEVICE_CPU, 0, 0, t);
    CHECK(test_close(step, 4e-3, 1e-9, 0) && test_close(t[0], 4e-3, 1e-9, 0) && test_close(t[1], 4e-3, 1e-9, 0),
          "two ranks on one core: step %g s, compute %g and %g s (expected 4 ms each)", step, t[0], t[1]);
    CHECK(test_close(shared_step(p, 2, PDDE_DEVICE_CPU, 0, 0, NULL), 2e-3, 1e-9, 0), "two ranks on two cores: 2 ms");
    CHECK(test_close(shared_step(p, 0, PDDE_DEVICE_CPU, 0, 0, NULL), 2e-3, 1e-9, 0), "cores unknown: no limit");
    CHECK(test_close(shared_step(p, 2, PDDE_DEVICE_CPU, 1.5, 0, NULL), 3e-3, 1e-9, 0), "both compute on two cores, GEMMs 1.5x slower: 3 ms");
    pdde_cost_program_free(p);

    /* rank 0 computes 2 ms and sends; rank 1 computes 1 ms, receives, computes 1 ms. One core: both at
     * half speed until rank 1's first ms is done at 2 ms; then it waits and rank 0 has its core, ending
     * its last ms at 3 ms; rank 1's last ms alone: 4 ms (a rank charged half a core throughout: 6 ms).
     * Two cores, contention 1.5: rank 1's first ms ends at 1.5 ms, rank 0's last ms alone at 2.5 ms,
     * rank 1's alone: 3.5 ms. Without contention 3 ms, as on GPUs (their own cores). */
    pdde_cost_program_init(2, &p);
    pdde_cost_program_add(p, 0, &two), pdde_cost_program_add(p, 0, &(pdde_cost_op[]){p2p(PDDE_COST_SEND, 1, 1)}[0]);
    pdde_cost_program_add(p, 1, &ms), pdde_cost_program_add(p, 1, &(pdde_cost_op[]){p2p(PDDE_COST_RECV, 0, 1)}[0]);
    pdde_cost_program_add(p, 1, &ms);
    step = shared_step(p, 1, PDDE_DEVICE_CPU, 0, 0, t);
    CHECK(test_close(step, 4e-3, 1e-9, 0) && test_close(t[0], 3e-3, 1e-9, 0) && test_close(t[1], 3e-3, 1e-9, 0),
          "one core, rank 1 waiting from 2 ms: step %g s (expected 4 ms), compute %g s and %g s (3 ms each)", step, t[0], t[1]);
    step = shared_step(p, 2, PDDE_DEVICE_CPU, 1.5, 0, t);
    CHECK(test_close(step, 3.5e-3, 1e-9, 0) && test_close(t[1], 2.5e-3, 1e-9, 0),
          "two cores, contention only while both compute: step %g s (expected 3.5 ms), rank 1 computes %g s (2.5 ms)", step, t[1]);
    CHECK(test_close(shared_step(p, 2, PDDE_DEVICE_CPU, 0, 0, NULL), 3e-3, 1e-9, 0), "two cores, no contention: 3 ms");
    CHECK(test_close(shared_step(p, 1, PDDE_DEVICE_GPU, 1.5, 0, NULL), 3e-3, 1e-9, 0), "GPUs share no cores: 3 ms");
    pdde_cost_program_free(p);

    /* one core, three ranks: rank 2 computes 3 ms; rank 0 computes 1 ms, then an allreduce with rank 1
     * (1/3 ms of latency, at a third of its rate: 3 ranks on the core), which then computes 1 ms. Ranks
     * 0 and 2 share the core until 2 ms; the allreduce runs 2-3 ms while rank 2 computes alone (2 ms of work left, 1 ms of it done by 3 ms);
     * then ranks 1 and 2 share it: both end at 5 ms. */
    pdde_cost_program_init(3, &p);
    int g = pdde_cost_program_group(p, 2, (int[]){0, 1});
    pdde_cost_op ar = {.kind = PDDE_COST_COLLECTIVE, .coll = PDDE_COLL_ALLREDUCE, .algo = PDDE_ALGO_RECURSIVE, .group = g,
                       .count = 2, .dtype = PDDE_F32, .last_use = -1};
    pdde_cost_program_add(p, 0, &ms), pdde_cost_program_add(p, 0, &ar);
    pdde_cost_program_add(p, 1, &ar), pdde_cost_program_add(p, 1, &ms);
    pdde_cost_program_add(p, 2, &(pdde_cost_op[]){gemm_op("3 ms", 3e9, 0, PDDE_PHASE_FORWARD)}[0]);
    pdde_cluster *c = make_cluster(1, 3);
    c->specs[0].kind = PDDE_DEVICE_CPU, c->machines[0].cores = 1;
    c->machines[0].intra.latency = 1e-3 / 3, c->machines[0].intra.bandwidth = 1e15;
    pdde_cost_result *r = NULL;
    CHECK(pdde_cost_simulate(ctx, c, p, &r) == PDDE_OK, "%s", pdde_last_error(ctx));
    CHECK(r && test_close(r->step_time, 5e-3, 1e-9, 0) && test_close(r->compute_time[2], 5e-3, 1e-9, 0) &&
          test_close(r->compute_time[1], 2e-3, 1e-9, 0) && test_close(r->compute_time[0], 2e-3, 1e-9, 0),
          "rank 1 starting after its allreduce: step %g s (expected 5 ms), compute %g, %g, %g s (2, 2, 5 ms)", r ? r->step_time : NAN,
          r ? r->compute_time[0] : NAN, r ? r->compute_time[1] : NAN, r ? r->compute_time[2] : NAN);
    pdde_cost_result_free(r);
    pdde_cluster_free(c);
    pdde_cost_program_free(p);

    /* a class without its own contention figure takes its broader class's: a loss op (1e8 B at the
     * 1e11 B/s fallback: 1 ms) with the row figure 1.2, beside a 1 ms GEMM with none measured: by 1 ms
     * the loss has done 1/1.2 of its work, the rest alone: 1 + 1 - 1/1.2 ms */
    pdde_cost_op loss = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_LOSS, .bytes = 1e8, .last_use = -1};
    pdde_cost_program_init(2, &p);
    pdde_cost_program_add(p, 0, &loss), pdde_cost_program_add(p, 1, &ms);
    step = shared_step(p, 2, PDDE_DEVICE_CPU, 0, 1.2, t);
    CHECK(test_close(step, (2 - 1 / 1.2) * 1e-3, 1e-9, 0) && test_close(t[1], 1e-3, 1e-9, 0),
          "the loss at the row ops' contention 1.2: step %g s (expected 1.167 ms), the GEMM's %g s (1 ms)", step, t[1]);
    pdde_cost_program_free(p);
}

/* A compute op's "<op, 12 characters at most> <phase>": of a graph's program ("<op> <phase>") and of a plan's
 * ("<phase><micro> <op, 12 at most> <tensor>"); "" for any other op. */
static const char *graph_op_key(const pdde_cost_op *o, char *key, size_t cap) {
    const char *sp = strrchr(o->name, ' ');
    snprintf(key, cap, "%.*s %c", sp ? (int)(sp - o->name < 12 ? sp - o->name : 12) : 0, o->name, sp ? sp[1] : '?');
    if (o->kind != PDDE_COST_COMPUTE) key[0] = 0;
    return key;
}

static const char *plan_op_key(const pdde_cost_op *o, char *key, size_t cap) {
    const char *op = strchr(o->name, ' '), *end = op ? strchr(op + 1, ' ') : NULL;
    snprintf(key, cap, "%.*s %c", end ? (int)(end - op - 1) : 0, op ? op + 1 : "", o->name[0]);
    if (o->kind != PDDE_COST_COMPUTE) key[0] = 0;
    return key;
}

/* A graph's program: an MLP step (forward, backward, AdamW) on one device. */
static void test_from_graph(void) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){32, 784});
    pdde_tensor *y = pdde_input(g, "y", PDDE_I32, 1, (int64_t[]){32});
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){784, 128}, 0.02f), *w2 = pdde_param(g, "w2", 2, (int64_t[]){128, 10}, 0.02f);
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, pdde_relu(g, pdde_matmul(g, x, w1, 0, 0)), w2, 0, 0), y);
    pdde_backward(g, loss);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_optimizer_adamw(g, &op);
    pdde_cost_program *p = NULL;
    CHECK(pdde_cost_program_from_graph(g, 0, &p) == PDDE_OK, "%s", pdde_last_error(ctx));
    int gemms = 0, first = 0, updates = 0, losses = 0;
    for (int i = 0; p && i < pdde_cost_program_op_count(p, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
        gemms += o->op_class == PDDE_OPCLASS_GEMM;
        updates += o->op_class == PDDE_OPCLASS_OPTIMIZER;
        losses += o->op_class == PDDE_OPCLASS_LOSS;
        if (o->op_class == PDDE_OPCLASS_GEMM && !first++)
            CHECK(o->m == 32 && o->n == 128 && o->k == 784 && o->phase == PDDE_PHASE_FORWARD, "first GEMM %lldx%lldx%lld",
                  (long long)o->m, (long long)o->n, (long long)o->k);
    }
    /* backward: w2's and relu's input gradients, w1's; not x's (a graph input: the session never computes it) */
    CHECK(gemms == 2 + 3 && updates == 2, "%d GEMMs (2 forward, 3 backward), %d update ops", gemms, updates);
    CHECK(losses == 2, "the cross-entropy and its backward in the loss class: %d", losses);
    pdde_cluster *c = make_cluster(1, 1);
    /* the ops the session runs: those of its program lowered for one process, by op, phase and work */
    pdde_cost_program *lowered = NULL;
    pdde_cost_plan one = {0, (int[]){0}, NULL, 0};
    CHECK(pdde_cost_program_from_plan(c, g, NULL, &one, &lowered) == PDDE_OK, "%s", pdde_last_error(ctx));
    int unmatched = p && lowered ? 0 : -1;
    double graph_work = 0, lowered_work = 0;
    for (int i = 0; p && lowered && i < pdde_cost_program_op_count(p, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
        graph_work += o->bytes + 2.0 * (double)o->m * (double)o->n * (double)o->k;
        char key[32], other[32];
        graph_op_key(o, key, sizeof key);
        int same = 0, same_lowered = 0;
        for (int j = 0; j < pdde_cost_program_op_count(p, 0); j++)
            same += !strcmp(graph_op_key(pdde_cost_program_op(p, 0, j), other, sizeof other), key);
        for (int j = 0; j < pdde_cost_program_op_count(lowered, 0); j++)
            same_lowered += !strcmp(plan_op_key(pdde_cost_program_op(lowered, 0, j), other, sizeof other), key);
        if (same != same_lowered) unmatched++, printf("  %s: %d in the graph's program, %d in the session's\n", key, same, same_lowered);
    }
    for (int j = 0; lowered && j < pdde_cost_program_op_count(lowered, 0); j++) {
        const pdde_cost_op *q = pdde_cost_program_op(lowered, 0, j);
        if (q->kind == PDDE_COST_COMPUTE) lowered_work += q->bytes + 2.0 * (double)q->m * (double)q->n * (double)q->k;
    }
    CHECK(unmatched == 0 && graph_work == lowered_work && pdde_cost_program_op_count(p, 0) == pdde_cost_program_op_count(lowered, 0),
          "the graph's program counts what the session runs: %d op names differ, %d ops against %d, bytes + FLOPs %g against %g", unmatched,
          p ? pdde_cost_program_op_count(p, 0) : 0, lowered ? pdde_cost_program_op_count(lowered, 0) : 0, graph_work, lowered_work);
    pdde_cost_program_free(lowered);
    pdde_cost_result *r = NULL;
    CHECK(p && pdde_cost_simulate(ctx, c, p, &r) == PDDE_OK, "%s", pdde_last_error(ctx));
    if (r) {
        double params = (784.0 * 128 + 128 * 10) * 4;
        CHECK(r->step_time > 0 && r->uncalibrated > 0, "step %g s, %d ops from peak figures", r->step_time, r->uncalibrated);
        CHECK(r->peak_memory[0] > 4 * params, "params, grads, 2 AdamW states and activations: %g", r->peak_memory[0]);
    }
    pdde_cost_result_free(r);
    pdde_cluster_free(c);
    pdde_cost_program_free(p);
    pdde_graph_free(g);
}

/* Fused attention's memory and work as the cost model sees them: [B,H,T,D+1] where the unfused path
 * holds [B,H,T,T] scores and probabilities (the predicted peak and what a session allocates both drop
 * below 0.3x at T = 1024), and its flops are the causal half of the two GEMMs (four times fewer than
 * the unfused forward's full-square GEMMs would give at 2x the rate). */
static void test_attention(void) {
    double peak[2] = {0, 0}, alloc[2] = {0, 0}, flops = 0;
    const int64_t s[4] = {1, 4, 1024, 64};
    for (int fused = 0; fused < 2; fused++) {
        pdde_graph *g;
        pdde_graph_init(ctx, &g);
        pdde_tensor *q = pdde_param(g, "q", 4, s, 1.0f), *k = pdde_param(g, "k", 4, s, 1.0f), *v = pdde_param(g, "v", 4, s, 1.0f);
        pdde_tensor *y = (fused ? pdde_attention : pdde_attention_unfused)(g, q, k, v);
        pdde_backward(g, pdde_sum(g, pdde_mul(g, y, pdde_input(g, "w", PDDE_F32, 4, s)), -1, 0));
        pdde_cost_program *p = NULL;
        pdde_cost_result *r = NULL;
        pdde_cluster *c = make_cluster(1, 1);
        CHECK(pdde_cost_program_from_graph(g, 0, &p) == PDDE_OK && pdde_cost_simulate(ctx, c, p, &r) == PDDE_OK, "%s", pdde_last_error(ctx));
        if (r) peak[fused] = r->peak_memory[0];
        /* the forward's softmax on the fused_attention curve, the backward's on its own: on a CPU with
         * a backward curve 10x slower a byte, the backward node takes its GEMMs + 5/2 x 10 x the
         * forward's softmax time */
        c->specs[0].kind = PDDE_DEVICE_CPU;
        c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION] = c->specs[0].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD] = 1;
        c->specs[0].curve[PDDE_OPCLASS_FUSED_ATTENTION][0] = (pdde_curve_point){1, 1e-9};
        c->specs[0].curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD][0] = (pdde_curve_point){1, 1e-8};
        int seen = 0;
        for (int i = 0; fused && p && i < pdde_cost_program_op_count(p, 0); i++) {
            const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
            int back = !strncmp(o->name, "attention_back B", 16);
            if (strncmp(o->name, "attention F", 11) != 0 && !back) continue;
            seen |= 1 << back;
            pdde_cost_op gemm = *o;
            gemm.softmax_bytes = 0;
            double t = pdde_cost_compute_time(ctx, c, 0, o) - pdde_cost_compute_time(ctx, c, 0, &gemm);
            /* (the scores of the 36 tiles of 128 x 128 on or below the diagonal of T = 1024, each of the 4 heads) */
            double scores = 4.0 * 36 * 128 * 128, want = back ? 5 * 4 * scores * 1e-8 : 2 * 4 * scores * 1e-9;
            CHECK(o->softmax_backward == back && test_close(t, want, 1e-9, 0), "%s: softmax_backward %d, softmax %g s, want %g",
                  o->name, o->softmax_backward, t, want);
            if (back) continue;
            flops = o->flops;
            CHECK(o->op_class == PDDE_OPCLASS_GEMM, "attention is GEMM work");
        }
        CHECK(!fused || seen == 3, "the forward and backward attention nodes (%d)", seen);
        pdde_session *ss = NULL;
        pdde_memory_stats ms;
        if (pdde_session_init(g, NULL, &ss) == PDDE_OK && pdde_session_memory(ss, &ms) == PDDE_OK) alloc[fused] = (double)ms.allocated_bytes;
        CHECK(alloc[fused] > 0, "session: %s", pdde_last_error(ctx));
        pdde_session_free(ss);
        pdde_cost_result_free(r);
        pdde_cluster_free(c);
        pdde_cost_program_free(p);
        pdde_graph_free(g);
    }
    CHECK(peak[1] > 0 && peak[1] < 0.3 * peak[0], "predicted peak: fused %g, unfused %g bytes", peak[1], peak[0]);
    CHECK(alloc[1] > 0 && alloc[1] < 0.3 * alloc[0], "allocated: fused %g, unfused %g bytes", alloc[1], alloc[0]);
    CHECK(flops == 2.0 * 2.0 * 4 * 1024 * 1025 / 2 * 64, "forward flops %g", flops);
    /* under a bf16 compute dtype both attention nodes are GEMMs of bf16 operands (the bf16 rate, as a
     * bf16 matmul's), and the 2-byte q, k, v are what the program keeps */
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *q = pdde_param(g, "q", 4, s, 1.0f), *k = pdde_param(g, "k", 4, s, 1.0f), *v = pdde_param(g, "v", 4, s, 1.0f);
    pdde_graph_set_compute_dtype(g, PDDE_BF16);
    pdde_tensor *y = pdde_attention(g, q, k, v);
    pdde_graph_set_compute_dtype(g, PDDE_F32);
    pdde_backward(g, pdde_sum(g, pdde_mul(g, y, pdde_input(g, "w", PDDE_F32, 4, s)), -1, 0));
    pdde_cost_program *p = NULL;
    CHECK(pdde_cost_program_from_graph(g, 0, &p) == PDDE_OK, "%s", pdde_last_error(ctx));
    int bf16_gemms = 0;
    for (int i = 0; p && i < pdde_cost_program_op_count(p, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
        if (strstr(o->name, "attention")) bf16_gemms += o->op_class == PDDE_OPCLASS_GEMM && o->dtype == PDDE_BF16;
    }
    CHECK(bf16_gemms == 2, "bf16 attention: %d of its 2 nodes are bf16 GEMM work", bf16_gemms);
    pdde_cost_program_free(p);
    pdde_graph_free(g);
}

/* A window on an attention's starts (pdde_attention_window): its nodes' work is the pairs the window keeps (the first W
 * queries' triangle, then W keys each), not the causal triangle, in the forward and backward FLOPs and the softmax
 * bytes; GPT's --window gives it, and it holds on the starts a data-parallel plan splits (each rank's half batch), the
 * predicted step shorter than the same model's without; a window on what is not an i32 input, or of no key, refused. */
static double window_pairs(double T, double W) { return W >= T ? T * (T + 1) / 2 : W * (W + 1) / 2 + (T - W) * W; }

static void test_attention_window(void) {
    const int64_t B = 2, H = 4, T = 1024, D = 64, W = 128, s[4] = {B, H, T, D};
    for (int windowed = 0; windowed < 2; windowed++) {
        pdde_graph *g;
        pdde_graph_init(ctx, &g);
        pdde_tensor *q = pdde_param(g, "q", 4, s, 1.0f), *k = pdde_param(g, "k", 4, s, 1.0f), *v = pdde_param(g, "v", 4, s, 1.0f);
        pdde_tensor *starts = pdde_input(g, "starts", PDDE_I32, 2, (int64_t[]){B, T});
        if (windowed) CHECK(pdde_attention_window(g, starts, (int)W) == PDDE_OK, "attention_window: %s", pdde_last_error(ctx));
        pdde_tensor *y = pdde_attention_docs(g, q, k, v, starts);
        pdde_backward(g, pdde_sum(g, pdde_mul(g, y, pdde_input(g, "w", PDDE_F32, 4, s)), -1, 0));
        pdde_cost_program *p = NULL;
        CHECK(pdde_cost_program_from_graph(g, 0, &p) == PDDE_OK, "%s", pdde_last_error(ctx));
        double pairs = B * H * (windowed ? window_pairs(T, W) : window_pairs(T, T));
        /* the scores of the tiles of 128 x 128 computed: the causal 8 x 9 / 2; under the window, the first query tile's
         * diagonal tile and each other's with the one before it */
        double tiles = windowed ? 1 + 7 * 2 : 8 * 9 / 2;
        int seen = 0;
        for (int i = 0; p && i < pdde_cost_program_op_count(p, 0); i++) {
            const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
            int back = !strncmp(o->name, "attention_back B", 16);
            if (strncmp(o->name, "attention F", 11) != 0 && !back) continue;
            seen |= 1 << back;
            double flops = (back ? 5 : 2) * 2.0 * pairs * D, bytes = (back ? 5 : 2) * 4.0 * B * H * tiles * 128 * 128;
            CHECK(test_close(o->flops, flops, 1e-12, 0) && test_close(o->softmax_bytes, bytes, 1e-12, 0),
                  "%s %s: %g flops, %g softmax bytes; want %g, %g", windowed ? "window 128" : "causal", o->name, o->flops, o->softmax_bytes, flops, bytes);
        }
        CHECK(seen == 3, "the forward and backward attention nodes (%d)", seen);
        pdde_cost_program_free(p);
        if (windowed) { /* (the graph failed: refused calls fail it, as a builder's bad input does) */
            CHECK(pdde_attention_window(g, q, 4) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "q must be the i32 input given as an attention's starts"),
                  "a window on a parameter refused: %s", pdde_last_error(ctx));
            pdde_graph_free(g), pdde_graph_init(ctx, &g);
            starts = pdde_input(g, "starts", PDDE_I32, 2, (int64_t[]){B, T});
            CHECK(pdde_attention_window(g, starts, 0) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "window 0 of starts: at least 1 key"),
                  "a window of 0 keys refused: %s", pdde_last_error(ctx));
        }
        pdde_graph_free(g);
    }
    /* GPT --window 16 at --ctx 256 under --dp 2: each rank's attention of batch 2 priced at the window's pairs, and the
     * step predicted shorter than --window 256's (no window: the whole causal triangle) */
    double step[2] = {0, 0};
    for (int windowed = 0; windowed < 2; windowed++) {
        pdde_cluster *c = make_cluster(1, 2);
        gpt_config cfg = {.vocab = 64, .ctx = 256, .layers = 1, .heads = 2, .width = 64, .batch = 4, .doc_mask = 1, .doc_token = 0,
                          .window = windowed ? 16 : 256};
        gpt_plan gp = {.dp = 2, .tp = 1, .pp = 1, .micro = 1};
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        pdde_graph *g;
        pdde_graph_init(ctx, &g);
        gpt_model m;
        pdde_cost_plan cpl = {2, NULL, NULL, 0};
        pdde_cost_program *cp = NULL;
        pdde_cost_result *r = NULL;
        CHECK(gpt_build_plan(g, &cfg, &gp, &op, &m) == PDDE_OK && pdde_cost_program_from_plan(c, g, NULL, &cpl, &cp) == PDDE_OK &&
              pdde_cost_simulate(ctx, c, cp, &r) == PDDE_OK, "gpt --window: %s", pdde_last_error(ctx));
        double want = 2 * 2.0 * 2 * 2 * window_pairs(256, windowed ? 16 : 256) * 32, got = -1; /* (batch 2 a rank, 2 heads of 32) */
        for (int i = 0; cp && i < pdde_cost_program_op_count(cp, 0) && got < 0; i++) {
            const pdde_cost_op *o = pdde_cost_program_op(cp, 0, i);
            if (!strncmp(o->name, "F0 attention ", 13)) got = o->flops;
        }
        CHECK(test_close(got, want, 1e-12, 0), "gpt --window %d --dp 2: rank 0's attention %g flops, want %g", cfg.window, got, want);
        if (r) step[windowed] = r->step_time;
        pdde_cost_result_free(r), pdde_cost_program_free(cp), pdde_graph_free(g), pdde_cluster_free(c);
    }
    CHECK(step[1] > 0 && step[1] < step[0], "predicted step: window 16 %g s, none %g s", step[1], step[0]);
}

/* The search's estimate, which ranks plans before any simulation (and gpt --plan auto prints), against the simulation
 * of the plan's lowered program, where attention is most of the step: a LLaMA of context 1024 and 2048 (window 0 and
 * 256) on a 2-core machine's calibration (tests/data/moe_cpu_2core_cluster.json). The device's GEMM rate the search
 * takes is the graph's FLOPs over their modelled time, an attention's own FLOPs among them (not its tile's m n k),
 * and it counts the attention's backward as GEMM work: within 5% (the rate from tile shapes, and the backward as
 * memory traffic: 15% over at 1024). */
static void test_search_matches_simulation(void) {
    const char *file = "tests/data/moe_cpu_2core_cluster.json";
    pdde_cluster *c = NULL;
    CHECK(pdde_cluster_load(ctx, file, &c) == PDDE_OK, "%s: %s", file, pdde_last_error(ctx));
    for (int k = 0; c && k < 3; k++) {
        gpt_config cfg = {.arch = GPT_ARCH_LLAMA, .vocab = 256, .ctx = k ? 2048 : 1024, .layers = 4, .heads = 4, .width = 128, .batch = 2,
                          .window = k == 2 ? 256 : 0};
        double step[2] = {0, 0};
        for (int simulate = 0; simulate < 2; simulate++) {
            pdde_plan_devices d;
            pdde_plan plans[4];
            int nf = 0, nr = 0;
            pdde_status st = gpt_plan_devices(ctx, file, &cfg, 1, &d);
            if (!st) st = gpt_plan_search_cluster(ctx, &cfg, &d, 0, c, simulate, plans, 4, &nf, &nr), pdde_plan_devices_free(&d);
            CHECK(st == PDDE_OK && nf > 0, "ctx %d window %d: %s", cfg.ctx, cfg.window, st ? pdde_last_error(ctx) : "no plan");
            if (nf > 0) step[simulate] = plans[0].step_s;
        }
        CHECK(step[0] > 0 && step[1] > 0 && fabs(step[0] / step[1] - 1) < 0.05, "ctx %d window %d: the search's estimate %.4g s, simulated %.4g s",
              cfg.ctx, cfg.window, step[0], step[1]);
    }
    pdde_cluster_free(c);
}

/* A plan's real programs: what each rank communicates, with whom, on which device, and its memory. */
static const gpt_config small = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 8};

/* The GPT of `small` under plan text, lowered for every rank and simulated on c (rank_devices NULL:
 * the cluster's devices in order); *g and *p for the caller to free. */
static pdde_cost_result *simulate_plan(pdde_cluster *c, const char *text, const pdde_session_params *sp, const int *rank_devices,
                                       pdde_graph **g, pdde_cost_program **p) {
    pdde_plan pl;
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_cost_result *r = NULL;
    *p = NULL;
    pdde_graph_init(ctx, g);
    CHECK(pdde_plan_parse(text, &pl) == PDDE_OK, "parse %s", text);
    gpt_plan gp = gpt_plan_of(&pl);
    int ranks = pl.dp * pl.tp * pl.pp;
    pdde_cost_plan cp = {ranks > 1 ? ranks : 0, rank_devices, NULL, 0};
    CHECK(gpt_build_plan(*g, &small, &gp, &op, &m) == PDDE_OK && pdde_cost_program_from_plan(c, *g, sp, &cp, p) == PDDE_OK &&
          pdde_cost_simulate(ctx, c, *p, &r) == PDDE_OK, "%s: %s", text, pdde_last_error(ctx));
    return r;
}

/* Lowering's fusion switches (off by default): set aside while a test compares the programs without them (saved: the values before; on = 0 sets them aside, 1 puts them back) */
static const char *const fusion_switches[] = {"PDDE_FUSE_EPILOGUE", "PDDE_FUSE_GRAD", "PDDE_FUSE_ADD_LN"};
static char *fusion_saved[3];

static void fusions_restore(int on) {
    for (int k = 0; k < 3; k++) {
        if (!on) {
            const char *v = getenv(fusion_switches[k]);
            fusion_saved[k] = v ? strdup(v) : NULL;
            unsetenv(fusion_switches[k]);
        } else if (fusion_saved[k]) {
            setenv(fusion_switches[k], fusion_saved[k], 1);
            free(fusion_saved[k]), fusion_saved[k] = NULL;
        }
    }
}

/* Lowering's graph fusions by device, through the cost model's program of a graph for a cluster device
 * (pdde_cost_program_from_graph_on: lowered as that device's backend runs it). By default they are on for
 * a CUDA device in a bf16 graph (what a GPU run measured faster) and off on any other backend and in f32;
 * a variable "0" turns its fusion off on CUDA too, "1" on anywhere; PDDE_FUSE_GELU stays off by default. */
static const char *const fusion_names[] = {"PDDE_FUSE_EPILOGUE", "PDDE_FUSE_GRAD", "PDDE_FUSE_ADD_LN", "PDDE_BF16_LOGITS",
                                           "PDDE_BF16_GRADS",    "PDDE_ATT_LOWP",  "PDDE_FUSE_GELU", "PDDE_FUSE_CE",
                                           "PDDE_FUSE_BGRAD"};
enum { N_FUSIONS = sizeof fusion_names / sizeof fusion_names[0] };

typedef struct { int ops, casts, adds, gelus; } program_counts;

/* The ops of g's program on cluster device dev that run (views cost nothing): all, casts, adds, bias_gelus */
static program_counts count_program(pdde_graph *g, pdde_cluster *c, int dev) {
    program_counts n = {0, 0, 0, 0};
    pdde_cost_program *p = NULL;
    CHECK(pdde_cost_program_from_graph_on(g, c, dev, &p) == PDDE_OK, "program for device %d: %s", dev, pdde_last_error(ctx));
    for (int i = 0; p && i < pdde_cost_program_op_count(p, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
        if (o->bytes <= 0) continue;
        n.ops++;
        n.casts += !strncmp(o->name, "cast ", 5), n.adds += !strncmp(o->name, "add ", 4), n.gelus += !strncmp(o->name, "bias_gelu ", 10);
    }
    pdde_cost_program_free(p);
    return n;
}

/* The bytes the ops of g's program on cluster device dev whose names start with `name` (an op, a space) move */
static double program_bytes(pdde_graph *g, pdde_cluster *c, int dev, const char *name) {
    pdde_cost_program *p = NULL;
    double b = 0;
    CHECK(pdde_cost_program_from_graph_on(g, c, dev, &p) == PDDE_OK, "program for device %d: %s", dev, pdde_last_error(ctx));
    for (int i = 0; p && i < pdde_cost_program_op_count(p, 0); i++)
        if (!strncmp(pdde_cost_program_op(p, 0, i)->name, name, strlen(name))) b += pdde_cost_program_op(p, 0, i)->bytes;
    pdde_cost_program_free(p);
    return b;
}

/* The ops that run of a plan's program for one process on cluster device dev (pdde_cost_program_from_plan) */
static int count_plan(pdde_graph *g, pdde_cluster *c, int dev) {
    pdde_cost_plan one = {0, &dev, NULL, 0};
    pdde_cost_program *p = NULL;
    int n = 0;
    CHECK(pdde_cost_program_from_plan(c, g, NULL, &one, &p) == PDDE_OK, "plan on device %d: %s", dev, pdde_last_error(ctx));
    for (int i = 0; p && i < pdde_cost_program_op_count(p, 0); i++) n += pdde_cost_program_op(p, 0, i)->bytes > 0;
    pdde_cost_program_free(p);
    return n;
}

static void test_fusion_defaults(void) {
    char *saved[N_FUSIONS];
    for (int k = 0; k < N_FUSIONS; k++) { /* (the test sets them itself) */
        const char *v = getenv(fusion_names[k]);
        saved[k] = v ? strdup(v) : NULL;
        unsetenv(fusion_names[k]);
    }
    pdde_cluster *c;
    pdde_cluster_init("backends", &c);
    static const char *const backends[] = {"cuda", "opencl", "cpu"};
    for (int i = 0; i < 3; i++) {
        pdde_device_spec s = {.kind = i < 2 ? PDDE_DEVICE_GPU : PDDE_DEVICE_CPU, .peak_flops = 1e12, .mem_bandwidth = 1e11};
        snprintf(s.name, sizeof s.name, "%s device", backends[i]);
        snprintf(s.backend, sizeof s.backend, "%s", backends[i]);
        pdde_cluster_add_spec(c, &s);
    }
    int mi = pdde_cluster_add_machine(c, &(pdde_cluster_machine){.id = 0, .intra = {-1, -1, PDDE_LINK_PCIE, 1e10, 1e-5, -1},
                                                                   .nic = {-1, -1, PDDE_LINK_NET, 1e9, 5e-6, -1}});
    for (int i = 0; i < 3; i++) pdde_cluster_add_device(c, mi, &(pdde_cluster_device){i, i, 1ull << 34});
    const int CUDA = 0, OPENCL = 1, CPU = 2;
    pdde_graph *g[2];
    for (int b = 0; b < 2; b++) { /* 0: bf16, 1: f32 */
        gpt_model m;
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        pdde_graph_init(ctx, &g[b]);
        if (!b) pdde_graph_set_compute_dtype(g[b], PDDE_BF16);
        CHECK(gpt_build(g[b], &small, &m) == PDDE_OK && pdde_backward(g[b], m.loss) == PDDE_OK && pdde_optimizer_adamw(g[b], &op) == PDDE_OK,
              "gpt graph: %s", pdde_last_error(ctx));
    }
    program_counts cu = count_program(g[0], c, CUDA), cl = count_program(g[0], c, OPENCL), cpu = count_program(g[0], c, CPU);
    pdde_cost_program *dflt = NULL; /* (without a cluster: lowered for the context's device 0, the CPU) */
    CHECK(pdde_cost_program_from_graph(g[0], CPU, &dflt) == PDDE_OK, "%s", pdde_last_error(ctx));
    int dflt_ops = 0;
    for (int i = 0; dflt && i < pdde_cost_program_op_count(dflt, 0); i++) dflt_ops += pdde_cost_program_op(dflt, 0, i)->bytes > 0;
    pdde_cost_program_free(dflt);
    printf("bf16 by default: cuda %d ops (%d casts, %d adds, %d bias_gelu), opencl %d (%d, %d, %d), cpu %d\n", cu.ops, cu.casts, cu.adds,
           cu.gelus, cl.ops, cl.casts, cl.adds, cl.gelus, cpu.ops);
    CHECK(cu.ops < cl.ops && cu.casts < cl.casts && cu.adds < cl.adds, "bf16 on CUDA: fusions on by default: %d ops (%d casts, %d adds) vs OpenCL's %d (%d, %d)",
          cu.ops, cu.casts, cu.adds, cl.ops, cl.casts, cl.adds);
    CHECK(cl.ops == cpu.ops && cl.casts == cpu.casts && cpu.ops == dflt_ops, "bf16 on OpenCL and the CPU: no fusion by default: %d, %d, %d ops",
          cl.ops, cpu.ops, dflt_ops);
    CHECK(cu.gelus == cl.gelus && cu.gelus > 0, "PDDE_FUSE_GELU stays off by default on CUDA: %d bias_gelu ops (OpenCL %d)", cu.gelus, cl.gelus);
    double cu_ce_back = program_bytes(g[0], c, CUDA, "cross_entropy_back "), cl_ce_back = program_bytes(g[0], c, OPENCL, "cross_entropy_back ");
    CHECK(cu_ce_back == 0 && cl_ce_back > 0, "PDDE_FUSE_CE is on by default on CUDA only: the loss's backward moves %.0f bytes there, %.0f on OpenCL",
          cu_ce_back, cl_ce_back);
    /* a plan's programs (planner/simulate.c) lowered for the rank's cluster device the same way */
    int plan_cu = count_plan(g[0], c, CUDA), plan_cl = count_plan(g[0], c, OPENCL);
    CHECK(plan_cu < plan_cl, "a plan's program: %d ops on CUDA, %d on OpenCL", plan_cu, plan_cl);
    program_counts f32cu = count_program(g[1], c, CUDA), f32cl = count_program(g[1], c, OPENCL);
    CHECK(f32cu.ops == f32cl.ops && f32cu.adds == f32cl.adds, "f32 on CUDA: no fusion by default: %d ops vs OpenCL's %d", f32cu.ops, f32cl.ops);
    /* "0": each one off on CUDA; all of them: the OpenCL program */
    setenv("PDDE_ATT_LOWP", "0", 1);
    program_counts no_att = count_program(g[0], c, CUDA);
    CHECK(no_att.casts > cu.casts && no_att.casts < cl.casts, "PDDE_ATT_LOWP=0 on CUDA: %d casts (all on %d, none %d)", no_att.casts, cu.casts,
          cl.casts);
    for (int k = 0; k < N_FUSIONS; k++) setenv(fusion_names[k], "0", 1);
    program_counts off = count_program(g[0], c, CUDA);
    CHECK(off.ops == cl.ops && off.casts == cl.casts && off.adds == cl.adds, "every switch 0 on CUDA: %d ops (%d casts), OpenCL %d (%d)", off.ops,
          off.casts, cl.ops, cl.casts);
    int plan_off = count_plan(g[0], c, CUDA);
    CHECK(plan_off == plan_cl, "every switch 0: a plan's program on CUDA %d ops, on OpenCL %d", plan_off, plan_cl);
    /* "1": on where the default is off */
    setenv("PDDE_FUSE_EPILOGUE", "1", 1);
    program_counts epi = count_program(g[0], c, OPENCL), epi32 = count_program(g[1], c, CPU);
    CHECK(epi.adds < cl.adds && epi32.adds < f32cl.adds, "PDDE_FUSE_EPILOGUE=1 on OpenCL (bf16) and the CPU (f32): %d, %d adds (without: %d, %d)",
          epi.adds, epi32.adds, cl.adds, f32cl.adds);
    /* PDDE_FUSE_CE=1 (on by default only on CUDA in bf16): the cross-entropy's forward writes dlogits too and is priced with them
     * (the bytes of the backward it replaces, plus its 4-byte loss: the logits read once), the backward (it computes
     * nothing) nothing */
    double ce0 = program_bytes(g[1], c, CPU, "cross_entropy "), back0 = program_bytes(g[1], c, CPU, "cross_entropy_back ");
    setenv("PDDE_FUSE_CE", "1", 1);
    double ce1 = program_bytes(g[1], c, CPU, "cross_entropy "), back1 = program_bytes(g[1], c, CPU, "cross_entropy_back ");
    setenv("PDDE_FUSE_CE", "0", 1);
    CHECK(ce0 > 4 && back0 > ce0 && back1 == 0 && ce1 == back0 + 4, "PDDE_FUSE_CE=1: cross_entropy %.0f bytes (unfused %.0f), its backward "
          "%.0f (unfused %.0f): want the backward's + 4 and 0", ce1, ce0, back1, back0);
    for (int k = 0; k < N_FUSIONS; k++) {
        if (saved[k]) setenv(fusion_names[k], saved[k], 1);
        else unsetenv(fusion_names[k]);
        free(saved[k]);
    }
    pdde_graph_free(g[0]), pdde_graph_free(g[1]);
    pdde_cluster_free(c);
}

static void test_plan_programs(void) {
    pdde_cluster *c = make_cluster(1, 4);
    pdde_graph *g;
    pdde_cost_program *p;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    /* one process: the lowered program computes what the graph's program does, its fused attention
     * nodes as the GEMM work they are (not as free GEMMs); lowering's fusions, which the graph's program
     * does not see, set aside (the test passes with them switched on) */
    fusions_restore(0);
    pdde_cost_result *one = simulate_plan(c, "", NULL, NULL, &g, &p), *whole = NULL;
    fusions_restore(1);
    pdde_cost_program *gp = NULL;
    CHECK(pdde_cost_program_from_graph(g, 0, &gp) == PDDE_OK && pdde_cost_simulate(ctx, c, gp, &whole) == PDDE_OK, "%s", pdde_last_error(ctx));
    CHECK(one && whole && test_close(one->compute_time[0], whole->compute_time[0], 1e-12, 0), "one process: lowered %g s, graph %g s",
          one ? one->compute_time[0] : 0, whole ? whole->compute_time[0] : 0);
    double attention = 0;
    for (int i = 0; p && i < pdde_cost_program_op_count(p, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
        if (strstr(o->name, " attention")) attention += pdde_cost_compute_time(ctx, c, 0, o);
    }
    /* each of the 2 layers: the causal half of 2 forward and 5 backward GEMMs, 2*B*H*T*(T+1)/2*D
     * FLOPs each, rated at its tiles' shape B*H*T x T x D = 256 x 16 x 16: the inverse-distance
     * weighting (log space) of the 64^3 point (0.5e12, distance 3 ln(4)^2) and the 1024^3 one (1e12,
     * ln(4)^2 + 2 ln(64)^2) */
    double d64 = 3 * log(4) * log(4), d1024 = log(4) * log(4) + 2 * log(64) * log(64);
    double rate = (0.5e12 / d64 + 1e12 / d1024) / (1 / d64 + 1 / d1024);
    double expect = small.layers * 7 * 2.0 * (8.0 * 2 * 16 * 17 / 2 * 16) / rate;
    CHECK(test_close(attention, expect, 1e-9, 0), "fused attention in the lowered program: %g s, expected %g s", attention, expect);
    /* with lowering's fusions switched on the graph's program is the lowered one's too (the adds and gelus
     * the matmuls took in cost nothing): the same time, below the unfused one */
    double unfused = one ? one->compute_time[0] : 0;
    pdde_cost_result_free(one), pdde_cost_result_free(whole), pdde_cost_program_free(gp), pdde_cost_program_free(p), pdde_graph_free(g);
    fusions_restore(0);
    setenv("PDDE_FUSE_EPILOGUE", "1", 1), setenv("PDDE_FUSE_ADD_LN", "1", 1), setenv("PDDE_FUSE_GELU", "1", 1);
    one = simulate_plan(c, "", NULL, NULL, &g, &p), whole = NULL, gp = NULL;
    CHECK(pdde_cost_program_from_graph(g, 0, &gp) == PDDE_OK && pdde_cost_simulate(ctx, c, gp, &whole) == PDDE_OK, "%s", pdde_last_error(ctx));
    printf("one process: %.4g s compute unfused, %.4g s with the fusions (lowered), %.4g s (the graph's program)\n", unfused,
           one ? one->compute_time[0] : 0, whole ? whole->compute_time[0] : 0);
    CHECK(one && whole && test_close(one->compute_time[0], whole->compute_time[0], 1e-12, 0) && one->compute_time[0] < unfused,
          "fused: lowered %g s, graph %g s, unfused %g s", one ? one->compute_time[0] : 0, whole ? whole->compute_time[0] : 0, unfused);
    unsetenv("PDDE_FUSE_EPILOGUE"), unsetenv("PDDE_FUSE_ADD_LN"), unsetenv("PDDE_FUSE_GELU");
    fusions_restore(1);
    pdde_cost_result_free(one), pdde_cost_result_free(whole), pdde_cost_program_free(gp), pdde_cost_program_free(p), pdde_graph_free(g);
    sp.overlap_gradients = 1;
    double params = (double)gpt_n_params(&small);
    /* data parallel: every gradient is allreduced once over both ranks, started early (async) and
     * completed at a WAIT; the ranks' memory is their memory plan's */
    pdde_cost_result *r = simulate_plan(c, "dp=2", &sp, NULL, &g, &p);
    for (int k = 0; r && k < 2; k++) {
        double reduced = 0;
        int waits = 0, asyncs = 0;
        for (int i = 0; i < pdde_cost_program_op_count(p, k); i++) {
            const pdde_cost_op *o = pdde_cost_program_op(p, k, i);
            if (o->kind == PDDE_COST_COLLECTIVE && o->async) reduced += (double)o->count, asyncs++;
            waits += o->kind == PDDE_COST_WAIT;
        }
        CHECK(reduced == params && asyncs == waits && asyncs > 0, "dp=2 rank %d: %.0f gradient elements allreduced early (%d, %d waits), %.0f parameters",
              k, reduced, asyncs, waits, params);
        pdde_memory_stats ms;
        CHECK(pdde_predict_memory(g, &sp, 2, k, &ms) == PDDE_OK && r->peak_memory[k] == (double)(ms.allocated_bytes + ms.transfer_bytes),
              "dp=2 rank %d: simulated peak %.0f, memory plan %zu + %zu", k, r->peak_memory[k], ms.allocated_bytes, ms.transfer_bytes);
        CHECK(r->comm_wait[k] > 0 && r->compute_time[k] > 0, "dp=2 rank %d communicates (%g s) and computes (%g s)", k, r->comm_wait[k], r->compute_time[k]);
    }
    double dp_compute = r ? r->compute_time[0] : 0;
    pdde_cost_result_free(r), pdde_cost_program_free(p), pdde_graph_free(g);
    /* gradient buckets: one collective a bucket, its latency paid once. dp=2 carries its 28 gradient
     * allreduces (4P = 112128 bytes) in one bucket (25 MiB), or in 28 collectives without buckets. On
     * this cluster (1e-5 s latency, 1e9 B/s within the machine) an allreduce over 2 ranks of up to 64
     * KiB is one round of recursive doubling, 1e-5 s + bytes / 1e9 (every gradient here: 16 KiB at
     * most), a larger one a ring of 2 steps of 1e-5 s + bytes / 2e9 (the bucket): 28e-5 + 4P / 1e9 s
     * without buckets, 2e-5 + 4P / 1e9 s with */
    for (int bucketed = 0; bucketed < 2; bucketed++) {
        sp.gradient_bucket_bytes = bucketed ? 0 : -1;
        r = simulate_plan(c, "dp=2", &sp, NULL, &g, &p);
        int n = 0;
        double elems = 0, seconds = 0;
        for (int i = 0; r && i < pdde_cost_program_op_count(p, 0); i++) {
            const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
            if (o->kind != PDDE_COST_COLLECTIVE || !strcmp(o->name, "loss allreduce")) continue;
            n++, elems += (double)o->count;
            seconds += pdde_cost_collective_time(ctx, c, o->coll, o->algo, (const int[]){0, 1}, 2, o->count, o->dtype);
        }
        int want = bucketed ? 1 : 28;
        double want_s = (bucketed ? 2e-5 : 28e-5) + 4 * params / 1e9;
        CHECK(n == want && elems == params && test_close(seconds, want_s, 1e-9, 0), "dp=2 %s: %d gradient collectives of %.0f elements in "
              "%g s, want %d of %.0f in %g s", bucketed ? "bucketed" : "unbucketed", n, elems, seconds, want, params, want_s);
        pdde_cost_result_free(r), pdde_cost_program_free(p), pdde_graph_free(g);
    }
    sp.gradient_bucket_bytes = 0;
    /* bf16 on the wire: the same elements in half the bytes */
    sp.comm_dtype = PDDE_BF16;
    r = simulate_plan(c, "dp=2", &sp, NULL, &g, &p);
    int bf16 = 0, other = 0;
    double reduced = 0;
    for (int i = 0; r && i < pdde_cost_program_op_count(p, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
        if (o->kind != PDDE_COST_COLLECTIVE || !strcmp(o->name, "loss allreduce")) continue;
        bf16 += o->dtype == PDDE_BF16, other += o->dtype != PDDE_BF16, reduced += (double)o->count;
    }
    CHECK(bf16 > 0 && other == 0 && reduced == params, "comm_dtype bf16: %d gradient allreduces in bf16, %d not, %.0f elements (%.0f parameters)",
          bf16, other, reduced, params);
    pdde_cost_result_free(r), pdde_cost_program_free(p), pdde_graph_free(g);
    sp.comm_dtype = PDDE_F32;
    /* a device half as fast (its own spec): the rank on it computes twice as long */
    pdde_device_spec slow = c->specs[0];
    for (int i = 0; i < slow.n_gemm; i++) slow.gemm[i].flops /= 2;
    for (int i = 0; i < slow.n_curve[PDDE_OPCLASS_ELEMENTWISE]; i++) slow.curve[PDDE_OPCLASS_ELEMENTWISE][i].seconds *= 2;
    slow.peak_flops /= 2, slow.mem_bandwidth /= 2;
    c->machines[0].devices[3].spec = pdde_cluster_add_spec(c, &slow);
    r = simulate_plan(c, "dp=2", &sp, (const int[]){0, 3}, &g, &p);
    CHECK(r && test_close(r->compute_time[1], 2 * r->compute_time[0], 1e-9, 0) && test_close(r->compute_time[0], dp_compute, 1e-12, 0),
          "dp=2 with rank 1 on a device half as fast: compute %g s and %g s (rank 0 alone %g s)", r ? r->compute_time[0] : 0,
          r ? r->compute_time[1] : 0, dp_compute);
    CHECK(r && r->idle[0] > 0.5 * r->compute_time[0], "the fast rank waits for the slow one at the gradient allreduces: idle %g s", r ? r->idle[0] : 0);
    pdde_cost_result_free(r), pdde_cost_program_free(p), pdde_graph_free(g);
    /* uneven shares: rank 0 runs three micro-batches of the same shape to rank 1's one, and its memory
     * (as its session plans it) holds the inputs of three */
    r = simulate_plan(c, "dp=2,shares=3:1", &sp, NULL, &g, &p);
    int forward_ops[2] = {0, 0};
    for (int k = 0; r && k < 2; k++) {
        for (int i = 0; i < pdde_cost_program_op_count(p, k); i++) {
            const pdde_cost_op *o = pdde_cost_program_op(p, k, i);
            forward_ops[k] += o->kind == PDDE_COST_COMPUTE && o->phase == PDDE_PHASE_FORWARD;
        }
        pdde_memory_stats ms;
        CHECK(pdde_predict_memory(g, &sp, 2, k, &ms) == PDDE_OK && r->peak_memory[k] == (double)(ms.allocated_bytes + ms.transfer_bytes),
              "shares 3:1 rank %d: simulated peak %.0f, memory plan %zu + %zu", k, r->peak_memory[k], ms.allocated_bytes, ms.transfer_bytes);
    }
    CHECK(forward_ops[1] > 0 && forward_ops[0] == 3 * forward_ops[1], "shares 3:1: %d forward ops on rank 0, %d on rank 1", forward_ops[0], forward_ops[1]);
    CHECK(r && r->peak_memory[0] > r->peak_memory[1] && r->compute_time[0] > 1.5 * r->compute_time[1],
          "shares 3:1: rank 0 holds more (%.0f, %.0f bytes) and computes longer (%g s, %g s)", r ? r->peak_memory[0] : 0,
          r ? r->peak_memory[1] : 0, r ? r->compute_time[0] : 0, r ? r->compute_time[1] : 0);
    pdde_cost_result_free(r), pdde_cost_program_free(p), pdde_graph_free(g);
    /* tensor parallel: activations allreduced over the tp group in forward and backward (blocking) */
    r = simulate_plan(c, "tp=2", &sp, NULL, &g, &p);
    int sync = 0;
    for (int i = 0; r && i < pdde_cost_program_op_count(p, 1); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(p, 1, i);
        sync += o->kind == PDDE_COST_COLLECTIVE && !o->async && o->phase == PDDE_PHASE_FORWARD && o->coll == PDDE_COLL_ALLREDUCE;
    }
    /* one per block's attention and MLP, the vocab-parallel lookup, and the cross-entropy's two */
    CHECK(sync == 2 * small.layers + 3, "tp=2: %d blocking forward allreduces on rank 1, expected %d", sync, 2 * small.layers + 3);
    pdde_cost_result_free(r), pdde_cost_program_free(p), pdde_graph_free(g);
    /* two pipeline stages, 4 micro-batches: each send meets a receive on the other stage; both stages
     * idle in the fill and drain (the bubble), the first keeps more alive than the second */
    r = simulate_plan(c, "pp=2,mb=4", &sp, NULL, &g, &p);
    int sends[2] = {0, 0}, recvs[2] = {0, 0};
    for (int k = 0; r && k < 2; k++)
        for (int i = 0; i < pdde_cost_program_op_count(p, k); i++) {
            const pdde_cost_op *o = pdde_cost_program_op(p, k, i);
            sends[k] += o->kind == PDDE_COST_SEND && o->peer == 1 - k, recvs[k] += o->kind == PDDE_COST_RECV && o->peer == 1 - k;
        }
    CHECK(sends[0] == recvs[1] && sends[1] == recvs[0] && sends[0] >= 4 && sends[1] >= 4, "pp=2: sends %d/%d, receives %d/%d", sends[0],
          sends[1], recvs[0], recvs[1]);
    for (int k = 0; r && k < 2; k++)
        CHECK(r->idle[k] > 0.1 * r->compute_time[k], "pp=2 stage %d: idle %g s of a %g s step (compute %g s)", k, r->idle[k], r->step_time,
              r->compute_time[k]);
    if (r) pdde_cost_timeline_text(r, stdout, 60);
    pdde_cost_result_free(r), pdde_cost_program_free(p), pdde_graph_free(g);
    pdde_cluster_free(c);
}

/* The search's view of a cluster takes the measured allreduce where there is one: a ring allreduce on
 * its links, as the search times it, takes the measured time at the measured rank count. */
static void test_plan_devices_calibrated(void) {
    pdde_cluster *c = make_cluster(2, 4);
    pdde_plan_devices d;
    CHECK(pdde_plan_devices_init(ctx, c, 0, 0, 0, &d) == PDDE_OK && d.intra_bw == 1e9 && d.inter_bw == 1e8, "links without calibration: %g, %g",
          d.intra_bw, d.inter_bw);
    pdde_plan_devices_free(&d);
    pdde_cluster_add_calib(c, &(pdde_collective_calib){PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, 4, 1, 3e-5, 12e9});
    pdde_cluster_add_calib(c, &(pdde_collective_calib){PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, 2, 1, 1e-5, 9e9});   /* fewer ranks: not used */
    pdde_cluster_add_calib(c, &(pdde_collective_calib){PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, 8, 1, 1e-5, 1e9});   /* another algorithm */
    pdde_cluster_add_calib(c, &(pdde_collective_calib){PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, 8, 0, 2e-4, 2e9});
    CHECK(pdde_plan_devices_init(ctx, c, 0, 0, 0, &d) == PDDE_OK, "%s", pdde_last_error(ctx));
    const double B = 64e6;
    for (int intra = 0; intra <= 1; intra++) {
        int n = intra ? 4 : 8;
        double bw = intra ? d.intra_bw : d.inter_bw, lat = intra ? d.intra_lat : d.inter_lat;
        double ring = 2.0 * (n - 1) / n * B / bw + 2.0 * (n - 1) * lat, measured = intra ? 3e-5 + B / 12e9 : 2e-4 + B / 2e9;
        CHECK(test_close(ring, measured, 1e-12, 0), "%s: the search's ring allreduce of %g B on %d ranks %g s, measured %g s",
              intra ? "within a machine" : "across machines", B, n, ring, measured);
    }
    pdde_plan_devices_free(&d);
    pdde_cluster_free(c);
}

/* The search prices ZeRO-3's gathers as lowering runs them on the plan's devices (their backend,
 * pdde_plan_devices.backend from the cluster's specs): a dp 2 ZeRO-3 GPT on two devices hides all but
 * the first layer's gathers behind compute on "opencl" devices (lowering prefetches them: the step
 * shorter, the peak a layer's gathered parameters larger than with PDDE_ZERO3_PREFETCH=0), not on
 * "cpu" ones (the CPU ranks take all their machine's cores: nothing left to move the data meanwhile),
 * "cuda" or "level_zero" ones (their gathers stay blocking by default: the step and peak those of
 * PDDE_ZERO3_PREFETCH=0), and on all four with PDDE_ZERO3_PREFETCH=1. */
static void test_zero3_prefetch_by_backend(void) {
    static const char *const backends[] = {"cpu", "opencl", "cuda", "level_zero"};
    gpt_config cfg = {.vocab = 256, .ctx = 64, .layers = 4, .heads = 4, .width = 128, .batch = 8};
    gpt_plan one = {.dp = 1, .tp = 1, .pp = 1, .micro = 1};
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    gpt_model m;
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    CHECK(gpt_build_plan(g, &cfg, &one, &op, &m) == PDDE_OK, "%s", pdde_last_error(ctx));
    for (size_t b = 0; b < sizeof backends / sizeof backends[0]; b++) {
        pdde_cluster *c = make_cluster(1, 2);
        snprintf(c->specs[0].backend, sizeof c->specs[0].backend, "%s", backends[b]);
        c->specs[0].kind = b ? PDDE_DEVICE_GPU : PDDE_DEVICE_CPU;
        pdde_plan_devices d;
        pdde_status st = pdde_plan_devices_init(ctx, c, 0, 0, 0, &d);
        CHECK(st == PDDE_OK && d.backend && !strcmp(d.backend[1], backends[b]), "%s: %s", backends[b], pdde_last_error(ctx));
        double step[3] = {0}, peak[3] = {0}; /* PDDE_ZERO3_PREFETCH unset, 0, 1 */
        for (int v = 0; v < 3 && !st; v++) {
            if (v) setenv("PDDE_ZERO3_PREFETCH", v == 1 ? "0" : "1", 1);
            else unsetenv("PDDE_ZERO3_PREFETCH");
            pdde_plan_params pp = {.batch = cfg.batch};
            pdde_plan plan;
            memset(&plan, 0, sizeof plan);
            plan.dp = 2, plan.tp = 1, plan.pp = 1, plan.micro = 1, plan.chunks = 1, plan.zero = 3;
            st = pdde_plan_evaluate(g, &d, &pp, &plan);
            CHECK(st == PDDE_OK && !plan.why[0], "%s, PDDE_ZERO3_PREFETCH %d: %s %s", backends[b], v - 1, pdde_last_error(ctx), plan.why);
            step[v] = plan.step_s, peak[v] = plan.peak_bytes;
        }
        unsetenv("PDDE_ZERO3_PREFETCH");
        bool hides = b == 1;
        printf("ZeRO-3 on %-10s: step %.3f ms, peak %.2f MB (blocking gathers %.3f ms, %.2f MB; all prefetched %.3f ms, %.2f MB)\n",
               backends[b], step[0] * 1e3, peak[0] / 1e6, step[1] * 1e3, peak[1] / 1e6, step[2] * 1e3, peak[2] / 1e6);
        CHECK(hides ? step[0] < step[1] && peak[0] > peak[1] : step[0] == step[1] && peak[0] == peak[1],
              "%s: step %g s, peak %g B by default; %g s, %g B with PDDE_ZERO3_PREFETCH=0 (want %s)", backends[b], step[0], peak[0], step[1],
              peak[1], hides ? "shorter, larger: the gathers hidden" : "the same: the gathers blocking");
        CHECK((!hides || step[2] == step[0]) && step[2] < step[1] && peak[2] > peak[1],
              "%s with PDDE_ZERO3_PREFETCH=1: step %g s, peak %g B; %g s, %g B blocking (want hidden)", backends[b], step[2], peak[2], step[1], peak[1]);
        pdde_plan_devices_free(&d);
        pdde_cluster_free(c);
    }
    pdde_graph_free(g);
}

/* The planner search on an MoE GPT (64 experts of 1024 x 8192, 2 MoE blocks: 34 GB of expert
 * parameters, gradients and AdamW state) on one machine of 4 devices of 16 GiB: with a cluster it
 * tries the experts split over ep ranks (pdde_plan.ep, by pdde_moe_cost_estimate): the best plan
 * splits them, its time is the same plan's at ep 1 (pdde_plan_evaluate) plus the MoE model's
 * difference, and the text form carries ep; without a cluster no plan has ep. */
/* The simulation of an expert-parallel program (2 ranks, the experts over dp: buffers by expert):
 * every grouped GEMM is timed with its routed rows' FLOPs (2 x El x S k / E x K x M forward), and
 * each exchange is the counts (E integers) and the routed rows (the ids' count, 32 tokens x 2, x the
 * width, 32 or the expert's 128). */
static void test_moe_ep_simulated(void) {
    pdde_cluster *c = make_cluster(1, 2);
    gpt_config cfg = {.vocab = 256, .ctx = 16, .layers = 1, .heads = 2, .width = 32, .batch = 4, .moe_experts = 4, .moe_topk = 2, .moe_ep = 1};
    gpt_plan gp = {.dp = 2, .tp = 1, .pp = 1, .micro = 1};
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    gpt_model m;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    pdde_cost_plan cpl = {2, NULL, NULL, 0};
    pdde_cost_program *cp = NULL;
    CHECK(gpt_build_plan(g, &cfg, &gp, &op, &m) == PDDE_OK && pdde_cost_program_from_plan(c, g, &sp, &cpl, &cp) == PDDE_OK, "moe ep program: %s",
          pdde_last_error(ctx));
    int gemms = 0, timed = 0, counts = 0, rows = 0;
    double want = 2.0 * 2 * (64 * 2 / 4) * 32 * (4 * 32); /* the first GEMM: El 2 experts x S 64 tokens x k 2 / E 4 rows, 32 -> 4 x 32 */
    bool first_ok = false;
    for (int i = 0; cp && i < pdde_cost_program_op_count(cp, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(cp, 0, i);
        if (o->kind == PDDE_COST_COMPUTE && o->op_class == PDDE_OPCLASS_GEMM && strstr(o->name, "moe_grouped")) {
            gemms++, timed += o->flops > 0;
            if (gemms == 1) first_ok = test_close(o->flops, want, 1e-12, 0);
        }
        if (o->kind == PDDE_COST_COLLECTIVE && o->coll == PDDE_COLL_ALLTOALL) counts += o->dtype == PDDE_I32 && o->count == 4, rows += o->dtype == PDDE_F32 && (o->count == 32 * 2 * 32 || o->count == 32 * 2 * 128); /* (rows of C or F wide) */
    }
    CHECK(gemms >= 4 && timed == gemms && first_ok, "moe ep simulated: %d grouped GEMMs, %d with FLOPs (the first's right: %d)", gemms, timed, first_ok);
    CHECK(counts >= 4 && counts == rows, "moe ep simulated: %d count exchanges, %d of the routed rows (want >= 4, as many)", counts, rows);
    pdde_cost_program_free(cp);
    pdde_graph_free(g);
    pdde_cluster_free(c);
}

static void test_moe_plan_search(void) {
    pdde_cluster *c = make_cluster(1, 4);
    pdde_plan_devices d;
    CHECK(pdde_plan_devices_init(ctx, c, 0, 0, 0, &d) == PDDE_OK, "%s", pdde_last_error(ctx));
    gpt_config cfg = {.vocab = 256, .ctx = 128, .layers = 2, .heads = 8, .width = 1024, .batch = 16, .ffn = 8192, .moe_experts = 64, .moe_topk = 2};
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    gpt_model m;
    CHECK(gpt_build(g, &cfg, &m) == PDDE_OK, "gpt: %s", pdde_last_error(ctx));
    pdde_plan plans[16];
    int nf = 0, nr = 0;
    for (int with_cluster = 0; with_cluster <= 1; with_cluster++) {
        pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
        pp.batch = cfg.batch, pp.tp_divisor = cfg.heads, pp.no_pp = 1, pp.cluster = with_cluster ? c : NULL;
        pdde_status st = pdde_plan_search(g, &d, &pp, plans, 16, &nf, &nr);
        int with_ep = 0;
        for (int i = 0; i < nf; i++) with_ep += plans[i].ep > 1;
        if (!with_cluster) {
            CHECK(with_ep == 0, "without a cluster: %d plans with ep (status %d)", with_ep, st);
            continue;
        }
        CHECK(st == PDDE_OK && nf > 0 && plans[0].ep > 1, "with a cluster: %s; %d plans, the best's ep %d", st ? pdde_last_error(ctx) : "ok", nf,
              nf ? plans[0].ep : -1);
        if (st || nf == 0 || plans[0].ep < 2) break;
        pdde_plan best = plans[0], plain = best;
        char text[256];
        pdde_plan_str(&best, text, sizeof text);
        pdde_plan parsed;
        CHECK(strstr(text, ",ep=") && pdde_plan_parse(text, &parsed) == PDDE_OK && parsed.ep == best.ep, "plan text %s", text);
        /* the same plan at ep 1, evaluated, plus what the MoE model says ep changes */
        plain.ep = 0, plain.why[0] = 0;
        pdde_plan_params pp1 = pp;
        pp1.cluster = NULL;
        CHECK(pdde_plan_evaluate(g, &d, &pp1, &plain) == PDDE_OK, "ep 1 (%s): %s", text, pdde_last_error(ctx));
        pdde_moe_cost_params mp = PDDE_MOE_COST_PARAMS_INIT;
        mp.tokens = (int64_t)cfg.batch * cfg.ctx, mp.width = cfg.width, mp.ffn = cfg.ffn, mp.experts = cfg.moe_experts, mp.topk = 2, mp.layers = 2;
        mp.zero = best.zero, mp.grads_over_ep = best.tp == 1;
        int n = best.dp * best.tp, dev[4] = {0, 1, 2, 3};
        pdde_moe_cost one, ep;
        CHECK(pdde_moe_cost_estimate(ctx, c, dev, n, &mp, 1, &one) == PDDE_OK && pdde_moe_cost_estimate(ctx, c, dev, n, &mp, best.ep, &ep) == PDDE_OK,
              "%s", pdde_last_error(ctx));
        CHECK(test_close(best.step_s, plain.step_s + ep.step_s - one.step_s, 1e-9, 1e-12), "%s: %g s, ep 1's %g s + the MoE difference %g s", text,
              best.step_s, plain.step_s, ep.step_s - one.step_s);
        printf("moe plan search: %s, %.4g s a step (ep 1: %.4g s%s%s)\n", text, best.step_s, plain.step_s, plain.why[0] ? ", " : "", plain.why);
    }
    /* data parallel only (no tp): the experts over all 4 dp ranks or over groups of 2 (the tokens over
     * all 4 either way): both tried, each its ep 1 plan plus the MoE model's difference */
    pdde_plan_params pq = PDDE_PLAN_PARAMS_INIT;
    pq.batch = cfg.batch, pq.tp_divisor = cfg.heads, pq.no_pp = 1, pq.no_tp = 1, pq.cluster = c;
    int seen[5] = {0};
    CHECK(pdde_plan_search(g, &d, &pq, plans, 16, &nf, &nr) == PDDE_OK, "dp only: %s", pdde_last_error(ctx));
    for (int i = 0; i < nf; i++)
        if (plans[i].dp == 4 && plans[i].ep >= 0 && plans[i].ep <= 4) seen[plans[i].ep]++;
    pdde_plan bad;
    CHECK(pdde_plan_parse("dp=4,ep=3", &bad) != PDDE_OK && pdde_plan_parse("dp=2,tp=2,ep=4", &bad) != PDDE_OK && pdde_plan_parse("dp=4,ep=2", &bad) == PDDE_OK &&
              pdde_plan_parse("dp=4,tp=4,ep=2", &bad) == PDDE_OK && pdde_plan_parse("dp=2,tp=4,ep=2", &bad) != PDDE_OK,
          "plan text: ep must divide dp (below dp with tp) or be tp");
    CHECK(seen[2] > 0 && seen[4] > 0, "dp only: %d plans with the experts over groups of 2 of the 4 dp ranks, %d over all 4", seen[2], seen[4]);
    for (int i = 0; i < nf; i++) {
        if (plans[i].ep != 2) continue;
        char text[256];
        pdde_plan_str(&plans[i], text, sizeof text);
        pdde_plan parsed;
        CHECK(pdde_plan_parse(text, &parsed) == PDDE_OK && parsed.ep == 2 && parsed.dp == 4, "plan text %s", text);
        printf("moe plan search, dp only: %s, %.4g s a step\n", text, plans[i].step_s);
        break;
    }
    pdde_plan_devices_free(&d);
    pdde_cluster_free(c);
    /* 16 devices: the experts over groups of ep of the dp ranks with each expert over tp too (ep other
     * than tp) are tried, and their plan text reads back */
    c = make_cluster(1, 16);
    CHECK(pdde_plan_devices_init(ctx, c, 0, 0, 0, &d) == PDDE_OK, "%s", pdde_last_error(ctx));
    pdde_plan many[64];
    pq.no_tp = 0, pq.cluster = c;
    CHECK(pdde_plan_search(g, &d, &pq, many, 64, &nf, &nr) == PDDE_OK, "16 devices: %s", pdde_last_error(ctx));
    int tp_groups = 0;
    for (int i = 0; i < nf; i++) {
        if (!(many[i].tp > 1 && many[i].ep > 1 && many[i].ep != many[i].tp && many[i].ep < many[i].dp)) continue;
        char text[256];
        pdde_plan_str(&many[i], text, sizeof text);
        pdde_plan parsed;
        CHECK(pdde_plan_parse(text, &parsed) == PDDE_OK && parsed.ep == many[i].ep && parsed.tp == many[i].tp, "plan text %s", text);
        if (!tp_groups++) printf("moe plan search, 16 devices: %s, %.4g s a step (ep groups, each expert over tp)\n", text, many[i].step_s);
    }
    CHECK(tp_groups > 0, "16 devices: %d of %d plans with ep groups and tp", tp_groups, nf);
    pdde_plan_devices_free(&d);
    pdde_cluster_free(c);
    /* 8 devices, dp 4 x tp 2: ep 2 = tp both ways, the tp axis (ep=tp) and groups of 2 of the 4 dp
     * ranks (ep=dp:2, each expert's hidden units over tp), each priced as the MoE model prices it: the
     * groups as dp ranks 0, 2, 4, 6 (a rank of each tp group) with half the ffn, the tp axis as all 8 */
    c = make_cluster(1, 8);
    CHECK(pdde_plan_devices_init(ctx, c, 0, 0, 0, &d) == PDDE_OK, "%s", pdde_last_error(ctx));
    pq.cluster = c;
    CHECK(pdde_plan_search(g, &d, &pq, many, 64, &nf, &nr) == PDDE_OK, "8 devices: %s", pdde_last_error(ctx));
    int pairs = 0;
    for (int i = 0; i < nf; i++) {
        if (!(many[i].dp == 4 && many[i].tp == 2 && many[i].ep == 2 && many[i].ep_dp)) continue;
        char text[256], twin[256];
        pdde_plan_str(&many[i], text, sizeof text);
        pdde_plan parsed;
        CHECK(strstr(text, ",ep=dp:2") && pdde_plan_parse(text, &parsed) == PDDE_OK && parsed.ep_dp && parsed.ep == 2, "plan text %s", text);
        for (int j = 0; j < nf; j++) {
            if (!(many[j].ep == 2 && many[j].tp == 2 && !many[j].ep_dp)) continue;
            pdde_plan_str(&many[j], twin, sizeof twin);
            char *at = strstr(twin, ",ep=tp");
            if (!at || strncmp(text, twin, (size_t)(at - twin)) || strncmp(text + (at - twin), ",ep=dp:2", 8) || strcmp(at + 6, text + (at - twin) + 8))
                continue; /* (the same plan but for ep=tp) */
            pdde_moe_cost_params mp = PDDE_MOE_COST_PARAMS_INIT, mg;
            mp.tokens = (int64_t)cfg.batch * cfg.ctx, mp.width = cfg.width, mp.ffn = cfg.ffn, mp.experts = cfg.moe_experts, mp.topk = 2, mp.layers = 2;
            mp.zero = many[i].zero, mg = mp, mg.grads_over_ep = 1, mg.ffn = cfg.ffn / 2;
            int all[8] = {0, 1, 2, 3, 4, 5, 6, 7}, dps[4] = {0, 2, 4, 6};
            pdde_moe_cost a1, a2, g1, g2;
            pdde_moe_cost_params m1 = mp;
            m1.grads_over_ep = 1;
            CHECK(pdde_moe_cost_estimate(ctx, c, all, 8, &mp, 1, &a1) == PDDE_OK && pdde_moe_cost_estimate(ctx, c, all, 8, &mp, 2, &a2) == PDDE_OK &&
                      pdde_moe_cost_estimate(ctx, c, dps, 4, &m1, 1, &g1) == PDDE_OK && pdde_moe_cost_estimate(ctx, c, dps, 4, &mg, 2, &g2) == PDDE_OK,
                  "%s", pdde_last_error(ctx));
            double want = (g2.step_s - g1.step_s) - (a2.step_s - a1.step_s), got = many[i].step_s - many[j].step_s;
            CHECK(test_close(got, want, 1e-9, 1e-12), "%s against %s: %g s apart (want %g: the groups' MoE difference less the tp axis's)", text, twin,
                  got, want);
            if (!pairs++) printf("moe plan search, 8 devices: %s %.4g s, %s %.4g s\n", text, many[i].step_s, twin, many[j].step_s);
        }
    }
    CHECK(pairs > 0, "8 devices, dp 4 x tp 2: %d plans with the experts over groups of 2 dp ranks (ep=dp:2) beside their ep=tp twin", pairs);
    pdde_graph_free(g);
    pdde_plan_devices_free(&d);
    pdde_cluster_free(c);
}

/* The MoE token exchange priced as the communicator runs it across machines (2 machines of 4 devices:
 * 1e9 B/s and 1 us inside, NICs of 1e8 B/s and 10 us): at ep 8 with small messages (a pair's within
 * PDDE_COMM_A2A_HIER_BYTES(2, 4)) the communicator takes the hierarchical form and the model prices
 * it (PDDE_COMM_A2A_HIER unset equals =1): one NIC message a rank instead of 4, so less than half the
 * flat exchange's time (unset: plus the ranks' agreement on the choice); with large messages the
 * exchange runs flat (unset: within a millisecond of =0; its counts still go hierarchically), and the hierarchical form forced still sends every
 * byte that leaves a machine through its NIC: at least 4 ranks x half their bytes at 1e8 B/s an
 * exchange. ep 4 (one machine) is alike under every setting. */
static void test_moe_cost_hier(void) {
    pdde_cluster *c;
    pdde_cluster_init("hier", &c);
    pdde_device_spec s = {.kind = PDDE_DEVICE_GPU, .peak_flops = 2e12, .mem_bandwidth = 1e11};
    snprintf(s.name, sizeof s.name, "dev");
    s.n_gemm = 1, s.gemm[0] = (pdde_gemm_point){PDDE_F32, 1024, 1024, 1024, 1e12};
    pdde_cluster_add_spec(c, &s);
    for (int m = 0; m < 2; m++) {
        pdde_cluster_machine mm = {.id = m, .intra = {-1, -1, PDDE_LINK_NVLINK, 1e9, 1e-6, -1}, .nic = {-1, -1, PDDE_LINK_NET, 1e8, 1e-5, -1}};
        int mi = pdde_cluster_add_machine(c, &mm);
        for (int d = 0; d < 4; d++) pdde_cluster_add_device(c, mi, &(pdde_cluster_device){m * 4 + d, 0, 1ull << 34});
    }
    int dev[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    pdde_moe_cost_params p = PDDE_MOE_COST_PARAMS_INIT;
    p.width = 64, p.ffn = 256, p.experts = 8, p.topk = 2, p.layers = 2;
    static const char *modes[3] = {"0", NULL, "1"}; /* flat, unset, hierarchical */
    pdde_moe_cost r[2][3], in[3];
    for (int k = 0; k < 2; k++) {
        p.tokens = k ? 8 * 65536 : 8 * 4; /* a pair's message: 4 x 2 x 64 x 4 / 8 = 256 B; 64 Ki x that */
        for (int i = 0; i < 3; i++) {
            if (modes[i]) setenv("PDDE_COMM_A2A_HIER", modes[i], 1);
            else unsetenv("PDDE_COMM_A2A_HIER");
            CHECK(pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 8, &r[k][i]) == PDDE_OK && pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 4, &in[i]) == PDDE_OK,
                  "moe cost: %s", pdde_last_error(ctx));
        }
        CHECK(in[0].alltoall_s == in[1].alltoall_s && in[1].alltoall_s == in[2].alltoall_s && !in[2].alltoall_hier,
              "ep 4 inside a machine: %g %g %g s", in[0].alltoall_s, in[1].alltoall_s, in[2].alltoall_s);
    }
    unsetenv("PDDE_COMM_A2A_HIER");
    double small_pair = 4.0 * 2 * 64 * 4 / 8, D = 65536.0 * 2 * 64 * 4; /* a rank's bytes an exchange, large */
    CHECK(small_pair <= PDDE_COMM_A2A_HIER_BYTES(2, 4) && 65536 * small_pair > PDDE_COMM_A2A_HIER_BYTES(2, 4), "the sizes are not as meant");
    /* (unset: the alltoallv's agreement too, an allreduce of 8 bytes over 8 ranks: 3 steps of at most 20 us, 8 exchanges) */
    CHECK(!r[0][0].alltoall_hier && r[0][1].alltoall_hier && r[0][2].alltoall_hier && r[0][1].alltoall_s > r[0][2].alltoall_s &&
              r[0][1].alltoall_s < r[0][2].alltoall_s + 8 * 3 * 2e-5,
          "small messages: hierarchical %d %d %d, %g s unset, %g s forced", r[0][0].alltoall_hier, r[0][1].alltoall_hier, r[0][2].alltoall_hier,
          r[0][1].alltoall_s, r[0][2].alltoall_s);
    CHECK(r[0][1].alltoall_s < r[0][0].alltoall_s / 2, "small messages: hierarchical %g s, flat %g s", r[0][1].alltoall_s, r[0][0].alltoall_s);
    CHECK(!r[1][1].alltoall_hier && r[1][2].alltoall_hier && fabs(r[1][1].alltoall_s - r[1][0].alltoall_s) < 1e-3,
          "large messages: unset %g s (hierarchical %d), flat %g s", r[1][1].alltoall_s, r[1][1].alltoall_hier, r[1][0].alltoall_s);
    double nic = 4.0 * p.layers * 4 * D / 2 / 1e8;
    CHECK(r[1][2].alltoall_s >= nic, "large messages, hierarchical: %g s, below the NIC's %g s for the bytes leaving a machine", r[1][2].alltoall_s, nic);
    printf("moe exchange across 2 machines: small %.3g s flat, %.3g s hierarchical; large %.3g s flat, %.3g s hierarchical (NIC bound %.3g s)\n",
           r[0][0].alltoall_s, r[0][1].alltoall_s, r[1][0].alltoall_s, r[1][2].alltoall_s, nic);
    pdde_cluster_free(c);
}

/* The MoE cost model (pdde_moe_cost_estimate) on two machines of 4 devices (NVLink 1e9 B/s inside, NICs
 * 1e8 B/s): the exchange's bytes as tokens x k x width x dtype, 4 times a layer, (ep-1)/ep of them
 * leaving the rank; its time grows when the group crosses machines; the experts' memory halves with
 * twice the ep and ZeRO-1 splits their AdamW state over the replicas; a skewed router slows the
 * busiest rank by its share; few rows per expert run at the GEMM curve's lower rate; the choice of ep
 * follows memory and the links. And Mixtral-8x22B's shape on the 128-H100 cluster file: planned in
 * under a second. */
static void test_moe_cost(void) {
    pdde_cluster *c = make_cluster(2, 4);
    int dev[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    pdde_moe_cost_params p = PDDE_MOE_COST_PARAMS_INIT;
    p.tokens = 8192, p.width = 256, p.ffn = 1024, p.experts = 8, p.topk = 2, p.layers = 2;
    pdde_moe_cost m1, m2, m4, m8;
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 1, &m1) == PDDE_OK && pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 2, &m2) == PDDE_OK &&
          pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 4, &m4) == PDDE_OK && pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 8, &m8) == PDDE_OK,
          "moe cost: %s", pdde_last_error(ctx));
    /* 1024 tokens a rank x 2 x 256 x 4 B = 2 MiB an exchange, 8 exchanges, 3/4 leave the rank at ep 4 */
    CHECK(test_close(m4.alltoall_bytes, 8.0 * 1024 * 2 * 256 * 4 * 3 / 4, 1e-12, 0), "moe alltoall bytes %g", m4.alltoall_bytes);
    CHECK(m1.alltoall_bytes == 0 && m1.alltoall_s == 0 && m1.cross_host_share == 0, "ep 1 exchanges nothing");
    CHECK(m4.cross_host_share == 0 && test_close(m8.cross_host_share, 4.0 / 7, 1e-12, 0), "cross-host shares %g, %g", m4.cross_host_share, m8.cross_host_share);
    /* ep 8 crosses the 10x slower NICs for 4 of its 7 steps with 8/7 the bytes of ep 4 */
    CHECK(m8.alltoall_s > 3 * m4.alltoall_s, "moe alltoall across machines %g s vs inside one %g s", m8.alltoall_s, m4.alltoall_s);
    double params4 = 2.0 * 2 * 2 * 256 * 1024; /* 2 layers x 2 experts x 2 matrices */
    CHECK(test_close(m4.expert_param_bytes, 8 * params4, 1e-12, 0) && test_close(m4.expert_optimizer_bytes, 8 * params4, 1e-12, 0) &&
          test_close(m2.expert_param_bytes, 2 * m4.expert_param_bytes, 1e-12, 0), "moe memory %g, %g", m4.expert_param_bytes, m2.expert_param_bytes);
    p.zero = 1;
    pdde_moe_cost z;
    pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 4, &z);
    CHECK(test_close(z.expert_optimizer_bytes, m4.expert_optimizer_bytes / 2, 1e-12, 0) && z.expert_param_bytes == m4.expert_param_bytes,
          "moe ZeRO-1: AdamW state over the 2 replicas: %g", z.expert_optimizer_bytes);
    p.zero = 0;
    /* routing skew: every token to expert 0 makes the rank holding it do ep x the mean */
    int32_t counts[8] = {100, 0, 0, 0, 0, 0, 0, 0};
    p.counts = counts;
    pdde_moe_cost s8, s2;
    pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 8, &s8), pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 2, &s2);
    CHECK(s8.imbalance == 8 && s2.imbalance == 2, "moe imbalance from counts: %g (ep 8), %g (ep 2)", s8.imbalance, s2.imbalance);
    /* (8 x the rows; the curve's rate at the larger shape moves it by less than a quarter) */
    CHECK(s8.expert_gemm_s > 6 * m8.expert_gemm_s && s8.expert_gemm_s < 10 * m8.expert_gemm_s, "moe skewed GEMMs %g s vs even %g s",
          s8.expert_gemm_s, m8.expert_gemm_s);
    p.counts = NULL, p.skew = 3;
    pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 4, &s2);
    CHECK(test_close(s2.imbalance, (3 + 5.0 / 7) / 2, 1e-12, 0), "moe stated skew 3 over pairs of experts: %g", s2.imbalance);
    p.skew = 0;
    /* 256 rows an expert at ep 1, all 2048 of the rank at once in the dense shape: a lower rate */
    CHECK(m1.gemm_efficiency < 1 && m1.gemm_efficiency > 0.5 && m8.gemm_efficiency == 1, "moe grouped GEMM efficiency %g (ep 1), %g (ep 8)",
          m1.gemm_efficiency, m8.gemm_efficiency);
    /* the choice: the fastest that fits; a budget only ep 8 meets forces it */
    pdde_moe_cost best, all[8];
    int n_all = 0;
    CHECK(pdde_moe_choose_ep(ctx, c, dev, 8, &p, &best, all, 8, &n_all) == PDDE_OK && n_all == 4, "moe choose ep: %s", pdde_last_error(ctx));
    int fastest = 1;
    for (int i = 0; i < n_all; i++) fastest &= best.step_s <= all[i].step_s;
    CHECK(fastest, "moe choose ep %d (%g s): not the fastest", best.ep, best.step_s);
    p.memory_budget = 1.01 * (m8.expert_param_bytes + m8.expert_optimizer_bytes);
    CHECK(pdde_moe_choose_ep(ctx, c, dev, 8, &p, &best, NULL, 0, NULL) == PDDE_OK && best.ep == 8, "moe choose ep under a tight budget: %d", best.ep);
    p.memory_budget = 0.5 * (m8.expert_param_bytes + m8.expert_optimizer_bytes);
    CHECK(pdde_moe_choose_ep(ctx, c, dev, 8, &p, &best, NULL, 0, NULL) == PDDE_ERR_NO_PLAN && strstr(pdde_last_error(ctx), "GB"),
          "moe choose ep when nothing fits: %s", pdde_last_error(ctx));
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 3, &best) == PDDE_ERR_INVALID_ARG, "ep 3 of 8 ranks must be refused");
    pdde_cluster_free(c);

    /* a graph's grouped GEMM is a GEMM of its FLOPs, rated at the rows an expert gets: 512 rows over 8
     * experts, [64] x [64, 256] each; its weight gradient [8, 64, 256] over the same rows */
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *rows = pdde_param(g, "x", 2, (int64_t[]){512, 64}, 0.1f), *chosen = pdde_input(g, "ids", PDDE_I32, 2, (int64_t[]){256, 2});
    pdde_tensor *y = pdde_moe_grouped_matmul(g, rows, pdde_param(g, "w", 3, (int64_t[]){8, 64, 256}, 0.1f), chosen, 0, 0);
    pdde_backward(g, pdde_sum(g, y, -1, 0));
    pdde_cost_program *prog = NULL;
    CHECK(pdde_cost_program_from_graph(g, 0, &prog) == PDDE_OK, "moe graph: %s", pdde_last_error(ctx));
    int fwd = 0, back_w = 0;
    for (int i = 0; prog && i < pdde_cost_program_op_count(prog, 0); i++) {
        const pdde_cost_op *o = pdde_cost_program_op(prog, 0, i);
        if (!strcmp(o->name, "moe_grouped_matmul F"))
            fwd = o->op_class == PDDE_OPCLASS_GEMM && o->m == 64 && o->n == 256 && o->k == 64 && o->flops == 2.0 * 512 * 64 * 256 && o->gemms == 8;
        if (!strncmp(o->name, "moe_grouped_matmul_b", 20)) /* (names are cut at 20 characters) */
            back_w = o->op_class == PDDE_OPCLASS_GEMM && o->m == 64 && o->n == 256 && o->k == 64 && o->flops == 2.0 * 512 * 64 * 256;
    }
    CHECK(fwd && back_w, "moe grouped GEMM and its weight gradient as GEMMs of 8 x 64 rows: %d, %d", fwd, back_w);
    pdde_cost_program_free(prog);
    pdde_graph_free(g);

    /* gpt's choice (gpt_moe_choose_ep, from a cluster file): on 2 machines of one device each, NICs of
     * 1e8 B/s, small experts (ffn 64): the exchange (16 MB a step) costs more than the experts'
     * gradient reduction it halves (2 MB): data parallel; with 32 experts of ffn 4096 (10 GB
     * of experts with their AdamW state) on devices of 8 GB only expert parallelism fits */
    if (pdde_features() & PDDE_FEATURE_CJSON) {
        char cpath[64];
        snprintf(cpath, sizeof cpath, "/tmp/pdde_test_cost_moe.%d.json", (int)getpid());
        pdde_cluster *two = make_cluster(2, 1);
        two->machines[0].devices[0].memory = two->machines[1].devices[0].memory = 8000000000ull;
        CHECK(pdde_cluster_save(ctx, two, cpath) == PDDE_OK, "save: %s", pdde_last_error(ctx));
        gpt_config gc = {.vocab = 256, .ctx = 64, .layers = 2, .heads = 4, .width = 256, .batch = 8, .ffn = 64, .moe_experts = 8, .moe_topk = 2};
        int ep = 0;
        double pred[2];
        CHECK(gpt_moe_choose_ep(ctx, cpath, &gc, 2, 0, &ep, pred) == PDDE_OK && ep == 1 && pred[1] == pred[0],
              "gpt_moe_choose_ep over slow NICs: ep %d (%g s vs %g s at ep 1): %s", ep, pred[1], pred[0], pdde_last_error(ctx));
        /* (32 x 2 x 256 x 4096 x 10 = 671M parameters, 16 B each; 128K tokens: the exchange of their routed
         * rows the slower) */
        gc.moe_experts = 32, gc.ffn = 4096, gc.layers = 10, gc.batch = 256, gc.ctx = 512;
        CHECK(gpt_moe_choose_ep(ctx, cpath, &gc, 2, 0, &ep, pred) == PDDE_OK && ep == 2 && pred[1] > pred[0],
              "gpt_moe_choose_ep when only ep 2 fits: ep %d (%g s vs %g s at ep 1)", ep, pred[1], pred[0]);
        remove(cpath);
        pdde_cluster_free(two);
    }

    /* Mixtral-8x22B's shape (56 layers of 8 experts, width 6144, ffn 16384, top-2), a 4M-token batch in
     * bf16 on 128 H100s, ZeRO-3: the MoE model alone, then the planner's search over the whole GPT of
     * that shape (as bench_planner --moe): it ends with a plan that fits a device, ep 2, 4 and 8 tried
     * (each dividing the experts and the dp ranks) */
    pdde_cluster *h = NULL;
    if (!(pdde_features() & PDDE_FEATURE_CJSON)) { test_skip("cjson", "no cluster files in this build"); return; }
    const char *h100 = "tools/clusters/h100_128.json";
    CHECK(pdde_cluster_load(ctx, h100, &h) == PDDE_OK, "h100_128.json: %s", pdde_last_error(ctx));
    if (!h) return;
    int ids[128], n = 0;
    for (int mi = 0; mi < h->n_machines; mi++)
        for (int d = 0; d < h->machines[mi].n_devices && n < 128; d++) ids[n++] = h->machines[mi].devices[d].id;
    pdde_moe_cost_params x = PDDE_MOE_COST_PARAMS_INIT;
    x.tokens = 1024 * 4096, x.width = 6144, x.ffn = 16384, x.experts = 8, x.topk = 2, x.layers = 56;
    x.dtype = x.compute_dtype = PDDE_BF16, x.zero = 3, x.grads_over_ep = 1;
    pdde_status st = pdde_moe_choose_ep(ctx, h, ids, n, &x, &best, all, 8, &n_all);
    CHECK(n == 128 && st == PDDE_OK && best.fits && n_all == 4 && x.experts % best.ep == 0, "Mixtral-8x22B on %d H100s: %s, ep %d of %d tried", n,
          st ? pdde_last_error(ctx) : "ok", best.ep, n_all);
    printf("moe cost: Mixtral-8x22B shape on 128 H100s: ep %d (alltoall %.3f s, experts %.3f s, their gradients %.3f s a step; %.1f GB a rank)\n",
           best.ep, best.alltoall_s, best.expert_gemm_s, best.dp_sync_s, (best.expert_param_bytes + best.expert_optimizer_bytes) / 1e9);
    for (int i = 0; i < n_all; i++) printf("  ep %d: %.3f s\n", all[i].ep, all[i].step_s);
    /* the search over the whole GPT: Mixtral's 56 layers fit only under ZeRO-3, 4 layers of that shape and
     * a sequence a rank under ZeRO-1/2 too; ep 2, 4 and 8 (groups of the dp ranks) must be kept in both (among the 64
     * best: ep 1 is the cheapest there, by 3-4 s a step) */
    for (int layers = 56; layers >= 4; layers -= 52) {
        gpt_config mx = {.vocab = 32000, .ctx = 4096, .layers = layers, .heads = 48, .width = 6144, .batch = layers == 56 ? 1024 : 128, .ffn = 16384, .moe_experts = 8, .moe_topk = 2};
        pdde_plan_devices hd;
        pdde_plan plans[64];
        int nf = 0, nr = 0, tried[9] = {0}, bad_ep = 0;
        st = gpt_plan_devices(ctx, h100, &mx, 0, &hd);
        if (!st) {
            st = gpt_plan_search_cluster(ctx, &mx, &hd, 1, h, 0, plans, 64, &nf, &nr);
            for (int i = 0; !st && i < nf; i++) {
                int e = plans[i].ep > 1 ? plans[i].ep : 1;
                bad_ep += mx.moe_experts % e || plans[i].dp % e || plans[i].peak_bytes > hd.memory[0] || (i && plans[i].step_s < plans[0].step_s);
                if (e <= 8) tried[e]++;
            }
            pdde_plan_devices_free(&hd);
        }
        char text[256] = "";
        if (nf) pdde_plan_str(&plans[0], text, sizeof text);
        CHECK(st == PDDE_OK && nf > 0 && bad_ep == 0 && tried[2] && tried[4] && tried[8],
              "Mixtral-8x22B's shape, %d layers, planned on %s: %s; %d plans, best %s, %d with a bad ep, memory or order, ep 2/4/8 kept %d/%d/%d",
              layers, h100, st ? pdde_last_error(ctx) : "ok", nf, text, bad_ep, tried[2], tried[4], tried[8]);
        printf("moe plan search: Mixtral-8x22B shape, %d layers, on 128 H100s: %s, %.4g s a step, %.1f GB\n", layers, text, nf ? plans[0].step_s : 0,
               nf ? plans[0].peak_bytes / 1e9 : 0);
    }
    pdde_cluster_free(h);
}


/* The MoE model's ZeRO-3 gathers of the experts (over their dp replicas, each layer's for its forward
 * and again for its backward) as lowering runs them: prefetched a layer ahead on "opencl" devices, so
 * only the first layer's of each pass waits where the layer before computes longer than a gather, and
 * what outlasts that compute where it does not; blocking (every gather whole) with
 * PDDE_ZERO3_PREFETCH=0, where there is no compute to hide behind, and by default on "cpu" (or no
 * backend: the CPU ranks take all their machine's cores) and "cuda" devices, which
 * PDDE_ZERO3_PREFETCH=1 prefetches. One machine of 8 (NVLink 1e9 B/s), ep 4, 2 replicas: a layer's
 * experts are 4 MiB of f32, a gather 2 MiB of them from the peer (about 2 ms); a layer's forward 2
 * GEMMs of 1 GFLOP (about 2 ms at 1e12 FLOP/s). The prefetched layer's experts are held ahead: one
 * layer's more memory. */
static void moe_estimate_as(pdde_cluster *c, const int *dev, const pdde_moe_cost_params *p, const char *backend, const char *prefetch,
                            pdde_moe_cost *out) {
    snprintf(c->specs[0].backend, sizeof c->specs[0].backend, "%s", backend);
    if (prefetch) setenv("PDDE_ZERO3_PREFETCH", prefetch, 1);
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 8, p, 4, out) == PDDE_OK, "%s: %s", backend, pdde_last_error(ctx));
    unsetenv("PDDE_ZERO3_PREFETCH");
}

static void test_moe_cost_zero3_prefetch(void) {
    pdde_cluster *c = make_cluster(1, 8);
    int dev[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    pdde_moe_cost_params p = PDDE_MOE_COST_PARAMS_INIT;
    p.tokens = 8192, p.width = 256, p.ffn = 1024, p.experts = 8, p.topk = 2, p.layers = 4, p.grads_over_ep = 1, p.zero = 2;
    const double L = p.layers, layer_bytes = 4.0 * 2 * 2 * 256 * 1024; /* a rank's 2 experts of a layer, 2 matrices, f32 */
    pdde_moe_cost z2, hidden, blocking, slow_hidden, slow_blocking, none_hidden, none_blocking;
    moe_estimate_as(c, dev, &p, "opencl", NULL, &z2);
    p.zero = 3;
    moe_estimate_as(c, dev, &p, "opencl", NULL, &hidden);
    moe_estimate_as(c, dev, &p, "opencl", "0", &blocking);
    /* blocking: 2 gathers a layer on top of ZeRO-2's reduce-scatter; one gather's time from them */
    double g = (blocking.dp_sync_s - z2.dp_sync_s) / (2 * L), fwd = (hidden.expert_gemm_s + hidden.expert_buffer_s) / L / 3;
    CHECK(g > 1e-3 && g < fwd, "a layer's gather %g s, its forward's expert compute %g s (want a gather shorter, the test's premise)", g, fwd);
    CHECK(hidden.step_s < blocking.step_s && test_close(hidden.dp_sync_s, z2.dp_sync_s + 2 * g, 1e-9, 0),
          "ZeRO-3 prefetched, compute longer than a gather: step %g s (blocking %g s), gradients and gathers %g s (want ZeRO-2's %g s + the "
          "first layer's 2 gathers %g s)",
          hidden.step_s, blocking.step_s, hidden.dp_sync_s, z2.dp_sync_s, 2 * g);
    CHECK(test_close(hidden.expert_param_bytes, blocking.expert_param_bytes + layer_bytes, 1e-12, 0) &&
              test_close(blocking.expert_param_bytes, z2.expert_param_bytes - L * layer_bytes / 2 + layer_bytes, 1e-12, 0),
          "ZeRO-3's gathered experts: %g B prefetched, %g B blocking, ZeRO-2 %g B (want a layer's %g B held, one more ahead; ZeRO-3 halves the rest)",
          hidden.expert_param_bytes, blocking.expert_param_bytes, z2.expert_param_bytes, layer_bytes);
    /* "cpu", no backend and "cuda" keep the gathers blocking unless PDDE_ZERO3_PREFETCH=1 */
    static const char *const blocking_backends[] = {"cpu", "", "cuda"};
    for (int b = 0; b < 3; b++) {
        pdde_moe_cost by_default, forced;
        moe_estimate_as(c, dev, &p, blocking_backends[b], NULL, &by_default);
        moe_estimate_as(c, dev, &p, blocking_backends[b], "1", &forced);
        CHECK(by_default.step_s == blocking.step_s && forced.step_s == hidden.step_s && by_default.expert_param_bytes == blocking.expert_param_bytes,
              "on \"%s\": %g s (want blocking %g s); with PDDE_ZERO3_PREFETCH=1 %g s (want %g s)", blocking_backends[b], by_default.step_s,
              blocking.step_s, forced.step_s, hidden.step_s);
    }
    /* a 20x slower link: each gather outlasts the layer before it; what shows is that excess */
    c->machines[0].intra.bandwidth = 5e7;
    moe_estimate_as(c, dev, &p, "opencl", NULL, &slow_hidden);
    moe_estimate_as(c, dev, &p, "opencl", "0", &slow_blocking);
    double layer = (slow_hidden.expert_gemm_s + slow_hidden.expert_buffer_s) / L, gs = (slow_blocking.dp_sync_s - slow_hidden.dp_sync_s) / (L - 1);
    CHECK(slow_hidden.step_s < slow_blocking.step_s && test_close(gs, layer, 1e-9, 0),
          "gathers longer than the compute: %g s prefetched, %g s blocking (want a layer's expert compute %g s hidden a layer but the first)",
          slow_hidden.step_s, slow_blocking.step_s, layer);
    /* no compute to hide behind (GEMMs and buffer passes at no time): the same as blocking */
    c->specs[0].gemm[0].flops = c->specs[0].gemm[1].flops = c->specs[0].mem_bandwidth = 1e30;
    c->specs[0].curve[PDDE_OPCLASS_ELEMENTWISE][0].seconds = c->specs[0].curve[PDDE_OPCLASS_ELEMENTWISE][1].seconds = 1e-30;
    moe_estimate_as(c, dev, &p, "opencl", NULL, &none_hidden);
    moe_estimate_as(c, dev, &p, "opencl", "0", &none_blocking);
    CHECK(none_hidden.expert_gemm_s + none_hidden.expert_buffer_s < 1e-9 * none_hidden.dp_sync_s &&
              test_close(none_hidden.dp_sync_s, none_blocking.dp_sync_s, 1e-9, 0),
          "no compute (%g s): gathers %g s prefetched, %g s blocking (want the same)", none_hidden.expert_gemm_s + none_hidden.expert_buffer_s,
          none_hidden.dp_sync_s, none_blocking.dp_sync_s);
    printf("moe ZeRO-3 gathers, ep 4 of 8: %.3f ms a step prefetched, %.3f ms blocking; over a 20x slower link %.3f ms, %.3f ms\n",
           hidden.step_s * 1e3, blocking.step_s * 1e3, slow_hidden.step_s * 1e3, slow_blocking.step_s * 1e3);
    pdde_cluster_free(c);
}

/* The choice of ep among all that divide the ranks and the experts, on two machines of 4 devices whose
 * NICs are 10x slower than their NVLink: experts of 33.6 MB a rank at ep 4 (parameters, gradients,
 * AdamW state), a budget of 1.5 x that: ep 1 and 2 do not fit, ep 8 fits but exchanges half its bytes
 * over the NICs; ep 4 (groups inside a machine) it is, from pdde_moe_choose_ep and from gpt's
 * gpt_moe_choose_ep on the cluster file (with the bias too, which groups take). Where the ranks'
 * placement puts the groups: 4 replicas' gradient allreduces cross the same NIC at once; a group
 * straddling two machines pays the NIC though rank 0's does not; CPU ranks beyond the cores share
 * them. */
static void test_moe_choose_ep_placement(void) {
    pdde_cluster *c = make_cluster(2, 4);
    int dev[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    pdde_moe_cost_params p = PDDE_MOE_COST_PARAMS_INIT;
    p.tokens = 8192, p.width = 256, p.ffn = 1024, p.experts = 8, p.topk = 2, p.layers = 2, p.grads_over_ep = 1;
    double at4 = 16.0 * 2 * 2 * 2 * 256 * 1024; /* 2 layers x 2 experts x 2 matrices, 16 B a parameter */
    p.memory_budget = 1.5 * at4;
    pdde_moe_cost best, all[8];
    int n_all = 0;
    CHECK(pdde_moe_choose_ep(ctx, c, dev, 8, &p, &best, all, 8, &n_all) == PDDE_OK && n_all == 4, "moe choose ep: %s", pdde_last_error(ctx));
    CHECK(best.ep == 4 && best.fits && !all[0].fits && !all[1].fits && all[3].fits && all[3].step_s > best.step_s && all[3].cross_host_share > 0 &&
              best.cross_host_share == 0,
          "moe choose ep %d (want 4: ep 1, 2 too big, ep 8 %.4g s over the NICs against %.4g s)", best.ep, all[3].step_s, all[2].step_s);
    /* 4 replica pairs {r, r+4} at once: 8 MiB of f32 gradients each, 2 (2-1)/2 of it out of a machine */
    p.grads_over_ep = 0, p.memory_budget = 0;
    pdde_moe_cost m4;
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 8, &p, 4, &m4) == PDDE_OK && test_close(m4.dp_sync_s, 4 * 8388608.0 / 1e8, 1e-9, 0),
          "moe gradients of 4 groups through one NIC: %g s (want %g)", m4.dp_sync_s, 4 * 8388608.0 / 1e8);
    if (pdde_features() & PDDE_FEATURE_CJSON) {
        char cpath[64];
        snprintf(cpath, sizeof cpath, "/tmp/pdde_test_cost_moe8.%d.json", (int)getpid());
        for (int m = 0; m < 2; m++)
            for (int d = 0; d < 4; d++) c->machines[m].devices[d].memory = (uint64_t)(1.5 * at4);
        CHECK(pdde_cluster_save(ctx, c, cpath) == PDDE_OK, "save: %s", pdde_last_error(ctx));
        gpt_config gc = {.vocab = 256, .ctx = 128, .layers = 2, .heads = 4, .width = 256, .batch = 64, .ffn = 1024, .moe_experts = 8, .moe_topk = 2};
        int ep = 0;
        double pred[2];
        CHECK(gpt_moe_choose_ep(ctx, cpath, &gc, 8, 0, &ep, pred) == PDDE_OK && ep == 4 && test_close(pred[1], best.step_s, 1e-9, 0),
              "gpt_moe_choose_ep on 2 x 4: ep %d (%g s; want 4, %g s): %s", ep, pred[1], best.step_s, pdde_last_error(ctx));
        gc.moe_bias = 1;
        CHECK(gpt_moe_choose_ep(ctx, cpath, &gc, 8, 0, &ep, pred) == PDDE_OK && ep == 4, "gpt_moe_choose_ep with the bias: ep %d (want 4)", ep);
        remove(cpath);
    }
    pdde_cluster_free(c);

    /* 2 machines of 3: ep 2 groups {0,1} {2,3} {4,5}; {2,3} straddles the NIC */
    pdde_cluster *odd = make_cluster(2, 3), *one = make_cluster(1, 6);
    pdde_moe_cost straddle, inside;
    CHECK(pdde_moe_cost_estimate(ctx, odd, dev, 6, &p, 2, &straddle) == PDDE_OK && pdde_moe_cost_estimate(ctx, one, dev, 6, &p, 2, &inside) == PDDE_OK,
          "%s", pdde_last_error(ctx));
    CHECK(straddle.cross_host_share == 1 && inside.cross_host_share == 0 && straddle.alltoall_s > 3 * inside.alltoall_s,
          "moe ep 2 across a machine boundary: share %g, %g s against %g s inside one", straddle.cross_host_share, straddle.alltoall_s, inside.alltoall_s);
    pdde_cluster_free(odd);
    /* 4 CPU ranks on 2 cores: each GEMM at half its speed */
    one->specs[0].kind = PDDE_DEVICE_CPU;
    pdde_moe_cost own, shared;
    pdde_moe_cost_estimate(ctx, one, dev, 4, &p, 2, &own);
    one->machines[0].cores = 2;
    pdde_moe_cost_estimate(ctx, one, dev, 4, &p, 2, &shared);
    CHECK(own.expert_gemm_s > 0 && test_close(shared.expert_gemm_s, 2 * own.expert_gemm_s, 1e-9, 0), "moe 4 CPU ranks on 2 cores: %g s, alone %g s",
          shared.expert_gemm_s, own.expert_gemm_s);
    /* their collectives too (the exchange, the experts' gradients over dp): the copies are the ranks'
     * work, calibrated with a core a rank; no contention figure here, so the exchange's host copies
     * halve alike: every part of the exchange and the gradients' reduction at twice the time */
    CHECK(own.alltoall_s > 0 && own.dp_sync_s > 0 && test_close(shared.alltoall_s, 2 * own.alltoall_s, 1e-9, 0) &&
              test_close(shared.dp_sync_s, 2 * own.dp_sync_s, 1e-9, 0),
          "moe 4 CPU ranks on 2 cores: exchange %g s (alone %g s), gradients %g s (alone %g s): want twice", shared.alltoall_s, own.alltoall_s,
          shared.dp_sync_s, own.dp_sync_s);
    /* a skewed router (the busiest of 4 ranks 1.43 x the mean at skew 2, ep 4): alone, the busiest
     * rank's GEMMs pace the step; sharing 2 cores, the others wait at the exchange and hand their
     * cores over, so the machine's work (every rank's GEMMs at half speed, 2 x the mean) paces it and
     * the skew costs nothing (a GEMM rate flat in the rows: time proportional to the rows) */
    one->specs[0].gemm[1].flops = one->specs[0].gemm[0].flops;
    pdde_moe_cost even_alone, skew_alone, even_shared, skew_shared;
    pdde_moe_cost_params ps = p;
    ps.skew = 2;
    one->machines[0].cores = 0;
    pdde_moe_cost_estimate(ctx, one, dev, 4, &p, 4, &even_alone), pdde_moe_cost_estimate(ctx, one, dev, 4, &ps, 4, &skew_alone);
    one->machines[0].cores = 2;
    pdde_moe_cost_estimate(ctx, one, dev, 4, &p, 4, &even_shared), pdde_moe_cost_estimate(ctx, one, dev, 4, &ps, 4, &skew_shared);
    CHECK(test_close(skew_alone.expert_gemm_s, skew_alone.imbalance * even_alone.expert_gemm_s, 1e-9, 0) && skew_alone.imbalance > 1.4 &&
              test_close(even_shared.expert_gemm_s, 2 * even_alone.expert_gemm_s, 1e-9, 0) &&
              test_close(skew_shared.expert_gemm_s, even_shared.expert_gemm_s, 1e-9, 0),
          "moe skew %g (imbalance %g) on 4 ranks: GEMMs alone %g s (even %g s); on 2 cores %g s (even %g s: want the same)", ps.skew,
          skew_alone.imbalance, skew_alone.expert_gemm_s, even_alone.expert_gemm_s, skew_shared.expert_gemm_s, even_shared.expert_gemm_s);
    pdde_cluster_free(one);
}

/* The ep pick on a 2-core machine (tests/data/moe_cpu_2core_cluster.json: pdde-bench --quick of this
 * kind of machine, a thread a rank, with collectives; the other ranks copies of its CPU device, as
 * bench_moe places them) for bench_moe's MoE GPT (8 experts, top-2, 2 layers of width 128 and ffn 512,
 * 512 tokens a step). Measured there (gpt under pdde-run, medians of 5 alternating rounds, load
 * 0.4-3.7): 2 ranks ep 1 24.2 ms a step, ep 2 29.8; 4 ranks ep 1 34.3, ep 2 (groups of 2) 41.1, ep 4
 * 35.1. The model picks ep 1 on both and ranks ep 2 last on 4 ranks; on 4 cores the 4 ranks would
 * not share them: their exchange and gradients take less. */
static void test_moe_pick_shared_cores(void) {
    pdde_cluster *c = NULL;
    CHECK(pdde_cluster_load(ctx, "tests/data/moe_cpu_2core_cluster.json", &c) == PDDE_OK && c->n_machines == 1 && c->machines[0].cores == 2,
          "the 2-core cluster file: %s", pdde_last_error(ctx));
    if (!c || c->n_machines != 1) { pdde_cluster_free(c); return; }
    pdde_cluster_device d0 = c->machines[0].devices[0];
    int dev[4] = {d0.id, d0.id + 1000, d0.id + 2000, d0.id + 3000};
    for (int k = 1; k < 4; k++) {
        pdde_cluster_device dk = d0;
        dk.id = dev[k];
        pdde_cluster_add_device(c, 0, &dk);
    }
    pdde_moe_cost_params p = PDDE_MOE_COST_PARAMS_INIT;
    p.tokens = 8 * 64, p.width = 128, p.ffn = 512, p.experts = 8, p.topk = 2, p.layers = 2, p.grads_over_ep = 1;
    pdde_moe_cost best2, best4, all[4];
    int n_all = 0;
    CHECK(pdde_moe_choose_ep(ctx, c, dev, 2, &p, &best2, NULL, 0, NULL) == PDDE_OK && best2.ep == 1, "2 ranks on 2 cores: ep %d (want 1)", best2.ep);
    CHECK(pdde_moe_choose_ep(ctx, c, dev, 4, &p, &best4, all, 4, &n_all) == PDDE_OK && n_all == 3 && best4.ep == 1 && all[1].ep == 2 &&
              all[1].step_s > all[2].step_s,
          "4 ranks on 2 cores: ep %d (want 1), ep 2 %.4g ms, ep 4 %.4g ms (want ep 2 the slowest)", best4.ep, n_all > 1 ? all[1].step_s * 1e3 : 0,
          n_all > 2 ? all[2].step_s * 1e3 : 0);
    c->machines[0].cores = 4;
    pdde_moe_cost own;
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 4, &p, 4, &own) == PDDE_OK && own.alltoall_s < all[2].alltoall_s && own.dp_sync_s < all[2].dp_sync_s,
          "4 ranks on 4 cores, ep 4: exchange %g s, gradients %g s (on 2 cores %g s, %g s)", own.alltoall_s, own.dp_sync_s, all[2].alltoall_s,
          all[2].dp_sync_s);
    pdde_cluster_free(c);
}

/* The step simulation charges collectives of CPU ranks beyond their machine's cores at cores / ranks of
 * their calibrated rate, as the MoE model does (the 2-core cluster file; 4 ranks on copies of its CPU
 * device): an alltoall over the 4 and an allreduce within pairs take (their times) x ranks / cores,
 * the slowdown the MoE model gives the experts' gradients there; 2 ranks on the 2 cores and GPU ranks
 * (their own cores) at the calibrated times. */
static double sim_collectives(const pdde_cluster *c, const int *dev, int n, int64_t count) {
    pdde_cost_program *p = NULL;
    pdde_cost_program_init(n, &p);
    int all = pdde_cost_program_group(p, n, (int[]){0, 1, 2, 3}), pair[2];
    pair[0] = pdde_cost_program_group(p, 2, (int[]){0, 1});
    pair[1] = n > 2 ? pdde_cost_program_group(p, 2, (int[]){2, 3}) : pair[0];
    for (int r = 0; r < n; r++) {
        pdde_cost_program_set_rank(p, r, dev[r], 0);
        pdde_cost_op a2a = {.kind = PDDE_COST_COLLECTIVE, .coll = PDDE_COLL_ALLTOALL, .algo = PDDE_ALGO_AUTO, .group = all, .count = count,
                            .dtype = PDDE_F32, .last_use = -1},
                     ar = a2a;
        ar.coll = PDDE_COLL_ALLREDUCE, ar.group = pair[r / 2], ar.count = count / 4;
        pdde_cost_program_add(p, r, &a2a), pdde_cost_program_add(p, r, &ar);
    }
    pdde_cost_result *res = NULL;
    CHECK(pdde_cost_simulate(ctx, c, p, &res) == PDDE_OK, "collectives on %d ranks: %s", n, pdde_last_error(ctx));
    double t = res ? res->step_time : NAN;
    pdde_cost_result_free(res);
    pdde_cost_program_free(p);
    return t;
}

static void test_simulate_shared_collectives(void) {
    pdde_cluster *c = NULL;
    CHECK(pdde_cluster_load(ctx, "tests/data/moe_cpu_2core_cluster.json", &c) == PDDE_OK && c->n_machines == 1 && c->machines[0].cores > 0,
          "the 2-core cluster file: %s", pdde_last_error(ctx));
    if (!c || c->n_machines != 1 || c->machines[0].cores < 1) { pdde_cluster_free(c); return; }
    pdde_cluster_device d0 = c->machines[0].devices[0];
    int dev[4] = {d0.id, d0.id + 1000, d0.id + 2000, d0.id + 3000}, cores = c->machines[0].cores;
    for (int k = 1; k < 4; k++) {
        pdde_cluster_device dk = d0;
        dk.id = dev[k];
        pdde_cluster_add_device(c, 0, &dk);
    }
    const int64_t count = 1 << 16;
    double a2a = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLTOALL, PDDE_ALGO_AUTO, dev, 4, count, PDDE_F32);
    double ar = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, dev, 2, count / 4, PDDE_F32);
    double a2a2 = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLTOALL, PDDE_ALGO_AUTO, dev, 2, count, PDDE_F32);
    double over = 4.0 > cores ? 4.0 / cores : 1; /* (the file's machine: 2 cores) */
    double shared = sim_collectives(c, dev, 4, count), two = sim_collectives(c, dev, 2, count);
    CHECK(a2a > 0 && ar > 0 && over == 2 && test_close(shared, (a2a + ar) * over, 1e-9, 0),
          "4 CPU ranks on %d cores: alltoall + pair allreduce simulated in %g s, want (%g + %g) x %g = %g s", cores, shared, a2a, ar, over,
          (a2a + ar) * over);
    CHECK(test_close(two, a2a2 + ar, 1e-9, 0), "2 CPU ranks on %d cores: %g s, want %g s (their own cores)", cores, two, a2a2 + ar);
    /* the MoE model's experts' gradients over dp (4 ranks, ep 1) on the same machine, shared and on 4 cores */
    pdde_moe_cost_params mp = PDDE_MOE_COST_PARAMS_INIT;
    mp.tokens = 512, mp.width = 128, mp.ffn = 512, mp.experts = 8, mp.topk = 2, mp.layers = 2;
    pdde_moe_cost m2, m4;
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 4, &mp, 1, &m2) == PDDE_OK, "%s", pdde_last_error(ctx));
    c->machines[0].cores = 4;
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 4, &mp, 1, &m4) == PDDE_OK, "%s", pdde_last_error(ctx));
    double own = sim_collectives(c, dev, 4, count);
    CHECK(test_close(own, a2a + ar, 1e-9, 0) && m4.dp_sync_s > 0 && test_close(shared / own, m2.dp_sync_s / m4.dp_sync_s, 1e-9, 0),
          "4 CPU ranks on 4 cores: %g s (want %g s); slowed by 2 cores %g x, the MoE model's gradients %g x", own, a2a + ar, shared / own,
          m2.dp_sync_s / m4.dp_sync_s);
    c->machines[0].cores = 2, c->specs[d0.spec].kind = PDDE_DEVICE_GPU;
    double gpu = sim_collectives(c, dev, 4, count),
           want = pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLTOALL, PDDE_ALGO_AUTO, dev, 4, count, PDDE_F32) +
                  pdde_cost_collective_time(ctx, c, PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, dev, 2, count / 4, PDDE_F32);
    CHECK(want > 0 && test_close(gpu, want, 1e-9, 0), "4 GPU ranks on a 2-core machine: %g s, want %g s", gpu, want);
    pdde_cluster_free(c);
}

/* A grouped GEMM on a CPU as its kernel runs it: the experts' row tiles (at most the rows / 2 threads
 * each) one a thread, all threads at once in one fork, a thread at its share of the device's rate on
 * T x 512 rows (or T tiles' rows, more) of the tile's columns and depth, not at the rate of T small
 * tiles' rows (which a GEMM split over the threads pays its split on), and each tile reading its B
 * operand (an expert's weights) at the memory's streaming rate (the elementwise curve's last point:
 * 1e10 B/s). A CPU of 2 threads: 1e10 FLOP/s at 256 rows, 4e10 at 1024, 4.4e10 at 4096 (x 256 x
 * 256), 2e10 at 64. 8 experts of 64 rows: 8 tiles at the 1024-row rate; 3 of 128 rows: 6 tiles of 96
 * (3 rounds); 2 of 4096 rows: 4 tiles of 2048 at the 4096-row rate; one thread (or a GPU) takes each
 * expert's GEMM at 64 rows. The MoE model prices the busiest rank's experts so; and the passes over
 * the experts' buffers: the activation over the routed rows (ep 1), or over the buffer by expert's
 * padded rows (ep 2: S = 2 x 128 tokens an expert). */
static void test_moe_grouped_gemm_cpu(void) {
    pdde_cluster *c = make_cluster(1, 2);
    pdde_device_spec *s = &c->specs[0];
    s->kind = PDDE_DEVICE_CPU, s->n_gemm = 4;
    snprintf(s->name, sizeof s->name, "CPU (2 threads, test)");
    s->gemm[0] = (pdde_gemm_point){PDDE_F32, 64, 256, 256, 2e10};
    s->gemm[1] = (pdde_gemm_point){PDDE_F32, 256, 256, 256, 1e10};
    s->gemm[2] = (pdde_gemm_point){PDDE_F32, 1024, 256, 256, 4e10};
    s->gemm[3] = (pdde_gemm_point){PDDE_F32, 4096, 256, 256, 4.4e10};
    pdde_cost_op op = {.kind = PDDE_COST_COMPUTE, .op_class = PDDE_OPCLASS_GEMM, .m = 64, .n = 256, .k = 256, .gemms = 8};
    double w = 256.0 * 256 * 4 / 1e10; /* a tile's weights read */
    double flops = 8 * 2.0 * 64 * 256 * 256, t = pdde_cost_compute_time(ctx, c, 0, &op), want = flops / 4e10 + 8 * w;
    CHECK(test_close(t, want, 1e-12, 0), "8 experts of 64 rows on 2 threads: %g s (want %g: tiles a thread at the 1024-row rate and 8 tiles' "
          "weights, not %g at the 128-row rate)", t, want, flops / 1e10);
    op.gemms = 3, op.m = 128;
    t = pdde_cost_compute_time(ctx, c, 0, &op), want = 3 * 2.0 * 128 * 256 * 256 / 4e10 + 6 * w;
    CHECK(test_close(t, want, 1e-12, 0), "3 experts of 128 rows: 6 tiles of 96: %g s (want %g)", t, want);
    op.gemms = 2, op.m = 4096;
    t = pdde_cost_compute_time(ctx, c, 0, &op), want = 2 * 2.0 * 4096 * 256 * 256 / 4.4e10 + 4 * w;
    CHECK(test_close(t, want, 1e-12, 0), "2 experts of 4096 rows: 4 tiles of 2048 at the 4096-row rate: %g s (want %g)", t, want);
    snprintf(s->name, sizeof s->name, "CPU (1 threads, test)");
    op.gemms = 8, op.m = 64;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &op), flops / 2e10, 1e-12, 0), "one thread: every expert at 64 rows");
    s->kind = PDDE_DEVICE_GPU;
    CHECK(test_close(pdde_cost_compute_time(ctx, c, 0, &op), flops / 2e10, 1e-12, 0), "a GPU: the rate at one expert's rows");
    /* the MoE model: 256 tokens, top-2 of 8 experts, width 256, ffn 256: 64 rows an expert on one rank */
    s->kind = PDDE_DEVICE_CPU;
    snprintf(s->name, sizeof s->name, "CPU (2 threads, test)");
    pdde_moe_cost_params p = PDDE_MOE_COST_PARAMS_INIT;
    p.tokens = 256, p.width = 256, p.ffn = 256, p.experts = 8, p.topk = 2, p.layers = 2;
    int dev[2] = {0, 1};
    pdde_moe_cost m;
    want = 2 * 6 * (flops / 4e10 + 8 * w);
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 1, &p, 1, &m) == PDDE_OK && test_close(m.expert_gemm_s, want, 1e-12, 0),
          "moe model's expert GEMMs on 2 threads: %g s (want %g)", m.expert_gemm_s, want);
    /* its buffers (past the curves' last points: elementwise 1e10 B/s, row 5e9): ep 1, the activation
     * over 512 rows of 256 (2 + 3 x 512 KiB); ep 2 on 2 ranks, 4 experts x 256 rows of 256 (1 MiB):
     * the activation (2 + 3) and 4 X + 2 H zeroed at the elementwise rate, 3 X + 3 H scanned at the row rate */
    s->n_curve[PDDE_OPCLASS_ROW] = 1, s->curve[PDDE_OPCLASS_ROW][0] = (pdde_curve_point){1e6, 2e-4};
    double bh = 512.0 * 256 * 4, e1 = 2 * 5 * bh * 1e-10, e2 = 2 * (11 * 1048576 * 1e-10 + 6 * 1048576 / 5e9);
    pdde_moe_cost m2;
    CHECK(pdde_moe_cost_estimate(ctx, c, dev, 2, &p, 2, &m2) == PDDE_OK && test_close(m.expert_buffer_s, e1, 1e-9, 0) &&
              test_close(m2.expert_buffer_s, e2, 1e-9, 0) && test_close(m2.step_s, m2.alltoall_s + m2.expert_gemm_s + m2.expert_buffer_s + m2.dp_sync_s, 1e-12, 0),
          "moe buffers: ep 1 %g s (want %g), ep 2 %g s (want %g)", m.expert_buffer_s, e1, m2.expert_buffer_s, e2);
    pdde_cluster_free(c);
}

/* The plan text's expert layouts: ep=tp (the tp axis), ep=N (dp ranks; N = tp > 1 read as the tp axis, as
 * texts always were), ep=dp:N (N dp ranks even where N = tp): each printed form parses back to the same
 * plan and gpt runs the layout it says; a bad value is refused naming the key and what it wants. */
static void test_plan_text_ep(void) {
    static const struct { const char *text, *printed; int ep, groups; } cases[] = {
        {"dp=4,tp=2,ep=tp", "ep=tp", 2, 0},     {"dp=4,tp=2,ep=2", "ep=tp", 2, 0}, /* (the old text: the tp axis) */
        {"dp=4,tp=2,ep=dp:2", "ep=dp:2", 2, 2}, {"dp=8,tp=2,ep=4", "ep=4", 4, 4},
        {"dp=4,ep=2", "ep=2", 2, 2},            {"dp=4,ep=dp:2", "ep=2", 2, 2}, /* (tp 1: ep counts dp ranks anyway) */
        {"dp=4,ep=4", "ep=4", 4, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pdde_plan p, back;
        char text[256] = "", again[256] = "";
        pdde_status st = pdde_plan_parse(cases[i].text, &p);
        if (!st) pdde_plan_str(&p, text, sizeof text);
        pdde_status st2 = st ? st : pdde_plan_parse(text, &back);
        if (!st2) pdde_plan_str(&back, again, sizeof again);
        const char *at = strstr(text, ",ep=");
        gpt_plan gp = st ? (gpt_plan){0} : gpt_plan_of(&p);
        CHECK(!st && !st2 && at && !strcmp(at + 1, cases[i].printed) && !strcmp(text, again) && p.ep == cases[i].ep && back.ep == p.ep &&
                  back.ep_dp == p.ep_dp && gp.ep == cases[i].groups,
              "plan text %s: %s, printed %s (want ...,%s), again %s; ep %d (want %d), gpt's groups of %d (want %d)", cases[i].text,
              st ? p.why : "ok", text, cases[i].printed, again, p.ep, cases[i].ep, gp.ep, cases[i].groups);
    }
    static const struct { const char *text, *why; } bad[] = {
        {"dp=4,ep=tp", "ep: want tp only with tp >= 2"}, {"dp=4,tp=2,ep=dp:3", "ep: want 0, 1, tp"}, {"dp=4,tp=2,ep=dp:1", "ep: want N, tp"},
        {"dp=4,tp=2,ep=dp:x", "ep: want N, tp"},         {"dp=2,tp=2,ep=dp:2", "ep: want 0, 1, tp"}, {"dp=4,tp=2,ep=tq", "ep: want an integer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        pdde_plan p;
        pdde_status st = pdde_plan_parse(bad[i].text, &p);
        CHECK(st == PDDE_ERR_INVALID_ARG && strstr(p.why, bad[i].why) && p.ep == 0, "plan text %s: refused with '%s' (want '%s')", bad[i].text,
              st ? p.why : "accepted", bad[i].why);
    }
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context_init(&cp, &ctx);
    test_compute();
    test_collectives();
    test_pipeline();
    test_overlap_and_errors();
    test_rendezvous();
    test_shared_cores();
    test_from_graph();
    test_attention();
    test_attention_window();
    test_search_matches_simulation();
    test_plan_programs();
    test_fusion_defaults();
    test_plan_devices_calibrated();
    test_zero3_prefetch_by_backend();
    test_moe_cost();
    test_moe_cost_zero3_prefetch();
    test_moe_cost_hier();
    test_moe_choose_ep_placement();
    test_moe_grouped_gemm_cpu();
    test_moe_pick_shared_cores();
    test_simulate_shared_collectives();
    test_moe_plan_search();
    test_moe_ep_simulated();
    test_plan_text_ep();
    pdde_context_free(ctx);
    return test_finish();
}
