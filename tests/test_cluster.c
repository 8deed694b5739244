/* test_cluster — the cluster object: a heterogeneous cluster built in code survives JSON exactly
 * (text and fields), every malformed file is rejected with the path of the field and what was
 * expected, and this machine is detected. */
#include "pdde.h"
#include "test_util.h"
#include "examples/gpt.h"

#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pdde_context *ctx;
static int have_json; /* built with cJSON */

/* Two machines that differ in everything: machine 7 has 2 GPUs (devices 10, 11) on NVLink, machine 3
 * has 4 accelerators of another model (devices 20..23) with less memory each, a PCIe link between
 * two of them sharing a switch, and a measured allreduce. */
static pdde_cluster *make_cluster(void) {
    pdde_cluster *c;
    pdde_cluster_init("hetero", &c);
    pdde_device_spec a = {.kind = PDDE_DEVICE_GPU, .peak_flops = 19.5e12, .mem_bandwidth = 1.555e12};
    snprintf(a.name, sizeof a.name, "A100-like");
    snprintf(a.backend, sizeof a.backend, "cuda");
    a.n_gemm = 2;
    a.gemm[0] = (pdde_gemm_point){PDDE_F32, 1024, 512, 256, 1.41e13};
    a.gemm[1] = (pdde_gemm_point){PDDE_BF16, 8192, 8192, 8192, 2.73e14};
    a.n_curve[PDDE_OPCLASS_ELEMENTWISE] = 2;
    a.curve[PDDE_OPCLASS_ELEMENTWISE][0] = (pdde_curve_point){4096, 5e-6};
    a.curve[PDDE_OPCLASS_ELEMENTWISE][1] = (pdde_curve_point){1 << 30, 8.1e-4};
    pdde_device_spec b = {.kind = PDDE_DEVICE_ACCEL, .peak_flops = 1e12 / 3, .mem_bandwidth = 0};
    snprintf(b.name, sizeof b.name, "slow accel");
    snprintf(b.backend, sizeof b.backend, "opencl");
    b.n_curve[PDDE_OPCLASS_OPTIMIZER] = 1;
    b.curve[PDDE_OPCLASS_OPTIMIZER][0] = (pdde_curve_point){1e6, 0.1};
    b.n_curve[PDDE_OPCLASS_FUSED_ATTENTION] = 2;
    b.curve[PDDE_OPCLASS_FUSED_ATTENTION][0] = (pdde_curve_point){4e5, 3.1e-5};
    b.curve[PDDE_OPCLASS_FUSED_ATTENTION][1] = (pdde_curve_point){3e7, 2.7e-3};
    b.contention[PDDE_OPCLASS_GEMM] = 1.25, b.contention[PDDE_OPCLASS_ROW] = 1.0625; /* (a has none: written without) */
    b.n_curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD] = 1; /* the last class, by its name */
    b.curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD][0] = (pdde_curve_point){1e6, 2.9e-4};
    pdde_cluster_add_spec(c, &a);
    pdde_cluster_add_spec(c, &b);
    pdde_cluster_machine m0 = {.id = 7, .cores = 64, .numa_nodes = 2, .host_memory = 1ull << 40, .l3_cache = 256u << 20,
                               .intra = {-1, -1, PDDE_LINK_NVLINK, 3e11, 2e-6, -1},
                               .nic = {-1, -1, PDDE_LINK_NET, 2.5e10, 5e-6, -1}};
    snprintf(m0.name, sizeof m0.name, "gpu-host");
    pdde_cluster_machine m1 = m0;
    m1.id = 3, m1.cores = 8, m1.numa_nodes = 1, m1.intra.kind = PDDE_LINK_SHM, m1.intra.bandwidth = 1e10;
    m1.nic.bandwidth = 1.25e9;
    snprintf(m1.name, sizeof m1.name, "accel-host");
    int i0 = pdde_cluster_add_machine(c, &m0), i1 = pdde_cluster_add_machine(c, &m1);
    for (int d = 0; d < 2; d++) pdde_cluster_add_device(c, i0, &(pdde_cluster_device){10 + d, 0, 80000000000ull + (uint64_t)d});
    for (int d = 0; d < 4; d++) pdde_cluster_add_device(c, i1, &(pdde_cluster_device){20 + d, 1, 17000000000ull + (uint64_t)d});
    pdde_cluster_add_link(c, &(pdde_cluster_link){21, 22, PDDE_LINK_PCIE, 1.2e10, 1.5e-6, 4});
    pdde_cluster_add_calib(c, &(pdde_collective_calib){PDDE_COLL_ALLREDUCE, PDDE_ALGO_RING, 2, 1, 3.25e-5, 6.5e9});
    return c;
}

/* base with the n-th (1-based) occurrence of from replaced by to; NULL if there is none. */
static char *mutate(const char *base, const char *from, const char *to, int nth) {
    const char *at = base;
    for (int i = 0; at && i < nth; i++) {
        at = strstr(i ? at + 1 : at, from);
    }
    if (!at) return NULL;
    size_t nb = strlen(base), nf = strlen(from), nt = strlen(to);
    char *s = malloc(nb - nf + nt + 1);
    size_t pre = (size_t)(at - base);
    memcpy(s, base, pre);
    memcpy(s + pre, to, nt);
    memcpy(s + pre + nt, at + nf, nb - pre - nf + 1);
    return s;
}

static void expect_error(const char *base, const char *from, const char *to, int nth, const char *want) {
    char *bad = mutate(base, from, to, nth);
    CHECK(bad != NULL, "the base text has no %s", from);
    if (!bad) return;
    pdde_cluster *c = NULL;
    pdde_status st = pdde_cluster_parse(ctx, bad, &c);
    CHECK(st == PDDE_ERR_CORRUPT && c == NULL, "%s -> %s: status %d", from, to, st);
    CHECK(strstr(pdde_last_error(ctx), want) != NULL, "%s -> %s: message \"%s\" lacks \"%s\"", from, to, pdde_last_error(ctx), want);
    pdde_cluster_free(c);
    free(bad);
}

