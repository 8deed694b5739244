/* fuzz_parse — a fuzz target for what pdde reads that another program or a person wrote: plan text,
 * cluster files, checkpoints (the single file; a sharded one's manifest and shard), parameter-server
 * table files, token files, snapshots (the bytes a peer sends in an elastic job, read by
 * pdde_snapshot_from_data), the recommender's Criteo TSV data (examples/dlrm.h's reader) and Hugging Face's
 * safetensors files, config.json and tokenizer.json (examples/gpt_hf.h's and hf_tokenizer.h's readers). The first input byte picks the reader,
 * the rest is its input. Each
 * reader checks a checksum first; the target recomputes it over the mutated bytes (most of the time)
 * so that the parsing behind it is reached. Besides "no crash, no hang, no sanitizer report":
 *   - a plan that parses prints as text that parses to the same plan, and prints the same again;
 *   - a cluster file that parses is written back as JSON that parses and is written the same again;
 *   - a checkpoint that loads leaves a session whose step runs or says why not (NaN parameters), a
 *     table that loads one that pulls;
 *   - a token file's (pdde's or an llm.c shard) batches: each target is the next token;
 *   - a snapshot that is accepted restores the session or says why not;
 *   - a Criteo line read is a label 0 or 1, finite features >= 0 and ids of 1 to 8 hex digits tagged
 *     with their field; every line is read or counted as malformed, once;
 *   - a safetensors file that opens has every tensor's bytes inside the file, and each reads or says why;
 *     a config.json that is read gives a model gpt_build takes (or refuses saying why); a tokenizer.json
 *     that is read gives each token at most 255 bytes and encodes a text into ids of its vocabulary.
 *
 * Built by `make test-fuzz` with clang's libFuzzer under AddressSanitizer and UBSan (its corpus is
 * seeded with valid inputs of each kind at the first run); without libFuzzer main() below mutates
 * those valid inputs with a seeded random stream:
 *     fuzz_parse [seconds] [seed]          (the smoke run in `make test`) */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/dlrm.h"
#include "examples/gpt_hf.h"
#include "examples/hf_tokenizer.h"
#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { T_PLAN, T_CLUSTER, T_CKPT, T_MANIFEST, T_SHARD, T_TABLE, T_TOKENS, T_SNAPSHOT, T_CRITEO, T_SAFETENSORS, T_HF_CONFIG, T_HF_TOKENIZER, T_COUNT };
static const char *const target_name[T_COUNT] = {"plan",     "cluster", "checkpoint", "manifest",    "shard",     "table",
                                                 "tokens",   "snapshot", "criteo",    "safetensors", "hf config", "tokenizer.json"};

/* A violated property: the harness (not the library) stops here, so that the fuzzer records the input. */
#define REQUIRE(cond, ...) do { if (!(cond)) { fprintf(stderr, "fuzz_parse: " __VA_ARGS__); fputc('\n', stderr); abort(); } } while (0)

typedef struct { uint8_t *p; size_t n; } bytes;

static struct {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    pdde_ps_table *table;
    char dir[64];             /* scratch files */
    char shard_name[256];     /* the sharded checkpoint's one shard file */
    bytes seed[T_COUNT][6];   /* valid inputs of each kind */
    int n_seed[T_COUNT];
    bool accepted;            /* the last input was read without an error */
} F;

static bytes slurp(const char *path) {
    bytes b = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return b;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b.p = malloc((size_t)n + 1);
    if (b.p && fread(b.p, 1, (size_t)n, f) == (size_t)n) b.n = (size_t)n;
    fclose(f);
    return b;
}

static void spill(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f, "cannot write %s", path);
    if (n) REQUIRE(fwrite(p, 1, n, f) == n, "short write to %s", path);
    fclose(f);
}

static void add_seed(int t, const void *p, size_t n) {
    REQUIRE(F.n_seed[t] < 6 && n, "seed of %s", target_name[t]);
    bytes b = {malloc(n), n};
    memcpy(b.p, p, n);
    F.seed[t][F.n_seed[t]++] = b;
}

/* crc32 (IEEE, reflected), the checksum every pdde file format ends its checked part with */
static uint32_t crc32_of(const uint8_t *p, size_t n) {
    uint32_t c = ~0u;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return ~c;
}

/* ---- seeds: a small model's session, its checkpoints, a table, a cluster, plans, tokens ---------- */

