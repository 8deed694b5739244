/* bench_costmodel — the cost model's predictions against measured steps, on one process.
 *
 *   bench_costmodel CLUSTER.json [--steps N]
 *
 * For GPT training steps of two sizes, with and without recompute, on each device of this machine
 * (the CPU, and the OpenCL device where there is one), it measures the median step time of a session
 * and predicts it from the cluster file (pdde-bench's measurements of this machine) by simulating the
 * graph's program (pdde_cost_program_from_graph + pdde_cost_simulate). Next to it, Paddle's formula:
 * every op's FLOPs / (0.65 x the device's peak). Memory: the predicted peak against the session's
 * (parameters + gradients + optimizer state + inputs + the activation arena).
 *
 * One process only: the multi-rank configurations of the issue wait on the lowering's per-rank programs.
 * Last line: RESULT costmodel_single n=<configs> mape=<%> max_err=<%> baseline_mape=<%> mem_mape=<%> */
#define _GNU_SOURCE
#include "pdde.h"
#include "bench_common.h"
#include "examples/gpt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Paddle's estimate: FLOPs / (0.65 x peak) for every op (a GEMM 2mnk, any other op one per element). */
static double paddle_estimate(const pdde_cost_program *p, double peak) {
    double t = 0;
    for (int i = 0; i < pdde_cost_program_n_ops(p, 0); i++) {
        const pdde_cost_op *op = pdde_cost_program_op(p, 0, i);
        double flops = op->op_class == PDDE_OPCLASS_GEMM ? 2.0 * (double)op->m * (double)op->n * (double)op->k : op->out_bytes / 4;
        t += flops / (0.65 * peak);
    }
    return t;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s CLUSTER.json [--steps N]   (write one with pdde-bench)\n", argv[0]);
        return 2;
    }
    int steps = argc > 3 && !strcmp(argv[2], "--steps") ? atoi(argv[3]) : 5;
    if (steps < 1) steps = 1;
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) return 1;
    pdde_cluster *cl;
    if (pdde_cluster_load(ctx, argv[1], &cl)) {
        fprintf(stderr, "bench_costmodel: %s\n", pdde_last_error(ctx));
        return 1;
    }
    const gpt_config sizes[2] = {{256, 64, 2, 4, 128, 8, 0}, {256, 128, 4, 4, 256, 8, 0}};
    int devices[2] = {0, pdde_device_find(ctx, "opencl", 0)};
    double err_sum = 0, err_max = 0, base_sum = 0, mem_sum = 0;
    int n = 0;
    printf("%-34s %10s %10s %7s %10s %7s %9s %9s\n", "config", "measured", "predicted", "err", "paddle", "err", "mem MB", "pred MB");
    for (int di = 0; di < 2; di++) {
        int dev = devices[di];
        if (dev < 0 || !pdde_cluster_find_device(cl, dev, NULL)) continue;
        for (int si = 0; si < 2; si++)
            for (int rc = 0; rc < 2; rc++) {
                if (di == 1 && si == 1 && rc == 1) continue; /* the slow device: three configurations */
                pdde_graph *g;
                gpt_model m;
                pdde_graph_init(ctx, &g);
                gpt_build(g, &sizes[si], &m);
                for (int l = 0; rc && l < sizes[si].layers + 2; l++) pdde_graph_set_recompute(g, l, 1);
                pdde_backward(g, m.loss);
                pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
                pdde_optimizer_adamw(g, &op);
                pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
                sp.device = dev;
                pdde_session *s = NULL;
                if (pdde_graph_status(g) || pdde_session_init(g, &sp, &s)) {
                    fprintf(stderr, "bench_costmodel: %s\n", pdde_last_error(ctx));
                    pdde_graph_free(g);
                    continue;
                }
                size_t nt = (size_t)sizes[si].batch * (size_t)sizes[si].ctx;
                int32_t *ids = malloc(nt * sizeof *ids);
                for (size_t i = 0; i < nt; i++) ids[i] = (int32_t)((i * 2654435761u) % 256);
                pdde_session_write(s, m.ids, ids, nt * sizeof *ids);
                pdde_session_write(s, m.targets, ids, nt * sizeof *ids);
                free(ids);
                double v[64];
                pdde_session_run(s, PDDE_RUN_STEP); /* warm-up: kernel builds, first touches */
                for (int i = 0; i < steps && i < 64; i++) {
                    double t0 = bench_now();
                    pdde_session_run(s, PDDE_RUN_STEP);
                    v[i] = bench_now() - t0;
                }
                double measured = bench_median(v, steps < 64 ? steps : 64);
                pdde_memory_stats ms;
                pdde_session_memory(s, &ms);
                double mem = (double)(ms.arena_bytes + ms.param_bytes + ms.grad_bytes + ms.optimizer_bytes + ms.input_bytes);
                pdde_cost_program *p = NULL;
                pdde_cost_result *r = NULL;
                if (pdde_cost_program_from_graph(g, dev, &p) || pdde_cost_simulate(ctx, cl, p, &r)) {
                    fprintf(stderr, "bench_costmodel: %s\n", pdde_last_error(ctx));
                } else {
                    const pdde_cluster_device *cd = pdde_cluster_find_device(cl, dev, NULL);
                    double base = paddle_estimate(p, cl->specs[cd->spec].peak_flops);
                    double err = 100 * fabs(r->step_time - measured) / measured, berr = 100 * fabs(base - measured) / measured;
                    double merr = 100 * fabs(r->peak_memory[0] - mem) / mem;
                    char name[64];
                    snprintf(name, sizeof name, "%s L%d C%d%s", di ? "opencl" : "cpu", sizes[si].layers, sizes[si].width, rc ? " recompute" : "");
                    printf("%-34s %8.2fms %8.2fms %6.1f%% %8.2fms %6.0f%% %9.2f %9.2f\n", name, measured * 1e3, r->step_time * 1e3, err,
                           base * 1e3, berr, mem / 1e6, r->peak_memory[0] / 1e6);
                    double by_class[PDDE_OPCLASS_COUNT] = {0};
                    for (int i = 0; i < pdde_cost_program_n_ops(p, 0); i++) {
                        const pdde_cost_op *o = pdde_cost_program_op(p, 0, i);
                        by_class[o->op_class] += pdde_cost_compute_time(ctx, cl, dev, o);
                    }
                    printf("    predicted by class:");
                    for (int k = 0; k < PDDE_OPCLASS_COUNT; k++) printf(" %s %.2fms", pdde_op_class_name((pdde_op_class)k), by_class[k] * 1e3);
                    printf("\n");
                    err_sum += err, base_sum += berr, mem_sum += merr, n++;
                    if (err > err_max) err_max = err;
                }
                pdde_cost_result_free(r);
                pdde_cost_program_free(p);
                pdde_session_free(s);
                pdde_graph_free(g);
            }
    }
    pdde_cluster_free(cl);
    pdde_context_free(ctx);
    if (!n) return 1;
    printf("RESULT costmodel_single n=%d mape=%.1f max_err=%.1f baseline_mape=%.1f mem_mape=%.1f\n", n, err_sum / n, err_max,
           base_sum / n, mem_sum / n);
    return 0;
}