/* base with the text from the first `start` through the first `end` after it replaced by to. */
static char *replace_span(const char *base, const char *start, const char *end, const char *to) {
    const char *a = strstr(base, start), *b = a ? strstr(a, end) : NULL;
    if (!b) return NULL;
    b += strlen(end);
    size_t pre = (size_t)(a - base), nt = strlen(to), rest = strlen(b);
    char *s = malloc(pre + nt + rest + 1);
    memcpy(s, base, pre), memcpy(s + pre, to, nt), memcpy(s + pre + nt, b, rest + 1);
    return s;
}

static void expect_span_error(const char *base, const char *start, const char *end, const char *to, const char *want) {
    char *bad = replace_span(base, start, end, to);
    CHECK(bad != NULL, "the base text has no %s ... %s", start, end);
    if (!bad) return;
    pdde_cluster *c = NULL;
    pdde_status st = pdde_cluster_parse(ctx, bad, &c);
    CHECK(st == PDDE_ERR_CORRUPT && c == NULL && strstr(pdde_last_error(ctx), want), "%s ... %s -> %s: status %d, message \"%s\" (want \"%s\")",
          start, end, to, st, pdde_last_error(ctx), want);
    pdde_cluster_free(c);
    free(bad);
}

static void expect_parses(const char *base, const char *from, const char *to, const char *what) {
    char *text = mutate(base, from, to, 1);
    pdde_cluster *c = NULL;
    CHECK(text && pdde_cluster_parse(ctx, text, &c) == PDDE_OK, "%s: %s", what, pdde_last_error(ctx));
    pdde_cluster_free(c);
    free(text);
}

static void test_round_trip(void) {
    pdde_cluster *c = make_cluster();
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_OK, "%s", pdde_last_error(ctx));
    CHECK(pdde_cluster_device_count(c) == 6, "%d devices", pdde_cluster_device_count(c));
    char *text = NULL, *again = NULL;
    CHECK(pdde_cluster_to_json(ctx, c, &text) == PDDE_OK, "%s", pdde_last_error(ctx));
    pdde_cluster *d = NULL;
    CHECK(text && pdde_cluster_parse(ctx, text, &d) == PDDE_OK, "%s", pdde_last_error(ctx));
    if (!d) { pdde_cluster_free(c), free(text); return; }
    CHECK(pdde_cluster_to_json(ctx, d, &again) == PDDE_OK && !strcmp(text, again), "the text changed:\n%s\n---\n%s", text, again);
    /* the fields, not just the text */
    CHECK(d->n_specs == 2 && d->n_machines == 2 && d->n_links == 1 && d->n_calibs == 1, "counts");
    CHECK(!strcmp(d->specs[0].name, "A100-like") && d->specs[0].kind == PDDE_DEVICE_GPU && !strcmp(d->specs[0].backend, "cuda") &&
          d->specs[0].n_gemm == 2 && d->specs[0].gemm[0].m == 1024 && d->specs[0].gemm[0].n == 512 && d->specs[0].gemm[0].k == 256 &&
          d->specs[0].gemm[1].dtype == PDDE_BF16 && d->specs[0].gemm[1].flops == 2.73e14, "spec 0 differs");
    CHECK(d->specs[1].peak_flops == 1e12 / 3 && d->specs[1].curve[PDDE_OPCLASS_OPTIMIZER][0].seconds == 0.1, "spec 1 numbers");
    CHECK(d->specs[1].n_curve[PDDE_OPCLASS_FUSED_ATTENTION] == 2 && d->specs[1].curve[PDDE_OPCLASS_FUSED_ATTENTION][1].seconds == 2.7e-3 &&
          text && strstr(text, "\"fused_attention\""), "the fused attention curve, by name");
    CHECK(d->specs[1].n_curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD] == 1 &&
          d->specs[1].curve[PDDE_OPCLASS_FUSED_ATTENTION_BACKWARD][0].seconds == 2.9e-4 && text &&
          strstr(text, "\"fused_attention_backward\""), "the fused attention backward curve, by name");
    CHECK(d->specs[0].curve[PDDE_OPCLASS_ELEMENTWISE][1].bytes == 1 << 30 && d->specs[0].n_curve[PDDE_OPCLASS_ROW] == 0, "curves");
    CHECK(d->specs[1].contention[PDDE_OPCLASS_GEMM] == 1.25 && d->specs[1].contention[PDDE_OPCLASS_ROW] == 1.0625 &&
          d->specs[1].contention[PDDE_OPCLASS_ELEMENTWISE] == 0 && d->specs[0].contention[PDDE_OPCLASS_GEMM] == 0 && text &&
          strstr(text, "\"contention\"") && !strstr(strstr(text, "\"contention\"") + 1, "\"contention\""), "contention: spec 1's figures, spec 0 none (written once)");
    CHECK(d->machines[1].id == 3 && d->machines[1].n_devices == 4 && d->machines[1].devices[3].memory == 17000000003ull &&
          d->machines[1].devices[3].spec == 1 && d->machines[0].host_memory == 1ull << 40, "machines");
    CHECK(d->machines[0].intra.kind == PDDE_LINK_NVLINK && d->machines[0].intra.latency == 2e-6 && d->machines[1].nic.bandwidth == 1.25e9, "machine links");
    CHECK(d->links[0].a == 21 && d->links[0].b == 22 && d->links[0].group == 4 && d->links[0].kind == PDDE_LINK_PCIE, "link");
    CHECK(d->calibs[0].op == PDDE_COLL_ALLREDUCE && d->calibs[0].algo == PDDE_ALGO_RING && d->calibs[0].intra == 1 &&
          d->calibs[0].latency == 3.25e-5, "calibration");
    /* lookups: ids, not indices */
    int m = -1;
    const pdde_cluster_device *dev = pdde_cluster_find_device(d, 22, &m);
    CHECK(dev && m == 1 && dev->memory == 17000000002ull, "find device 22");
    CHECK(!pdde_cluster_find_device(d, 0, NULL), "device 0 does not exist here");
    pdde_cluster_link l;
    CHECK(pdde_cluster_link_between(d, 21, 22, &l) == PDDE_OK && l.kind == PDDE_LINK_PCIE && l.bandwidth == 1.2e10, "explicit link");
    CHECK(pdde_cluster_link_between(d, 20, 23, &l) == PDDE_OK && l.kind == PDDE_LINK_SHM && l.bandwidth == 1e10, "intra link");
    CHECK(pdde_cluster_link_between(d, 10, 23, &l) == PDDE_OK && l.kind == PDDE_LINK_NET && l.bandwidth == 1.25e9 &&
          test_close(l.latency, 1e-5, 1e-12, 0), "cross-machine link: the slower NIC, both latencies");
    CHECK(pdde_cluster_link_between(d, 10, 99, &l) == PDDE_ERR_NOT_FOUND, "unknown device");

    /* a file: save(load(f)) == f, byte for byte */
    char path[64], path2[64];
    snprintf(path, sizeof path, "/tmp/pdde_test_cluster_%d.json", (int)getpid());
    snprintf(path2, sizeof path2, "/tmp/pdde_test_cluster_%d_2.json", (int)getpid());
    pdde_cluster *e = NULL;
    CHECK(pdde_cluster_save(ctx, d, path) == PDDE_OK, "%s", pdde_last_error(ctx));
    CHECK(pdde_cluster_load(ctx, path, &e) == PDDE_OK, "%s", pdde_last_error(ctx));
    CHECK(e && pdde_cluster_save(ctx, e, path2) == PDDE_OK, "%s", pdde_last_error(ctx));
    FILE *f1 = fopen(path, "rb"), *f2 = fopen(path2, "rb");
    int same = f1 && f2, ch1 = 0, ch2 = 0;
    while (same && (ch1 = fgetc(f1)) == (ch2 = fgetc(f2)) && ch1 != EOF) {}
    CHECK(same && ch1 == EOF && ch2 == EOF, "the files differ");
    if (f1) fclose(f1);
    if (f2) fclose(f2);
    /* a load error names the file too */
    FILE *f = fopen(path, "w");
    fputs("{\"format\": \"pdde-cluster\", \"version\": 1}", f);
    fclose(f);
    pdde_cluster *bad = NULL;
    CHECK(pdde_cluster_load(ctx, path, &bad) == PDDE_ERR_CORRUPT && strstr(pdde_last_error(ctx), path) &&
          strstr(pdde_last_error(ctx), "name: missing"), "%s", pdde_last_error(ctx));
    CHECK(pdde_cluster_load(ctx, "/nonexistent/c.json", &bad) == PDDE_ERR_IO && bad == NULL, "missing file");
    remove(path), remove(path2);
    pdde_cluster_free(e);
    pdde_cluster_free(d);
    pdde_cluster_free(c);
    free(text), free(again);
}