static void build_model(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    REQUIRE(pdde_context_init(&cp, &F.ctx) == PDDE_OK, "context");
    REQUIRE(pdde_graph_init(F.ctx, &F.g) == PDDE_OK, "graph");
    pdde_graph *g = F.g;
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){4, 3});
    pdde_tensor *t = pdde_input(g, "target", PDDE_I32, 1, (int64_t[]){4});
    pdde_tensor *w1 = pdde_param(g, "w1", 2, (int64_t[]){3, 5}, 0.3f), *b1 = pdde_param(g, "b1", 1, (int64_t[]){5}, 0.0f);
    pdde_tensor *w2 = pdde_param(g, "w2", 2, (int64_t[]){5, 2}, 0.3f);
    pdde_tensor *h = pdde_relu(g, pdde_bias_add(g, pdde_matmul(g, x, w1, 0, 0), b1));
    pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, h, w2, 0, 0), t);
    pdde_backward(g, loss);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    pdde_optimizer_adamw(g, &op);
    REQUIRE(pdde_graph_status(g) == PDDE_OK, "model: %s", pdde_last_error(F.ctx));
    REQUIRE(pdde_session_init(g, NULL, &F.s) == PDDE_OK, "session: %s", pdde_last_error(F.ctx));
    REQUIRE(pdde_session_run(F.s, PDDE_RUN_STEP) == PDDE_OK, "step: %s", pdde_last_error(F.ctx));
}

