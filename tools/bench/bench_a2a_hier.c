/* bench_a2a_hier — the hierarchical all-to-all against the flat one on the same ranks, sizes and
 * timing, on one machine whose ranks are presented as hosts by their host ids (rank r on host
 * r / L): across those "hosts" UCX carries the messages (over its shared-memory transports here, or
 * TCP on 127.0.0.1 with --tcp: UCX_TLS=tcp,self), within them pdde's shared-memory channel does in the
 * hierarchical form's first stage. A NIC between real hosts has a larger cost a message than either,
 * so this measures the form's overheads (the extra stage and copies) more than its gain.
 *
 *   bench_a2a_hier [--build DIR] [--ranks N] [--local L] [--tcp]   (ranks 4, local 2: 2 hosts x 2)
 *   bench_a2a_hier --worker L        (one rank, under pdde-run)
 *
 * Each size is the bytes of one rank pair's message (pdde_comm_alltoall, f32): 5 rounds of the flat
 * exchange (PDDE_COMM_A2A_HIER=0) then the hierarchical one (=1), each round the mean of as many
 * exchanges as take about 50 ms; the median round of each. Prints each size's times and their ratio,
 * and what the automatic rule (PDDE_COMM_A2A_HIER_BYTES) picks there.
 * Last line: RESULT a2a_hier ranks=<N> hosts=<H> speedup_<bytes>=<flat / hierarchical> ... */
#define _GNU_SOURCE
#include "pdde.h"
#include "bench_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const size_t SIZES[] = {64, 1024, 4096, 16384, 65536, 262144};
#define N_SIZES (int)(sizeof SIZES / sizeof SIZES[0])
#define ROUNDS 5