static void test_malformed(void) {
    pdde_cluster *c = make_cluster();
    char *base = NULL;
    pdde_cluster_to_json(ctx, c, &base);
    pdde_cluster_free(c);
    if (!base) { CHECK(0, "no base text"); return; }
    /* machines[1] is machine id 3; its devices[3] is id 23, memory 17000000003 */
    expect_error(base, "17000000003", "\"lots\"", 1, "machines[1].devices[3].memory: expected bytes as an integer");
    expect_error(base, "17000000003", "-5", 1, "machines[1].devices[3].memory: expected bytes as an integer, got -5");
    expect_error(base, "17000000003", "1.5", 1, "machines[1].devices[3].memory: expected bytes as an integer");
    expect_error(base, "\"spec\":\t\"slow accel\",", "", 1, "machines[1].devices[0].spec: missing");
    /* a misspelt key is refused by name with the keys allowed there (it would silently keep a default) */
    expect_error(base, "\"spec\":", "\"spek\":", 6, "machines[1].devices[3].spek: unknown key (expected id, spec, memory)");
    expect_error(base, "\"memory\":\t17000000003", "\"memroy\":\t17000000003", 1, "machines[1].devices[3].memroy: unknown key");
    expect_error(base, "\"contention\":", "\"contension\":", 1, "specs[1].contension: unknown key (expected name, kind, backend, "
                 "peak_flops, mem_bandwidth, gemm, curves, contention)");
    expect_error(base, "\"latency\":\t2e-06", "\"latncy\":\t2e-06", 1, "machines[0].intra.latncy: unknown key (expected kind, bandwidth, latency, group)");
    expect_error(base, "\"ranks\":\t2", "\"rank\":\t2", 1, "collectives[0].rank: unknown key");
    expect_error(base, "\"cores\":\t8", "\"core\":\t8", 1, "machines[1].core: unknown key");
    expect_error(base, "\"accel\"", "\"tpu\"", 1, "specs[1].kind: unknown device kind \"tpu\"");
    expect_error(base, "\"b\":\t22", "\"b\":\t99", 1, "links[0].b: no device with id 99");
    expect_error(base, "\"a\":\t21", "\"a\":\t\"x\"", 1, "links[0].a: expected a device id");
    expect_error(base, "\"id\":\t23", "\"id\":\t11", 1, "machines[1].devices[3].id: duplicate device id 11");
    expect_error(base, "\"id\":\t3,", "\"id\":\t7,", 1, "machines[1].id: duplicate machine id 7");
    expect_error(base, "\"name\":\t\"slow accel\"", "\"name\":\t\"A100-like\"", 1, "specs[1].name: duplicate spec name");
    expect_error(base, "\"spec\":\t\"slow accel\"", "\"spec\":\t\"nope\"", 1, "machines[1].devices[0].spec: no spec named \"nope\"");
    expect_error(base, "\"kind\":\t\"pcie\"", "\"kind\":\t\"carrier pigeon\"", 1, "links[0].kind: unknown link kind");
    expect_error(base, "\"bandwidth\":\t12000000000", "\"bandwidth\":\t\"fast\"", 1, "links[0].bandwidth: expected B/s");
    expect_error(base, "\"latency\":\t2e-06", "\"latency\":\t-2e-06", 1, "machines[0].intra.latency: expected seconds");
    expect_error(base, "\"links\":", "\"linkz\":", 1, "linkz: unknown key (expected format, version, name, specs, machines, links, collectives)");
    expect_error(base, "\"machines\":\t[", "\"machines\":\t{\"x\": [", 1, "");
    expect_error(base, "\"cores\":\t8", "\"cores\":\t8.5", 1, "machines[1].cores: expected an integer");
    expect_error(base, "\"flops\":\t14100000000000", "\"flops\":\t0", 1, "specs[0].gemm[0].flops: expected FLOP/s as a number > 0");
    expect_error(base, "\"elementwise\":", "\"sorcery\":", 1, "specs[0].curves.sorcery: unknown op class");
    expect_error(base, "[1073741824, 0.00081]", "[1024, 0.00081]", 1, "specs[0].curves.elementwise[1]: expected bytes increasing");
    expect_error(base, "\"row\":\t1.0625", "\"row\":\t0.5", 1, "specs[1].contention.row: expected a slowdown as a number >= 1");
    expect_error(base, "\"gemm\":\t1.25", "\"gemm\":\t\"fast\"", 1, "specs[1].contention.gemm: expected a slowdown");
    expect_error(base, "\"gemm\":\t1.25", "\"sorcery\":\t1.25", 1, "specs[1].contention.sorcery: unknown op class");
    expect_error(base, "\"ranks\":\t2", "\"ranks\":\t1", 1, "collectives[0].ranks: expected an integer >= 2");
    expect_error(base, "\"intra\":\ttrue", "\"intra\":\t1", 1, "collectives[0].intra: expected true");
    expect_error(base, "\"algo\":\t\"ring\"", "\"algo\":\t\"ring of fire\"", 1, "collectives[0].algo: unknown algorithm");
    expect_error(base, "\"format\":\t\"pdde-cluster\"", "\"format\":\t\"paddle\"", 1, "format: expected \"pdde-cluster\"");
    expect_error(base, "\"hetero\",", "\"hetero\"", 1, "syntax error at line 5");
    /* what types and ranges alone cannot say, each of which would plan wrongly or fail far from its cause */
    expect_error(base, "17000000003", "0", 1, "machines[1].devices[3].memory: expected the bytes device 23 can give a training job (> 0), got 0");
    expect_error(base, "\"b\":\t22", "\"b\":\t21", 1, "links[0].b: expected a device other than a (21): a link joins two devices");
    /* one pair, two links (either way round): only the first would be used */
    expect_error(base, "\"links\":\t[{", "\"links\":\t[{\"a\": 22, \"b\": 21, \"kind\": \"nvlink\", \"bandwidth\": 5e10, \"latency\": 1e-6, \"group\": -1}, {", 1,
                 "links[1]: a second link between devices 21 and 22 (also links[0]); expected one link per pair of devices");
    /* a group shares one bandwidth: explicit links, and a machine's intra or nic in the group */
    const char *same_group = "\"links\":\t[{\"a\": 20, \"b\": 23, \"kind\": \"pcie\", \"bandwidth\": 13000000000, \"latency\": 1e-6, \"group\": 4}, {";
    expect_error(base, "\"links\":\t[{", same_group, 1, "links[1].bandwidth: expected 1.3e+10 B/s, the bandwidth of links[0] in the same "
                 "group 4 (a group's links share one bandwidth), got 1.2e+10");
    expect_error(base, "\"group\":\t-1", "\"group\":\t4", 4, "links[0].bandwidth: expected 1.25e+09 B/s, the bandwidth of machines[1].nic in "
                 "the same group 4");
    char *grouped = mutate(base, "\"links\":\t[{", same_group, 1);
    if (grouped) expect_parses(grouped, "13000000000", "12000000000", "two links of group 4 at one bandwidth");
    free(grouped);
    expect_span_error(base, "\"devices\":\t[{", "}]", "\"devices\":\t[]",
                      "machines[0].devices: expected at least one device on machine 7 (\"gpu-host\"), got none");
    expect_span_error(base, "\"machines\":\t[{", "}],\n\t\"links\"", "\"machines\":\t[],\n\t\"links\"", "machines: expected at least one machine, got none");
    expect_error(base, "\"collectives\":\t[{", "\"collectives\":\t[{\"op\": \"allreduce\", \"algo\": \"ring\", \"ranks\": 2, \"intra\": true, "
                 "\"latency\": 1e-5, \"bandwidth\": 1e9}, {", 1, "collectives[1]: a second measurement of allreduce (ring, 2 ranks, within a machine) "
                 "(also collectives[0]); expected one per op, algo, ranks and intra");
    expect_parses(base, "\"collectives\":\t[{", "\"collectives\":\t[{\"op\": \"allreduce\", \"algo\": \"ring\", \"ranks\": 2, \"intra\": false, "
                  "\"latency\": 1e-5, \"bandwidth\": 1e9}, {", "the same collective across machines is another measurement");
    expect_error(base, "\"gemm\":\t[{", "\"gemm\":\t[{\"dtype\": \"bf16\", \"m\": 8192, \"n\": 8192, \"k\": 8192, \"flops\": 1e14}, {", 1,
                 "specs[0].gemm[2]: a second figure for bf16 m=8192 n=8192 k=8192 (also gemm[0]); expected one per dtype and shape");
    /* a key given twice: the first would be read, the other ignored */
    expect_error(base, "\"memory\":\t17000000003", "\"memory\":\t17000000003, \"memory\": 0", 1,
                 "machines[1].devices[3].memory: given twice (expected each key once)");
    expect_error(base, "\"row\":\t1.0625", "\"row\":\t1.0625, \"row\": 2", 1, "specs[1].contention.row: given twice");
    expect_error(base, "\"optimizer\":\t[[1000000, 0.1]]", "\"optimizer\":\t[[1000000, 0.1]], \"optimizer\": [[2000000, 0.2]]", 1,
                 "specs[1].curves.optimizer: given twice");
    /* a class's curve given again and again, each full and going on from the one before: its points
     * would go on past the class's room (a crash) */
    char curves[8192];
    int n = 0;
    for (int a = 0; a < 4; a++)
        for (int i = 0; i < PDDE_CLUSTER_MAX_CURVE; i++) {
            int pt = a * PDDE_CLUSTER_MAX_CURVE + i + 1;
            n += snprintf(curves + n, sizeof curves - (size_t)n, "%s%s[%d, %g]%s", i ? "" : a ? ", \"ps_push\": [" : "\"ps_push\": [", i ? ", " : "",
                          1000 * pt, 1e-6 * pt, i == PDDE_CLUSTER_MAX_CURVE - 1 ? "]" : "");
        }
    expect_span_error(base, "\"elementwise\":\t[[", "]]", curves, "specs[0].curves.ps_push: given twice");
    /* a version from the future is its own status */
    char *v2 = mutate(base, "\"version\":\t1", "\"version\":\t2", 1);
    pdde_cluster *c2 = NULL;
    CHECK(v2 && pdde_cluster_parse(ctx, v2, &c2) == PDDE_ERR_VERSION && !c2, "version 2: %s", pdde_last_error(ctx));
    free(v2);
    free(base);
}