static void make_seeds(void) {
    char path[400];
    /* plans: every key of the text form at least once */
    static const char *const plans[] = {
        "dp=2,tp=1,pp=2,mb=4,zero=1,recompute=0",
        "dp=1,tp=2,pp=4,mb=8,zero=0,recompute=0,chunks=2,comm=bf16,sched=gpipe",
        "dp=2,pp=3,stages=2:1:3,rc=1:0:2",
        "dp=3,tp=1,pp=2,mb=2,zero=2,recompute=0,rc=1:0,blocks=1,shares=3:1:2,place=opencl:1-5",
        "dp=4,tp=2,pp=1,mb=1,zero=3,recompute=1,ep=dp:2"};
    for (int i = 0; i < 5; i++) add_seed(T_PLAN, plans[i], strlen(plans[i]));

    /* a cluster with every kind of field */
    pdde_cluster *c;
    REQUIRE(pdde_cluster_init("fuzz", &c) == PDDE_OK, "cluster");
    pdde_device_spec spec = {.name = "cpu:fuzz", .kind = PDDE_DEVICE_CPU, .backend = "cpu", .peak_flops = 1e12, .mem_bandwidth = 1e11};
    spec.n_gemm = 2, spec.gemm[0] = (pdde_gemm_point){PDDE_F32, 64, 64, 64, 1e10}, spec.gemm[1] = (pdde_gemm_point){PDDE_BF16, 512, 512, 512, 5e11};
    spec.n_curve[0] = 2, spec.curve[0][0] = (pdde_curve_point){4096, 1e-6}, spec.curve[0][1] = (pdde_curve_point){1 << 20, 1e-4};
    spec.contention[0] = 1.5;
    REQUIRE(pdde_cluster_add_spec(c, &spec) == 0, "spec");
    pdde_cluster_machine m = {.id = 0, .name = "node0", .cores = 8, .numa_nodes = 1, .host_memory = 1ull << 34, .l3_cache = 1 << 25,
                              .intra = {0, 0, PDDE_LINK_SHM, 2e10, 1e-6, -1}, .nic = {0, 0, PDDE_LINK_NET, 1.2e10, 5e-6, 0}};
    for (int k = 0; k < 2; k++) {
        m.id = k;
        REQUIRE(pdde_cluster_add_machine(c, &m) == k, "machine");
        for (int d = 0; d < 2; d++) REQUIRE(pdde_cluster_add_device(c, k, &(pdde_cluster_device){k * 2 + d, 0, 1ull << 32}) >= 0, "device");
    }
    REQUIRE(pdde_cluster_add_link(c, &(pdde_cluster_link){0, 1, PDDE_LINK_NVLINK, 3e11, 2e-6, 1}) >= 0, "link");
    REQUIRE(pdde_cluster_add_calib(c, &(pdde_collective_calib){PDDE_COLL_ALLREDUCE, PDDE_ALGO_AUTO, 4, 1, 2e-5, 1e10}) >= 0, "calib");
    char *json = NULL;
    REQUIRE(pdde_cluster_to_json(F.ctx, c, &json) == PDDE_OK, "to_json: %s", pdde_last_error(F.ctx));
    add_seed(T_CLUSTER, json, strlen(json));
    free(json), pdde_cluster_free(c);

    /* the model's checkpoints: a single file and a sharded directory */
    snprintf(path, sizeof path, "%s/ckpt", F.dir);
    REQUIRE(pdde_checkpoint_save(F.s, path, NULL) == PDDE_OK, "save: %s", pdde_last_error(F.ctx));
    bytes b = slurp(path);
    add_seed(T_CKPT, b.p, b.n), free(b.p);
    snprintf(path, sizeof path, "%s/sharded/", F.dir);
    REQUIRE(pdde_checkpoint_save(F.s, path, NULL) == PDDE_OK, "sharded save: %s", pdde_last_error(F.ctx));
    snprintf(path, sizeof path, "%s/sharded/manifest", F.dir);
    b = slurp(path);
    add_seed(T_MANIFEST, b.p, b.n), free(b.p);
    snprintf(path, sizeof path, "%s/sharded", F.dir);
    DIR *d = opendir(path);
    REQUIRE(d, "%s", path);
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.' && strcmp(e->d_name, "manifest")) snprintf(F.shard_name, sizeof F.shard_name, "%s", e->d_name);
    closedir(d);
    REQUIRE(F.shard_name[0], "no shard file in %s", path);
    snprintf(path, sizeof path, "%s/sharded/%s", F.dir, F.shard_name);
    b = slurp(path);
    add_seed(T_SHARD, b.p, b.n), free(b.p);

    /* a table with admitted rows and pending admissions */
    pdde_ps_table_params tp = PDDE_PS_TABLE_PARAMS_INIT;
    tp.dim = 4, tp.optimizer = PDDE_PS_ADAM, tp.init_std = 0.1f, tp.admit_after = 2;
    REQUIRE(pdde_ps_table_init(F.ctx, &tp, &F.table) == PDDE_OK, "table");
    uint64_t ids[5] = {1, 2, 3, 1ull << 40, 2};
    float rows[5 * 4];
    REQUIRE(pdde_ps_table_pull(F.table, 5, ids, rows) == PDDE_OK && pdde_ps_table_pull(F.table, 2, ids, rows) == PDDE_OK, "pull");
    snprintf(path, sizeof path, "%s/table", F.dir);
    REQUIRE(pdde_ps_table_save(F.table, path) == PDDE_OK, "table save: %s", pdde_last_error(F.ctx));
    b = slurp(path);
    add_seed(T_TABLE, b.p, b.n), free(b.p);

    /* a token file */
    char text_path[160];
    snprintf(text_path, sizeof text_path, "%s/text", F.dir);
    spill(text_path, "the quick brown fox jumps over the lazy dog\n", 44);
    snprintf(path, sizeof path, "%s/tokens", F.dir);
    REQUIRE(pdde_data_write_tokens(F.ctx, text_path, path) == PDDE_OK, "tokens: %s", pdde_last_error(F.ctx));
    b = slurp(path);
    add_seed(T_TOKENS, b.p, b.n), free(b.p);
    /* an llm.c shard: its header (magic, version, count), then GPT-2's ids as u16 */
    static uint8_t shard[1024 + 16];
    int32_t header[3] = {20240520, 1, 8};
    memcpy(shard, header, sizeof header);
    for (int i = 0; i < 8; i++) shard[1024 + 2 * i] = (uint8_t)(i * 37), shard[1024 + 2 * i + 1] = (uint8_t)i;
    add_seed(T_TOKENS, shard, sizeof shard);

    /* the session's snapshot, as a peer sends it */
    pdde_snapshot *sn = NULL;
    REQUIRE(pdde_snapshot_take(F.s, NULL, NULL, &sn) == PDDE_OK, "snapshot: %s", pdde_last_error(F.ctx));
    size_t sn_bytes = 0;
    const void *sn_data = pdde_snapshot_data(sn, &sn_bytes);
    REQUIRE(sn_data, "snapshot data: %s", pdde_last_error(F.ctx));
    add_seed(T_SNAPSHOT, sn_data, sn_bytes);
    pdde_snapshot_free(sn);

    /* Criteo TSV: a full line, one with empty fields and CRLF, one malformed */
    static const char criteo[] =
        "1\t5\t110\t\t16\t\t1\t0\t14\t7\t1\t\t306\t\t62770d79\te21f5d58\tafea442f\t945c7fcf\t38b02748\t6fcd6dcb\t3580aa21\t"
        "28808903\t46dedfa6\t2e027dc1\t0c7c4231\t95981d1f\t00c5ffb7\tbe4ee537\t8a0b74cc\t4cdc3efa\td20856aa\tb8170bba\t9512c20b\t"
        "c38e2f28\t14f65a5d\t25b1b089\td7c1fc0b\t7caf609c\t30436bfc\ted10571d\n"
        "0\t-1\t+0\t\t\t\t\t\t\t\t\t\t\t9223372036854775807\tffffffff\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t0\r\n"
        "2\tnot a line\n";
    add_seed(T_CRITEO, criteo, sizeof criteo - 1);

    /* safetensors: a small file of each dtype and shape kind; config.json: GPT-2's and LLaMA's (tests/data) */
    static const char st[] = "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                             "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[24,30]},\"h\":{\"dtype\":\"F16\",\"shape\":[1,1,2],"
                             "\"data_offsets\":[30,34]},\"i\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[34,42]}}";
    uint8_t file[sizeof st + 8 + 42] = {0};
    uint64_t len = sizeof st - 1;
    memcpy(file, &len, 8), memcpy(file + 8, st, len);
    for (int i = 0; i < 42; i++) file[8 + len + i] = (uint8_t)(i * 37);
    add_seed(T_SAFETENSORS, file, 8 + len + 42);
    static const char *const hf[][2] = {{"tests/data/hf_gpt2/config.json", "tests/data/hf_gpt2/tokenizer.json"},
                                         {"tests/data/hf_llama/config.json", "tests/data/hf_llama/tokenizer.json"},
                                         {"tests/data/hf_llama3/config.json", "tests/data/tokenize/llama3.json"},
                                         {"tests/data/hf_qwen2/config.json", "tests/data/tokenize/qwen2.json"}};
    for (int i = 0; i < 4; i++)
        for (int k = 0; k < 2 && hf[i][k]; k++) {
            bytes b = slurp(hf[i][k]);
            REQUIRE(b.n, "read %s (run from the repository root)", hf[i][k]);
            add_seed(k ? T_HF_TOKENIZER : T_HF_CONFIG, b.p, b.n);
            free(b.p);
        }
}

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    char path[400];
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (!lstat(path, &st) && S_ISDIR(st.st_mode)) remove_dir(path);
        else unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

