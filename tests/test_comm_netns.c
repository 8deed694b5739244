/* test_comm_netns.c — two emulated hosts: network namespaces joined by a veth pair (created and
 * removed here; needs root, skipped when `ip netns` is not permitted). Each "host" runs pdde-run
 * with 2 ranks (--nnodes 2), the store on host A's address; the ranks check that the world spans two
 * hosts, that large allreduces take the two-level algorithm, and that every result is right. */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    printf("SKIP ucx: pdde was built without comm (no UCX)\n0 passed, 0 failed, 1 skipped\n");
    return 0;
}
#else
#include "test_util.h"
#include "netns_util.h"
#include <libgen.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int val(int r, size_t i) { return (int)((r * 31 + i * 7) % 19) - 9; }

/* One rank (started by pdde-run inside a namespace). Prints "counts P F" as its last line. */
static int child_main(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_comm *comm;
    pdde_status st = pdde_comm_init(ctx, NULL, &comm);
    CHECK(st == PDDE_OK, "init: %s", pdde_last_error(ctx));
    if (!st) {
        int n = pdde_comm_size(comm), me = pdde_comm_rank(comm);
        CHECK(pdde_comm_host_count(comm) == 2, "hosts: %d", pdde_comm_host_count(comm));
        static const size_t sizes[] = {1, 7, 1001, 65537, 1 << 19};
        static const pdde_comm_algo algos[] = {PDDE_ALGO_AUTO, PDDE_ALGO_TWO_LEVEL, PDDE_ALGO_RING, PDDE_ALGO_RECURSIVE};
        float *f = malloc((1 << 19) * sizeof *f);
        int32_t *x = malloc((1 << 19) * sizeof *x);
        for (int ai = 0; ai < 4; ai++) {
            pdde_comm_set_algo(comm, algos[ai]);
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
                size_t cnt = sizes[si];
                for (size_t i = 0; i < cnt; i++) f[i] = (float)val(me, i);
                st = pdde_comm_allreduce(comm, f, f, cnt, PDDE_F32, PDDE_REDUCE_SUM);
                CHECK(st == PDDE_OK, "allreduce: %s", pdde_last_error(ctx));
                size_t bad = 0;
                for (size_t i = 0; i < cnt; i++) {
                    long s = 0;
                    for (int r = 0; r < n; r++) s += val(r, i);
                    bad += f[i] != (float)s;
                }
                CHECK(bad == 0, "allreduce f32 sum count=%zu algo=%s: %zu wrong", cnt, pdde_comm_last_algo(comm), bad);
                if (algos[ai] == PDDE_ALGO_AUTO && cnt == (1 << 19))
                    CHECK(!strcmp(pdde_comm_last_algo(comm), "two_level"), "large allreduce across hosts took %s",
                          pdde_comm_last_algo(comm));
                if (algos[ai] == PDDE_ALGO_TWO_LEVEL)
                    CHECK(!strcmp(pdde_comm_last_algo(comm), "two_level"), "forced two-level took %s", pdde_comm_last_algo(comm));
                for (size_t i = 0; i < cnt; i++) x[i] = val(me, i);
                st = pdde_comm_allreduce(comm, x, x, cnt, PDDE_I32, PDDE_REDUCE_MAX);
                bad = 0;
                for (size_t i = 0; i < cnt; i++) {
                    int m = val(0, i);
                    for (int r = 1; r < n; r++) m = val(r, i) > m ? val(r, i) : m;
                    bad += x[i] != m;
                }
                CHECK(st == PDDE_OK && bad == 0, "allreduce i32 max count=%zu algo=%s: %zu wrong", cnt,
                      pdde_comm_last_algo(comm), bad);
            }
        }
        /* the other collectives across hosts, once */
        pdde_comm_set_algo(comm, PDDE_ALGO_AUTO);
        int32_t mine[3] = {me, me * 10, me * 100}, all[12];
        CHECK(pdde_comm_allgather(comm, mine, all, 3, PDDE_I32) == PDDE_OK && all[3 * 3 + 2] == 300 && all[4] == 10,
              "allgather across hosts");
        pdde_comm *host = NULL;
        CHECK(pdde_comm_split(comm, me / 2, me, &host) == PDDE_OK && pdde_comm_host_count(host) == 1, "split per host");
        pdde_comm_free(host);
        free(f); free(x);
        pdde_comm_free(comm);
    }
    pdde_context_free(ctx);
    printf("counts %d %d\n", test_passed, test_failed);
    return test_failed ? 1 : 0;
}

int main(int argc, char **argv) {
    /* ranks are fork()ed from this process: device runtimes (PoCL's threads) do not survive a fork */
    setenv("PDDE_BACKENDS", "cpu", 0);
    if (argc == 2 && !strcmp(argv[1], "--child")) return child_main();
    netns_pair np;
    netns_pair_name(&np);
    const char *a = np.ns[0], *b = np.ns[1], *va = np.dev[0], *vb = np.dev[1];
    if (!netns_pair_permitted(&np)) {
        test_skip("netns", "cannot create network namespaces (needs root and `ip netns`)");
        return test_finish();
    }
    int ok = netns_pair_connect(&np);
    CHECK(ok, "network namespace setup");
    if (ok) {
        char dir[512], cmd[2][1400];
        snprintf(dir, sizeof dir, "%s", argv[0]);
        const char *d = dirname(dir);
        const char *ns[2] = {a, b}, *dev[2] = {va, vb};
        FILE *p[2];
        /* both nodes of the job share its secret (through the environment, as a cluster's launcher would) */
        char secret[80];
        if (!pdde_job_secret_generate(NULL, secret, sizeof secret)) setenv("PDDE_JOB_SECRET", secret, 1);
        for (int k = 0; k < 2; k++) {
            /* TCP over the veth only: UCX would otherwise see one machine and use shared memory */
            snprintf(cmd[k], sizeof cmd[k],
                     "timeout -s KILL 100 ip netns exec %s env UCX_TLS=tcp UCX_NET_DEVICES=%s UCX_WARN_UNUSED_ENV_VARS=n "
                     "%s/pdde-run -n 2 --nnodes 2 --node-rank %d --store 10.231.77.1:29517 %s --child 2>&1",
                     ns[k], dev[k], d, k, argv[0]);
            p[k] = popen(cmd[k], "r");
        }
        int lines = 0;
        for (int k = 0; k < 2; k++) {
            char line[1024];
            while (p[k] && fgets(line, sizeof line, p[k])) {
                int r, pp, ff;
                if (sscanf(line, "[%d] counts %d %d", &r, &pp, &ff) == 3) { test_passed += pp; test_failed += ff; lines++; }
                else fputs(line, stderr);
            }
            int st = p[k] ? pclose(p[k]) : -1;
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "host %c: pdde-run exit status 0x%x", 'A' + k, st);
        }
        CHECK(lines == 4, "all 4 ranks reported (%d)", lines);
    }
    netns_pair_remove(&np);
    return test_finish();
}
#endif