/* Clusters built in code get the same checks before they are written. */
static void test_validate(void) {
    pdde_cluster *c = make_cluster();
    c->machines[1].devices[2].spec = 5;
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "machines[1].devices[2].spec"),
          "%s", pdde_last_error(ctx));
    char *s = NULL;
    CHECK(pdde_cluster_to_json(ctx, c, &s) == PDDE_ERR_INVALID_ARG && !s, "a bad cluster was written");
    c->machines[1].devices[2].spec = 1;
    c->specs[1].kind = (pdde_device_kind)7;
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "specs[1].kind"), "%s", pdde_last_error(ctx));
    c->specs[1].kind = PDDE_DEVICE_ACCEL;
    c->specs[0].contention[PDDE_OPCLASS_ROW] = 0.5; /* a speedup is no contention */
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "specs[0].contention.row"), "%s", pdde_last_error(ctx));
    c->specs[0].contention[PDDE_OPCLASS_ROW] = 0;
    c->machines[0].nic.bandwidth = NAN;
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "machines[0].nic.bandwidth"), "%s", pdde_last_error(ctx));
    c->machines[0].nic.bandwidth = 2.5e10;
    /* what the reader refuses is refused here too: a file written from it would not load */
    c->machines[1].cores = -1;
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "machines[1].cores: expected an integer >= 0, got -1"),
          "%s", pdde_last_error(ctx));
    c->machines[1].cores = 8;
    c->machines[0].devices[1].id = -11;
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "machines[0].devices[1].id: expected an integer >= 0"),
          "%s", pdde_last_error(ctx));
    c->machines[0].devices[1].id = 11;
    c->machines[0].devices[1].memory = 0;
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "machines[0].devices[1].memory: expected the bytes device 11"),
          "%s", pdde_last_error(ctx));
    c->machines[0].devices[1].memory = 1;
    c->links[0].b = 21;
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "links[0].b: expected a device other than a (21)"),
          "%s", pdde_last_error(ctx));
    c->links[0].b = 22;
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_OK, "restored: %s", pdde_last_error(ctx));
    pdde_cluster_machine bare = {.id = 9, .intra = {-1, -1, PDDE_LINK_SHM, 1e10, 1e-6, -1}, .nic = {-1, -1, PDDE_LINK_NET, 1e9, 1e-6, -1}};
    snprintf(bare.name, sizeof bare.name, "bare");
    pdde_cluster_add_machine(c, &bare);
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG &&
          strstr(pdde_last_error(ctx), "machines[2].devices: expected at least one device on machine 9 (\"bare\"), got none"), "%s", pdde_last_error(ctx));
    pdde_cluster_free(c);
    pdde_cluster_init("empty", &c);
    CHECK(pdde_cluster_validate(ctx, c) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "machines: expected at least one machine"), "%s",
          pdde_last_error(ctx));
    pdde_cluster_free(c);
    pdde_cluster_free(NULL);
}