static void cleanup(void) {
    if (F.dir[0]) remove_dir(F.dir);
}

static void setup(void) {
    if (F.ctx) return;
    snprintf(F.dir, sizeof F.dir, "%s/pdde_fuzz_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    REQUIRE(mkdtemp(F.dir), "mkdtemp %s", F.dir);
    atexit(cleanup);
    build_model();
    make_seeds();
}

/* ---- the readers ------------------------------------------------------------------------------ */

static void same_plan(const pdde_plan *a, const pdde_plan *b, const char *text) {
    bool same = a->dp == b->dp && a->tp == b->tp && a->pp == b->pp && a->micro == b->micro && a->zero == b->zero &&
                a->recompute == b->recompute && a->chunks == b->chunks && a->schedule == b->schedule && a->comm_dtype == b->comm_dtype &&
                a->stage_blocks == b->stage_blocks && a->place_first == b->place_first && a->place_last == b->place_last &&
                a->ep == b->ep && a->ep_dp == b->ep_dp && !strcmp(a->place, b->place) &&
                !memcmp(a->stage_first, b->stage_first, sizeof a->stage_first) &&
                !memcmp(a->recompute_layers, b->recompute_layers, sizeof a->recompute_layers) && !memcmp(a->shares, b->shares, sizeof a->shares);
    REQUIRE(same, "plan text '%s' prints as a plan that parses to another plan", text);
}

static void read_plan(const char *text) {
    pdde_plan a, b;
    if (pdde_plan_parse(text, &a) != PDDE_OK) {
        REQUIRE(a.why[0], "plan text '%s' refused without saying why", text);
        return;
    }
    F.accepted = true;
    char s1[1024], s2[1024];
    REQUIRE(pdde_plan_str(&a, s1, sizeof s1) < (int)sizeof s1, "plan text too long");
    REQUIRE(pdde_plan_parse(s1, &b) == PDDE_OK, "'%s' parsed, its printed form '%s' does not: %s", text, s1, b.why);
    same_plan(&a, &b, text);
    pdde_plan_str(&b, s2, sizeof s2);
    REQUIRE(!strcmp(s1, s2), "plan prints as '%s', then as '%s'", s1, s2);
}

static void read_cluster(const char *json) {
    pdde_cluster *c = NULL, *c2 = NULL;
    if (pdde_cluster_parse(F.ctx, json, &c) != PDDE_OK) return;
    F.accepted = true;
    char *j1 = NULL, *j2 = NULL;
    REQUIRE(pdde_cluster_to_json(F.ctx, c, &j1) == PDDE_OK, "a parsed cluster does not print: %s", pdde_last_error(F.ctx));
    REQUIRE(pdde_cluster_parse(F.ctx, j1, &c2) == PDDE_OK, "a cluster's printed form does not parse: %s\n%s", pdde_last_error(F.ctx), j1);
    REQUIRE(pdde_cluster_to_json(F.ctx, c2, &j2) == PDDE_OK && !strcmp(j1, j2), "a cluster prints differently after a round trip");
    free(j1), free(j2), pdde_cluster_free(c), pdde_cluster_free(c2);
}

/* Replaces the checksum a format keeps in its last 4 bytes. */
static void fix_tail_crc(uint8_t *p, size_t n) {
    if (n < 8) return;
    uint32_t crc = crc32_of(p, n - 4);
    memcpy(p + n - 4, &crc, 4);
}

static void load_checkpoint(const char *path) {
    /* (a file may hold NaN parameters: the step then fails, saying so) */
    if ((F.accepted = pdde_checkpoint_load(F.s, path, NULL) == PDDE_OK) && pdde_session_run(F.s, PDDE_RUN_STEP) != PDDE_OK)
        REQUIRE(pdde_last_error(F.ctx)[0], "a loaded checkpoint's step fails without a message");
}

static void read_single_checkpoint(uint8_t *p, size_t n, bool fix) {
    if (fix) fix_tail_crc(p, n);
    char path[400];
    snprintf(path, sizeof path, "%s/in.ckpt", F.dir);
    spill(path, p, n);
    load_checkpoint(path);
}

/* A manifest's checksum is its last line, "crc %08x" of the text before that line. */
static void write_manifest(const char *dir, const uint8_t *p, size_t n, bool fix) {
    char path[200];
    snprintf(path, sizeof path, "%s/manifest", dir);
    if (!fix) { spill(path, p, n); return; }
    size_t last = n;
    if (last && p[last - 1] == '\n') last--;
    while (last && p[last - 1] != '\n') last--;
    char *text = malloc(last + 16);
    memcpy(text, p, last);
    int k = snprintf(text + last, 16, "crc %08x\n", crc32_of((const uint8_t *)text, last));
    spill(path, text, last + (size_t)k);
    free(text);
}

/* dir holds a manifest (fixed or mutated) and the shard (fixed or mutated): the manifest's "file" line
 * is made to give the shard's size, so that a mutated shard is read, not refused for its length. */
static void read_sharded(const uint8_t *manifest, size_t mn, const uint8_t *shard, size_t sn, bool fix) {
    char dir[160], path[420];
    snprintf(dir, sizeof dir, "%s/in_sharded", F.dir);
    remove_dir(dir);
    mkdir(dir, 0700);
    snprintf(path, sizeof path, "%s/%s", dir, F.shard_name);
    spill(path, shard, sn);
    const bytes *m0 = &F.seed[T_MANIFEST][0];
    if (manifest == m0->p && sn != F.seed[T_SHARD][0].n) { /* the seed's manifest, its file size changed */
        char *text = malloc(m0->n + 300), want[300];
        size_t at = 0;
        snprintf(want, sizeof want, "file 0 %s %zu\n", F.shard_name, F.seed[T_SHARD][0].n);
        const char *hit = strstr((const char *)m0->p, want);
        if (hit) {
            at = (size_t)(hit - (const char *)m0->p);
            memcpy(text, m0->p, at);
            at += (size_t)sprintf(text + at, "file 0 %s %zu\n", F.shard_name, sn);
            size_t rest = m0->n - (size_t)(hit - (const char *)m0->p) - strlen(want);
            memcpy(text + at, hit + strlen(want), rest), at += rest;
            write_manifest(dir, (const uint8_t *)text, at, true);
        } else {
            write_manifest(dir, m0->p, m0->n, true);
        }
        free(text);
    } else {
        write_manifest(dir, manifest, mn, fix);
    }
    load_checkpoint(strcat(dir, "/"));
}

/* A shard's header checksum covers the header and the index: "PDDESHRD", ..., u64 index_bytes at 88. */
static void fix_shard_crc(uint8_t *p, size_t n) {
    uint64_t index_bytes;
    if (n < 104 + 4) return;
    memcpy(&index_bytes, p + 88, 8);
    if (index_bytes > n - 104 - 4) return;
    uint32_t crc = crc32_of(p, 104 + index_bytes);
    memcpy(p + 104 + index_bytes, &crc, 4);
}

static void read_table(uint8_t *p, size_t n, bool fix) {
    if (fix) fix_tail_crc(p, n);
    char path[400];
    snprintf(path, sizeof path, "%s/in.table", F.dir);
    spill(path, p, n);
    if ((F.accepted = pdde_ps_table_load(F.table, path) == PDDE_OK)) {
        float row[4];
        uint64_t id = 2;
        REQUIRE(pdde_ps_table_pull(F.table, 1, &id, row) == PDDE_OK, "a loaded table's pull fails: %s", pdde_last_error(F.ctx));
    }
}

static void read_tokens(const uint8_t *p, size_t n) {
    char path[400];
    snprintf(path, sizeof path, "%s/in.tokens", F.dir);
    spill(path, p, n);
    pdde_data *d = NULL;
    if (pdde_data_open(F.ctx, path, &d) != PDDE_OK) return;
    F.accepted = true;
    int32_t x[2 * 4], y[2 * 4];
    for (int k = 0; k < 3; k++)
        if (pdde_data_next_batch(d, 2, 4, 7, x, y) == PDDE_OK)
            for (int i = 0; i < 8; i++) /* (a token file's ~id: id, no target) */
                REQUIRE(x[i] >= 0 && (i % 4 == 3 || y[i] == x[i + 1] || y[i] == -1), "a target is not the next token, or -1 (position %d)", i);
    pdde_data_close(d);
}

/* A snapshot's bytes (a shard file's format) from a peer: restored into the session when accepted. */
static void read_snapshot(uint8_t *p, size_t n, bool fix) {
    if (fix && n >= 104) { /* (its u64 total size at 96, then the header's checksum) */
        uint64_t total = n;
        memcpy(p + 96, &total, 8);
    }
    if (fix) fix_shard_crc(p, n);
    pdde_snapshot *sn = NULL;
    if (pdde_snapshot_from_data(F.ctx, p, n, &sn) != PDDE_OK) {
        REQUIRE(!sn && pdde_last_error(F.ctx)[0], "a refused snapshot without a message, or one left allocated");
        return;
    }
    const pdde_snapshot *set[1] = {sn};
    if ((F.accepted = pdde_snapshot_restore(F.s, set, 1, NULL) == PDDE_OK) && pdde_session_run(F.s, PDDE_RUN_STEP) != PDDE_OK)
        REQUIRE(pdde_last_error(F.ctx)[0], "a restored snapshot's step fails without a message");
    pdde_snapshot_free(sn);
}

/* Criteo TSV lines through the recommender's reader (its messages off: the counts are checked). */
static void read_criteo(const uint8_t *p, size_t n) {
    char path[400];
    snprintf(path, sizeof path, "%s/in.tsv", F.dir);
    spill(path, p, n);
    long lines = 0;
    for (size_t i = 0; i < n; i++) lines += p[i] == '\n';
    lines += n && p[n - 1] != '\n';
    dlrm_reader r;
    REQUIRE(dlrm_reader_open(&r, path) == 0, "cannot open %s", path);
    r.messages = 10;
    dlrm_sample smp;
    long read = 0;
    while (dlrm_reader_next(&r, &smp)) {
        read++;
        REQUIRE(smp.label == 0 || smp.label == 1, "a sample's label is %d", smp.label);
        for (int j = 0; j < DLRM_DENSE; j++) REQUIRE(isfinite(smp.dense[j]) && smp.dense[j] >= 0, "feature %d is %g", j, smp.dense[j]);
        for (int j = 0; j < DLRM_SPARSE; j++)
            REQUIRE(smp.ids[j] == PDDE_SPARSE_NO_ID || smp.ids[j] >> 32 == (uint64_t)j, "id %d is %llx", j, (unsigned long long)smp.ids[j]);
    }
    F.accepted = read > 0;
    REQUIRE(read + r.malformed == lines, "%ld lines read as %ld samples and %ld malformed", lines, read, r.malformed);
    dlrm_reader_close(&r);
}

/* A safetensors file: opened, every tensor inside the file, each read as f32 or refused saying why */
static void read_safetensors(const uint8_t *p, size_t n) {
    char path[400], why[600];
    snprintf(path, sizeof path, "%s/in.safetensors", F.dir);
    spill(path, p, n);
    st_model m;
    if (st_open(path, &m, why, sizeof why)) {
        REQUIRE(why[0], "a refused safetensors file without a message");
        return;
    }
    F.accepted = true;
    for (int i = 0; i < m.n; i++) {
        const st_tensor *t = &m.t[i];
        REQUIRE(t->begin >= 0 && t->begin <= t->end && m.data_at[t->file] + t->end <= (int64_t)n, "tensor %s's bytes [%lld, %lld) past the file",
                t->name, (long long)t->begin, (long long)t->end);
        int64_t count = st_numel(t);
        if (t->dtype == ST_OTHER || count > 1 << 20) continue;
        float *v = malloc((size_t)count * sizeof *v + 1);
        why[0] = 0;
        if (st_read_f32(&m, t, v, why, sizeof why)) REQUIRE(why[0], "tensor %s not read, without a message", t->name);
        free(v);
    }
    st_close(&m);
}

/* A config.json: read into gpt.h's model, which gpt_build then takes or refuses saying why */
static void read_hf_config(const uint8_t *p, size_t n) {
    char why[600], path[400];
    snprintf(path, sizeof path, "%s/config.json", F.dir);
    spill(path, p, n);
    gpt_config c = {.ctx = 8, .batch = 1};
    int max_ctx = 0;
    if (gpt_hf_config(F.dir, &c, &max_ctx, why, sizeof why)) {
        REQUIRE(why[0], "a refused config.json without a message");
        return;
    }
    F.accepted = true;
    REQUIRE(c.layers >= 1 && c.heads >= 1 && c.width % c.heads == 0 && c.vocab >= 1 && max_ctx >= 1 && gpt_ffn(&c) >= 1, "config read as "
            "layers %d heads %d width %d vocab %d positions %d", c.layers, c.heads, c.width, c.vocab, max_ctx);
    if ((int64_t)c.layers * c.width * c.width > 1 << 22 || (int64_t)c.vocab * c.width > 1 << 22 || gpt_ffn(&c) * c.width > 1 << 22) return; /* (built only when small) */
    pdde_graph *g = NULL;
    gpt_model model;
    REQUIRE(pdde_graph_init(F.ctx, &g) == PDDE_OK, "graph");
    if (gpt_build(g, &c, &model)) REQUIRE(pdde_last_error(F.ctx)[0], "gpt_build refused a config.json's model without a message");
    pdde_graph_free(g);
}

/* A tokenizer.json: every token's bytes, each at most 255, and a text encoded to its ids; or refused
 * saying why */
static void read_hf_tokenizer(const uint8_t *p, size_t n) {
    char path[400], why[600] = "";
    snprintf(path, sizeof path, "%s/tokenizer.json", F.dir);
    spill(path, p, n);
    hf_tokenizer *t = NULL;
    if (hf_tokenizer_open(path, &t, why, sizeof why)) {
        REQUIRE(why[0] && !t, "a refused tokenizer.json without a message, or its tokens left allocated");
        return;
    }
    F.accepted = true;
    for (int i = 0; i < t->n; i++) REQUIRE(!t->bytes[i] || strlen(t->bytes[i]) <= 255, "token %d has %zu bytes", i, strlen(t->bytes[i]));
    static const char text[] = "It's 2024:  caf\xc3\xa9 cafe\xcc\x81 \xf0\x9f\x99\x82<|endoftext|><s>\xff\r\n\n  x";
    int32_t *ids = NULL;
    size_t count = 0;
    REQUIRE(!hf_tokenizer_encode(t, text, sizeof text - 1, 1, &ids, &count), "encoding a text ran out of memory");
    for (size_t i = 0; i < count; i++) REQUIRE(ids[i] >= 0 && ids[i] < t->n, "id %d of the text is outside the vocabulary's %d", ids[i], t->n);
    free(ids), hf_tokenizer_close(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    setup();
    F.accepted = false;
    if (size < 1) return 0;
    int target = data[0] % T_COUNT;
    bool fix = (data[0] / T_COUNT) % 8 != 0; /* mostly recompute the checksum; sometimes leave it wrong */
    size_t n = size - 1;
    uint8_t *p = malloc(n + 1);
    memcpy(p, data + 1, n), p[n] = 0;
    switch (target) {
    case T_PLAN: read_plan((const char *)p); break;
    case T_CLUSTER: read_cluster((const char *)p); break;
    case T_CKPT: read_single_checkpoint(p, n, fix); break;
    case T_MANIFEST: read_sharded(p, n, F.seed[T_SHARD][0].p, F.seed[T_SHARD][0].n, fix); break;
    case T_SHARD:
        if (fix) fix_shard_crc(p, n);
        read_sharded(F.seed[T_MANIFEST][0].p, F.seed[T_MANIFEST][0].n, p, n, true);
        break;
    case T_TABLE: read_table(p, n, fix); break;
    case T_TOKENS: read_tokens(p, n); break;
    case T_SNAPSHOT: read_snapshot(p, n, fix); break;
    case T_CRITEO: read_criteo(p, n); break;
    case T_SAFETENSORS: read_safetensors(p, n); break;
    case T_HF_CONFIG: read_hf_config(p, n); break;
    case T_HF_TOKENIZER: read_hf_tokenizer(p, n); break;
    }
    free(p);
    return 0;
}

#if defined(FUZZ_LIBFUZZER)
/* libFuzzer: the corpus folder gets the valid inputs (seed_<kind>_<k>), written anew at each start: a
 * corpus kept from an earlier run then has the seeds of a reader added since, with today's first byte. */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    setup();
    for (int i = 1; i < *argc; i++) {
        const char *dir = (*argv)[i];
        if (dir[0] == '-') continue;
        DIR *d = opendir(dir);
        if (!d) continue;
        closedir(d);
        for (int t = 0; t < T_COUNT; t++)
            for (int k = 0; k < F.n_seed[t]; k++) {
                char path[512];
                snprintf(path, sizeof path, "%s/seed_%s_%d", dir, target_name[t], k);
                uint8_t *buf = malloc(F.seed[t][k].n + 1);
                buf[0] = (uint8_t)(t + T_COUNT), memcpy(buf + 1, F.seed[t][k].p, F.seed[t][k].n);
                spill(path, buf, F.seed[t][k].n + 1);
                free(buf);
            }
        break;
    }
    return 0;
}
#else
/* The seeded driver: a valid input of a random kind, then 1 to 8 random edits of it: a byte changed
 * (to anything, or to 0, 0xff, 0x7f, 0x80, a digit, a separator), a byte inserted or removed, a run
 * of digits replaced by a large, negative or zero number, a cut, a chunk repeated. */
static uint64_t rng;
static uint64_t next(void) { rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17; return rng; }

static size_t mutate(uint8_t *p, size_t n, size_t cap) {
    static const uint8_t special[] = {0, 0xff, 0x7f, 0x80, '0', '9', ',', ':', '=', '-', ' ', '\n', '"', '{', '}', '['};
    static const char *const numbers[] = {"99999999999999999999", "-1", "0", "4294967296", "65536", "1e308", "nan", "-0"};
    int edits = 1 + (int)(next() % 8);
    for (int e = 0; e < edits && n; e++) {
        size_t at = next() % n;
        switch (next() % 7) {
        case 0: p[at] = (uint8_t)next(); break;
        case 1: p[at] = special[next() % sizeof special]; break;
        case 2: if (n < cap) memmove(p + at + 1, p + at, n - at), p[at] = special[next() % sizeof special], n++; break;
        case 3: memmove(p + at, p + at + 1, n - at - 1), n--; break;
        case 4: { /* a number in the text */
            size_t b = at;
            while (b < n && !(p[b] >= '0' && p[b] <= '9')) b++;
            size_t end = b;
            while (end < n && p[end] >= '0' && p[end] <= '9') end++;
            const char *num = numbers[next() % 8];
            size_t k = strlen(num);
            if (b < n && n - (end - b) + k <= cap) memmove(p + b + k, p + end, n - end), memcpy(p + b, num, k), n = n - (end - b) + k;
            break;
        }
        case 5: n = at + 1; break;
        case 6: {
            size_t len = 1 + next() % 16;
            if (at + len <= n && n + len <= cap) memmove(p + at + len, p + at, n - at), n += len;
            break;
        }
        }
    }
    return n;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    rng = seed * 0x9E3779B97F4A7C15ull | 1;
    setup();
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    long runs = 0, per[T_COUNT] = {0}, read[T_COUNT] = {0};
    for (;; runs++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > seconds) break;
        int target = (int)(next() % T_COUNT);
        const bytes *s = &F.seed[target][next() % (uint64_t)F.n_seed[target]];
        size_t cap = s->n + 64;
        uint8_t *buf = malloc(cap + 1);
        buf[0] = (uint8_t)(target + T_COUNT * (next() % 8 ? 1 : 0)); /* 1 in 8 with the checksum left as mutated */
        memcpy(buf + 1, s->p, s->n);
        size_t n = 1 + mutate(buf + 1, s->n, cap - 1);
        LLVMFuzzerTestOneInput(buf, n);
        free(buf), per[target]++, read[target] += F.accepted;
    }
    printf("fuzz_parse: %ld mutated inputs in %.0f s (seed %llu), no crash; read without error of each kind:", runs, seconds,
           (unsigned long long)seed);
    for (int k = 0; k < T_COUNT; k++) printf(" %s %ld of %ld%s", target_name[k], read[k], per[k], k < T_COUNT - 1 ? "," : "\n");
    pdde_ps_table_free(F.table), pdde_session_free(F.s), pdde_graph_free(F.g), pdde_context_free(F.ctx);
    for (int k = 0; k < T_COUNT; k++)
        for (int i = 0; i < F.n_seed[k]; i++) free(F.seed[k][i].p);
    printf("1 passed, 0 failed\n");
    return 0;
}
#endif