static int cmp_d(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static int worker(int L) {
    pdde_context *ctx;
    if (pdde_context_init(NULL, &ctx)) return 1;
    const char *r = getenv("PDDE_RANK");
    char host[32];
    snprintf(host, sizeof host, "bench-host-%d", (r ? atoi(r) : 0) / L);
    pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
    p.host_id = host;
    pdde_comm *flat = NULL, *hier = NULL;
    setenv("PDDE_COMM_A2A_HIER", "0", 1); /* (read at a communicator's first all-to-all) */
    int rc = pdde_comm_init(ctx, &p, &flat) != PDDE_OK;
    int32_t one = 1, back[256];
    rc = rc || pdde_comm_alltoall(flat, &one, back, 0, PDDE_I32);
    setenv("PDDE_COMM_A2A_HIER", "1", 1);
    rc = rc || pdde_comm_split(flat, 0, pdde_comm_rank(flat), &hier);
    if (rc) { fprintf(stderr, "bench_a2a_hier: %s\n", pdde_last_error(ctx)); return 1; }
    int n = pdde_comm_size(flat), me = pdde_comm_rank(flat);
    for (int si = 0; si < N_SIZES && !rc; si++) {
        size_t count = SIZES[si] / 4;
        float *a = calloc(count * (size_t)n, 4), *b = calloc(count * (size_t)n, 4);
        double t[2][ROUNDS];
        int iters = 1;
        for (int k = 0; k < 2 && !rc; k++) /* (warm both: the sub-communicators, the buffers) */
            rc |= pdde_comm_alltoall(k ? hier : flat, a, b, count, PDDE_F32);
        /* as many exchanges as take ~50 ms flat, agreed on (rank 0's count) */
        double t0 = bench_now();
        for (int i = 0; i < 3 && !rc; i++) rc |= pdde_comm_alltoall(flat, a, b, count, PDDE_F32);
        int32_t it = (int32_t)(0.05 / ((bench_now() - t0) / 3 + 1e-9)) + 1;
        rc = rc || pdde_comm_broadcast(flat, &it, 1, PDDE_I32, 0);
        iters = it > 2000 ? 2000 : it;
        for (int round = 0; round < ROUNDS && !rc; round++)
            for (int k = 0; k < 2 && !rc; k++) {
                pdde_comm *c = k ? hier : flat;
                rc |= pdde_comm_barrier(flat);
                t0 = bench_now();
                for (int i = 0; i < iters && !rc; i++) rc |= pdde_comm_alltoall(c, a, b, count, PDDE_F32);
                t[k][round] = (bench_now() - t0) / iters;
            }
        if (!rc && me == 0) {
            qsort(t[0], ROUNDS, sizeof(double), cmp_d), qsort(t[1], ROUNDS, sizeof(double), cmp_d);
            printf("RES %zu %.9g %.9g %s\n", SIZES[si], t[0][ROUNDS / 2], t[1][ROUNDS / 2], pdde_comm_last_algo(hier));
            fflush(stdout);
        }
        free(a), free(b);
    }
    if (rc) fprintf(stderr, "bench_a2a_hier: %s\n", pdde_last_error(ctx));
    pdde_comm_free(hier), pdde_comm_free(flat);
    pdde_context_free(ctx);
    return rc;
}

int main(int argc, char **argv) {
    const char *build = "build";
    int ranks = 4, L = 2, tcp = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--worker") && i + 1 < argc) return worker(atoi(argv[i + 1]));
        else if (!strcmp(argv[i], "--build") && i + 1 < argc) build = argv[++i];
        else if (!strcmp(argv[i], "--ranks") && i + 1 < argc) ranks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--local") && i + 1 < argc) L = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tcp")) tcp = 1;
        else { fprintf(stderr, "usage: bench_a2a_hier [--build DIR] [--ranks N] [--local L] [--tcp]\n"); return 2; }
    }
    if (L < 2 || ranks % L || ranks / L < 2 || ranks > 64) { fprintf(stderr, "bench_a2a_hier: %d ranks in hosts of %d: need 2 or more hosts of 2 or more\n", ranks, L); return 2; }
    int H = ranks / L;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s PDDE_BACKENDS=cpu UCX_WARN_UNUSED_ENV_VARS=n %s/pdde-run -n %d %s/bench_a2a_hier --worker %d 2>&1", tcp ? "UCX_TLS=tcp,self" : "",
             build, ranks, build, L);
    FILE *f = popen(cmd, "r");
    if (!f) { perror("popen"); return 1; }
    char line[512], result[1024];
    int n = snprintf(result, sizeof result, "RESULT a2a_hier ranks=%d hosts=%d transport=%s", ranks, H, tcp ? "tcp" : "ucx-default");
    printf("all-to-all (f32) on %d ranks as %d hosts x %d, across hosts over UCX (%s), flat against hierarchical, median of %d rounds:\n", ranks, H, L,
           tcp ? "TCP on 127.0.0.1" : "its default transports", ROUNDS);
    printf("  %10s %12s %12s %8s %s\n", "pair bytes", "flat s", "hier s", "flat/hier", "auto picks");
    int got = 0;
    while (fgets(line, sizeof line, f)) {
        size_t bytes;
        double tf, th;
        char algo[32];
        const char *res = strstr(line, "RES "); /* (after pdde-run's "[rank] ") */
        if (res && sscanf(res, "RES %zu %lf %lf %31s", &bytes, &tf, &th, algo) == 4) {
            printf("  %10zu %12.4g %12.4g %8.2f %s\n", bytes, tf, th, tf / th, bytes <= PDDE_COMM_A2A_HIER_BYTES(H, L) ? "hierarchical" : "flat");
            n += snprintf(result + n, sizeof result - (size_t)n, " speedup_%zu=%.2f", bytes, tf / th);
            got++;
        } else {
            fputs(line, stderr);
        }
    }
    int rc = pclose(f);
    if (rc || got != N_SIZES) { fprintf(stderr, "bench_a2a_hier: the ranks failed (%d sizes measured)\n", got); return 1; }
    printf("%s\n", result);
    return 0;
}