static void test_detect(void) {
    pdde_cluster *c = NULL;
    CHECK(pdde_cluster_detect(ctx, &c) == PDDE_OK, "%s", pdde_last_error(ctx));
    if (!c) return;
    CHECK(c->n_machines == 1 && c->machines[0].n_devices == pdde_device_count(ctx), "one machine with every device");
    CHECK(c->machines[0].cores >= 1 && c->machines[0].numa_nodes >= 1 && c->machines[0].host_memory > (64u << 20), "host facts");
    const pdde_cluster_device *d = pdde_cluster_find_device(c, 0, NULL);
    CHECK(d && c->specs[d->spec].kind == PDDE_DEVICE_CPU && d->memory > 0 && !strcmp(c->specs[d->spec].backend, "cpu"), "the CPU");
    char *s = NULL;
    pdde_cluster *back = NULL;
    if (have_json) {
    CHECK(pdde_cluster_to_json(ctx, c, &s) == PDDE_OK && pdde_cluster_parse(ctx, s, &back) == PDDE_OK, "%s", pdde_last_error(ctx));
    CHECK(back && back->machines[0].cores == c->machines[0].cores && back->machines[0].l3_cache == c->machines[0].l3_cache, "detected round trip");
    }
    printf("detected: %s, %d cores, %d NUMA nodes, %.1f MB L3, %d devices\n", c->machines[0].name, c->machines[0].cores,
           c->machines[0].numa_nodes, (double)c->machines[0].l3_cache / 1e6, c->machines[0].n_devices);
    pdde_cluster_free(back);
    pdde_cluster_free(c);
    free(s);
}

/* The search's view: per device, in the cluster's order (ids are not indices). */
static void test_plan_devices(void) {
    pdde_cluster *c = make_cluster();
    pdde_plan_devices d;
    CHECK(pdde_plan_devices_init(ctx, c, 1024, 512, 256, &d) == PDDE_OK, "%s", pdde_last_error(ctx));
    CHECK(d.n_devices == 6, "%d devices", d.n_devices);
    if (d.n_devices == 6) {
        CHECK(d.flops[0] == 1.41e13 && d.flops[5] == 1e12 / 3, "GEMM table at the shape, else the peak: %g %g", d.flops[0], d.flops[5]);
        CHECK(test_close(d.mem_bw[1], (1 << 30) / 8.1e-4, 1e-12, 0) && d.mem_bw[2] == 0, "bandwidth from the curve: %g", d.mem_bw[1]);
        CHECK(d.memory[1] == 80000000001.0 && d.memory[5] == 17000000003.0, "memory");
        CHECK(d.host[0] == 0 && d.host[1] == 0 && d.host[2] == 1 && d.host[5] == 1, "hosts");
        CHECK(d.intra_bw == 1e10 && d.inter_bw == 1.25e9 && test_close(d.inter_lat, 1e-5, 1e-12, 0), "links: the slowest");
    }
    pdde_plan_devices_free(&d);
    pdde_cluster_free(c);
}

/* Timed on a graph's nodes as one of 2 ranks: a [2048, 256] x [256, 512] GEMM is [1024, ...] per rank,
 * the measured shape (its rate exactly); the add of two [2048, 512] f32 tensors touches 6 MiB per rank,
 * timed on the elementwise curve (the whole batch's GEMM shape has another rate). The accelerator without curves keeps its peak and no bandwidth. */
static void test_plan_devices_graph(void) {
    pdde_cluster *c = make_cluster();
    c->specs[0].gemm[c->specs[0].n_gemm++] = (pdde_gemm_point){PDDE_F32, 2048, 512, 256, 5e12}; /* the whole batch's shape */
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){2048, 256});
    pdde_tensor *w = pdde_param(g, "w", 2, (int64_t[]){256, 512}, 0.02f);
    pdde_tensor *y = pdde_matmul(g, x, w, 0, 0);
    pdde_mark_output(pdde_add(g, y, y));
    pdde_plan_devices d;
    CHECK(pdde_plan_devices_init_graph(ctx, c, g, 2, &d) == PDDE_OK && d.n_devices == 6, "%s", pdde_last_error(ctx));
    if (d.n_devices == 6) {
        double bytes = 3.0 * 2048 * 512 * 4 / 2, t = 5e-6 + (bytes - 4096) / ((1 << 30) - 4096) * (8.1e-4 - 5e-6);
        CHECK(d.flops[0] == 1.41e13, "the GEMM at a rank's rows: %g", d.flops[0]);
        CHECK(test_close(d.mem_bw[1], bytes / t, 1e-12, 0), "the add's bytes over its time: %g, want %g", d.mem_bw[1], bytes / t);
        CHECK(d.flops[5] == 1e12 / 3 && d.mem_bw[5] == 0 && d.memory[5] == 17000000003.0, "uncalibrated device: %g %g", d.flops[5], d.mem_bw[5]);
    }
    pdde_plan_devices_free(&d);
    pdde_graph_free(g);
    pdde_cluster_free(c);
}

/* One machine of a CPU and n_acc accelerators of spec `acc` (PCIe links to the CPU, NVLink between them). */
static pdde_cluster *one_machine(int n_acc, double acc_flops, pdde_device_kind kind, const char *backend) {
    pdde_cluster *c;
    pdde_cluster_init("one machine", &c);
    pdde_device_spec cpu = {.kind = PDDE_DEVICE_CPU}, acc = {.kind = kind};
    snprintf(cpu.name, sizeof cpu.name, "cpu:test"), snprintf(cpu.backend, sizeof cpu.backend, "cpu");
    snprintf(acc.name, sizeof acc.name, "%s:test", backend), snprintf(acc.backend, sizeof acc.backend, "%s", backend);
    double rate[2] = {1e11, acc_flops};
    pdde_device_spec *sp[2] = {&cpu, &acc};
    for (int i = 0; i < 2; i++) {
        sp[i]->n_gemm = 1, sp[i]->gemm[0] = (pdde_gemm_point){PDDE_F32, 1024, 1024, 1024, rate[i]};
        for (int k = 0; k < PDDE_OPCLASS_COUNT; k++) /* memory-bound classes at a hundredth of the GEMM rate, in B/s */
            sp[i]->n_curve[k] = 1, sp[i]->curve[k][0] = (pdde_curve_point){1e8, 1e8 / (rate[i] / 100)};
    }
    pdde_cluster_add_spec(c, &cpu), pdde_cluster_add_spec(c, &acc);
    pdde_cluster_machine m = {.id = 0, .cores = 32, .numa_nodes = 1, .host_memory = 512ull << 30,
                              .intra = {-1, -1, PDDE_LINK_NVLINK, 3e11, 2e-6, -1}, .nic = {-1, -1, PDDE_LINK_NET, 2.5e10, 5e-6, -1}};
    snprintf(m.name, sizeof m.name, "gpu-box");
    int mi = pdde_cluster_add_machine(c, &m);
    pdde_cluster_add_device(c, mi, &(pdde_cluster_device){0, 0, 256ull << 30});
    for (int d = 1; d <= n_acc; d++) {
        pdde_cluster_add_device(c, mi, &(pdde_cluster_device){d, 1, 80ull << 30});
        pdde_cluster_add_link(c, &(pdde_cluster_link){0, d, PDDE_LINK_PCIE, 2.5e10, 1e-5, -1});
    }
    return c;
}

/* The planner's view of one machine (pdde_plan_devices_init_machine): with 8 GPUs and a CPU each rank
 * gets its own GPU (its figures and its memory whole) and the CPU beside it as a placement target; a
 * ninth rank is an extra data-parallel rank on the CPU; where the accelerator is slower than the CPU
 * (PoCL on the same cores) every rank stays on the CPU with the accelerator a shared placement target. */
static void test_one_machine(void) {
    pdde_graph *g;
    gpt_model m;
    gpt_config cfg = {.vocab = 512, .ctx = 64, .layers = 4, .heads = 8, .width = 256, .batch = 32};
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_graph_init(ctx, &g);
    CHECK(gpt_build(g, &cfg, &m) == PDDE_OK && pdde_backward(g, m.loss) == PDDE_OK && pdde_optimizer_adamw(g, &op) == PDDE_OK, "gpt");
    pdde_cluster *c = one_machine(8, 4e14, PDDE_DEVICE_GPU, "cuda");
    pdde_plan_devices all, d;
    CHECK(pdde_plan_devices_init_graph(ctx, c, g, 8, &all) == PDDE_OK && all.n_devices == 9, "%s", pdde_last_error(ctx));
    CHECK(all.flops[1] > 100 * all.flops[0], "the GPU's figure above the CPU's: %g vs %g", all.flops[1], all.flops[0]);
    CHECK(pdde_plan_devices_init_machine(ctx, c, g, 8, &d) == PDDE_OK && d.n_devices == 8, "8 ranks: %s", pdde_last_error(ctx));
    int own = 0;
    for (int r = 0; r < d.n_devices; r++)
        own += d.flops[r] == all.flops[1 + r] && d.mem_bw[r] == all.mem_bw[1 + r] && d.memory[r] == (double)(80ull << 30) &&
               d.place_flops && d.place_flops[r] == all.flops[0] && d.place_memory[r] == all.memory[0] / 8 && !strcmp(d.backend[r], "cuda") &&
               d.cluster_device && d.cluster_device[r] == 1 + r;
    CHECK(own == 8 && !strcmp(d.place_backend, "cpu") && d.place_bw == 2.5e10 && !strcmp(all.backend[0], "cpu"),
          "each of 8 ranks on its own GPU (backend cuda), the CPU a placement target beside it: %d of 8, place '%s'", own, d.place_backend);
    /* the search on it: every rank used; placing layers on the CPU does not pay */
    pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
    pp.batch = cfg.batch, pp.tp_divisor = cfg.heads, pp.use_all_devices = 1;
    pdde_plan plans[8];
    int nf = 0, nr = 0;
    CHECK(pdde_plan_search(g, &d, &pp, plans, 8, &nf, &nr) == PDDE_OK && nf > 0 && plans[0].dp * plans[0].tp * plans[0].pp == 8 &&
          !plans[0].place[0], "the best plan on the 8 GPUs places nothing on the CPU: %s", nf ? plans[0].why : pdde_last_error(ctx));
    pdde_plan_devices_free(&d);
    pdde_plan_devices_free(&all);
    /* two ranks: GPUs 0 and 1, whole (figures timed as one of 2 ranks) */
    pdde_plan_devices_init_graph(ctx, c, g, 2, &all);
    CHECK(pdde_plan_devices_init_machine(ctx, c, g, 2, &d) == PDDE_OK && d.n_devices == 2 && d.flops[0] == all.flops[1] &&
          d.flops[1] == all.flops[2] && d.memory[1] == (double)(80ull << 30), "2 ranks on GPUs 0 and 1");
    pdde_plan_devices_free(&d);
    pdde_plan_devices_free(&all);
    /* nine ranks: the ninth on the CPU */
    pdde_plan_devices_init_graph(ctx, c, g, 9, &all);
    CHECK(pdde_plan_devices_init_machine(ctx, c, g, 9, &d) == PDDE_OK && d.n_devices == 9 && d.flops[7] == all.flops[8] &&
          d.flops[8] == all.flops[0] && d.memory[8] == all.memory[0] && d.place_flops[8] == 0 && !strcmp(d.backend[7], "cuda") &&
          !strcmp(d.backend[8], "cpu") && d.cluster_device[7] == 8 && d.cluster_device[8] == 0,
          "9 ranks: 8 on the GPUs, the ninth on the CPU (no placement beside it)");
    pdde_plan_devices_free(&d);
    pdde_plan_devices_free(&all);
    pdde_cluster_free(c);
    /* an accelerator slower than the CPU: every rank on the CPU, the accelerator a shared placement target */
    c = one_machine(1, 1e9, PDDE_DEVICE_ACCEL, "opencl");
    CHECK(pdde_plan_devices_init_graph(ctx, c, g, 2, &all) == PDDE_OK, "%s", pdde_last_error(ctx));
    CHECK(pdde_plan_devices_init_machine(ctx, c, g, 2, &d) == PDDE_OK && d.n_devices == 2 && d.flops[0] == all.flops[0] / 2 &&
          d.flops[1] == all.flops[0] / 2 && d.mem_bw[1] == all.mem_bw[0] / 2 && d.memory[1] == all.memory[0] / 2 &&
          !strcmp(d.place_backend, "opencl") &&
          d.place_flops[1] == all.flops[1] && d.place_memory[0] == all.memory[1] / 2 && d.cluster_device[0] == 0 && d.cluster_device[1] == 0,
          "a slow accelerator: both ranks on the CPU (the simulation's device too) with half its speed each, the accelerator "
          "shared beside them ('%s')", d.place_backend);
    /* two ranks on one CPU share its cores: data parallel over them is not predicted faster than one
     * rank on the whole CPU (it only adds the gradients' allreduce) */
    pdde_plan_devices one;
    pdde_plan_params cpu_pp = PDDE_PLAN_PARAMS_INIT;
    cpu_pp.batch = cfg.batch, cpu_pp.tp_divisor = cfg.heads, cpu_pp.use_all_devices = 1;
    pdde_plan best1[4], best2[4]; /* (a quarter of the room is for plans that do not fit) */
    int nf1 = 0, nf2 = 0, nr1 = 0, nr2 = 0;
    CHECK(pdde_plan_devices_init_machine(ctx, c, g, 1, &one) == PDDE_OK && pdde_plan_search(g, &one, &cpu_pp, best1, 4, &nf1, &nr1) == PDDE_OK &&
          pdde_plan_search(g, &d, &cpu_pp, best2, 4, &nf2, &nr2) == PDDE_OK && nf1 && nf2, "search on the CPU: %s", pdde_last_error(ctx));
    CHECK(nf1 && nf2 && best2[0].step_s >= 0.95 * best1[0].step_s,
          "2 ranks on one CPU predicted %.4g s/step, one rank on it %.4g: ranks sharing the cores are not faster", nf2 ? best2[0].step_s : 0,
          nf1 ? best1[0].step_s : 0);
    pdde_plan_devices_free(&one);
    pdde_plan_devices_free(&d);
    pdde_plan_devices_free(&all);
    pdde_cluster_free(c);
    pdde_graph_free(g);
}

/* The writer (no library): strings escaped and numbers printed as cJSON does, so that they read back
 * to the same bits (where cJSON is there to read them) and print the same text again; without cJSON
 * the file is still written. */
static void test_writer(void) {
    pdde_cluster *c = make_cluster();
    snprintf(c->name, sizeof c->name, "q\"b\\t\tn\nc\x01 \xc3\xa9");
    static const double odd[] = {0.1, 1.0 / 3, 1e-300, 6.02214076e23, 4294967296.0, 2147483647.0, 2147483648.0, 123456789.123456789,
                                 1e15 + 0.5, 5e-324}; /* (as with cJSON, 2^53 + 1 would print lossily: within epsilon at 15 digits) */
    enum { N_ODD = sizeof odd / sizeof *odd };
    c->specs[0].n_gemm = N_ODD;
    for (int i = 0; i < N_ODD; i++) c->specs[0].gemm[i] = (pdde_gemm_point){PDDE_F32, 64 + i, 64, 64, odd[i]};
    char *text = NULL, *again = NULL;
    CHECK(pdde_cluster_to_json(ctx, c, &text) == PDDE_OK && text, "%s", pdde_last_error(ctx));
    CHECK(text && strstr(text, "\"name\":\t\"q\\\"b\\\\t\\tn\\nc\\u0001 \xc3\xa9\""), "the name escaped as cJSON does:\n%.300s", text ? text : "");
    CHECK(text && strstr(text, "\"flops\":\t0.1\n") && strstr(text, "\"flops\":\t0.33333333333333331\n") && strstr(text, "\"flops\":\t4294967296\n") &&
          strstr(text, "\"flops\":\t2147483647\n") && strstr(text, "\"flops\":\t1e-300\n"), "numbers as cJSON prints them");
    pdde_cluster *d = NULL;
    if (have_json && text && pdde_cluster_parse(ctx, text, &d) == PDDE_OK) {
        int same = !strcmp(d->name, c->name);
        for (int i = 0; i < N_ODD; i++) same &= !memcmp(&d->specs[0].gemm[i].flops, &odd[i], sizeof odd[i]);
        CHECK(same, "every number and the name read back to the same bits");
        CHECK(pdde_cluster_to_json(ctx, d, &again) == PDDE_OK && !strcmp(text, again), "printed again the same");
    } else if (have_json) {
        CHECK(0, "the writer's text does not parse: %s", pdde_last_error(ctx));
    }
    pdde_cluster_free(d);
    free(text), free(again);
    pdde_cluster_free(c);
}

/* The search plans on a cluster file: a GPT (layers 0..5) on the mixed example cluster. The plan fits
 * every device it uses, and uses the fast devices: with 28 devices of 3 models, none gets a share it
 * could not hold. */
static void test_search_on_file(void) {
    pdde_cluster *c = NULL;
    if (pdde_cluster_load(ctx, "tools/clusters/mixed_28.json", &c)) {
        test_skip("files", "tools/clusters/mixed_28.json: %s", pdde_last_error(ctx));
        return;
    }
    pdde_plan_devices d;
    CHECK(pdde_plan_devices_init(ctx, c, 0, 0, 0, &d) == PDDE_OK && d.n_devices == 28, "%s", pdde_last_error(ctx));
    pdde_graph *g;
    gpt_model m;
    gpt_config cfg = {.vocab = 512, .ctx = 64, .layers = 4, .heads = 8, .width = 256, .batch = 32};
    pdde_graph_init(ctx, &g);
    CHECK(gpt_build(g, &cfg, &m) == PDDE_OK, "%s", pdde_last_error(ctx));
    pdde_plan_params pp = PDDE_PLAN_PARAMS_INIT;
    pp.batch = cfg.batch, pp.tp_divisor = cfg.heads;
    pdde_plan plans[8];
    int nf = 0, nr = 0;
    CHECK(pdde_plan_search(g, &d, &pp, plans, 8, &nf, &nr) == PDDE_OK && nf > 0, "%s", pdde_last_error(ctx));
    for (int i = 0; i < nf; i++)
        CHECK(plans[i].step_s > 0 && !plans[i].why[0] && plans[i].peak_bytes <= d.memory[plans[i].peak_device],
              "plan %d: %g s, %g bytes on device %d", i, plans[i].step_s, plans[i].peak_bytes, plans[i].peak_device);
    char buf[128];
    if (nf) pdde_plan_str(&plans[0], buf, sizeof buf), printf("mixed_28: best %s, %.3g ms\n", buf, plans[0].step_s * 1e3);
    pdde_graph_free(g);
    pdde_plan_devices_free(&d);
    pdde_cluster_free(c);
}

/* The example clusters of tools/clusters/ are in canonical form: to_json(load(f)) is f, byte for byte. */
static void test_example_files(void) {
    glob_t gl;
    if (glob("tools/clusters/*.json", 0, NULL, &gl) != 0) {
        test_skip("files", "the example clusters: tools/clusters/*.json not found from %s", getcwd((char[512]){0}, 512));
        return;
    }
    for (size_t i = 0; i < gl.gl_pathc; i++) {
        const char *path = gl.gl_pathv[i];
        FILE *f = fopen(path, "rb");
        char *text = NULL, *again = NULL;
        size_t n = 0;
        if (f && !fseek(f, 0, SEEK_END) && (n = (size_t)ftell(f)) > 0 && !fseek(f, 0, SEEK_SET) && (text = calloc(1, n + 1)))
            n = fread(text, 1, n, f);
        if (f) fclose(f);
        pdde_cluster *c = NULL;
        CHECK(text && pdde_cluster_load(ctx, path, &c) == PDDE_OK, "%s", pdde_last_error(ctx));
        CHECK(c && pdde_cluster_to_json(ctx, c, &again) == PDDE_OK && !strcmp(text, again), "%s: not in canonical form", path);
        CHECK(c && pdde_cluster_device_count(c) >= 16, "%s: devices", path);
        pdde_cluster_free(c);
        free(text), free(again);
    }
    globfree(&gl);
}

int main(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu";
    pdde_context_init(&cp, &ctx);
    char *probe = NULL;
    pdde_cluster *c = make_cluster();
    have_json = 1; /* reading works in every build: through cJSON, or without it pdde's own reader (planner/json_read.c) */
    CHECK(pdde_cluster_to_json(ctx, c, &probe) == PDDE_OK && probe && strstr(probe, "\"A100-like\""), "written with or without cJSON: %s",
          pdde_last_error(ctx));
    test_validate();
    test_detect();
    test_plan_devices();
    test_plan_devices_graph();
    test_one_machine();
    test_writer();
    if (!have_json) {
        test_skip("cjson", "the JSON tests: pdde was built without cJSON");
    } else {
        test_round_trip();
        test_malformed();
        test_example_files();
        test_search_on_file();
    }
    free(probe);
    pdde_cluster_free(c);
    pdde_context_free(ctx);
    return test_finish();
}
