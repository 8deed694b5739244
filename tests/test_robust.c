/* test_robust — bad input must not crash, hang or silently corrupt: checkpoints that repeat or omit a
 * tensor, a peer's snapshot with a block past int64 or a rank past int, paths that are not regular files (directories, FIFOs, devices), zero-sized and absurd
 * shapes, non-finite hyperparameters, losses and gradients, cross-entropy targets past the classes on a
 * device, plans that do not fit in memory; and threads sharing a context that fail at once, each of which must read its own error message. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char tmpdir[256];

/* A hang is a failure: the alarm ends the test with a message instead of blocking the suite. */
static const char *alarm_what = "";
static void on_alarm(int sig) {
    (void)sig;
    fprintf(stderr, "FAIL: %s did not return within the time limit (blocked)\n", alarm_what);
    printf("%d passed, %d failed\n", test_passed, test_failed + 1);
    _exit(1);
}
#define WITHIN(seconds, what, stmt) do { alarm_what = (what); alarm(seconds); stmt; alarm(0); } while (0)

static int contains(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

/* A tiny model: y = x @ weight + bias, loss = mean(y * y), AdamW with clipping. */
typedef struct {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    pdde_tensor *x, *w, *b, *loss;
} tiny;

static pdde_status tiny_init(tiny *t, const pdde_optimizer_params *op) {
    memset(t, 0, sizeof *t);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_status st = pdde_context_init(&cp, &t->ctx);
    if (st) return st;
    pdde_graph_init(t->ctx, &t->g);
    t->x = pdde_input(t->g, "x", PDDE_F32, 2, (int64_t[]){4, 3});
    t->w = pdde_param(t->g, "weight", 2, (int64_t[]){3, 2}, 0.5f);
    t->b = pdde_param(t->g, "bias", 1, (int64_t[]){2}, 0.0f);
    pdde_tensor *y = pdde_bias_add(t->g, pdde_matmul(t->g, t->x, t->w, 0, 0), t->b);
    t->loss = pdde_mean(t->g, pdde_mul(t->g, y, y), -1, 0);
    if ((st = pdde_backward(t->g, t->loss))) return st;
    pdde_optimizer_params p = PDDE_OPTIMIZER_PARAMS_INIT;
    if (op) p = *op;
    if ((st = pdde_optimizer_adamw(t->g, &p))) return st;
    return pdde_session_init(t->g, NULL, &t->s);
}

static void tiny_free(tiny *t) {
    pdde_session_free(t->s);
    pdde_graph_free(t->g);
    pdde_context_free(t->ctx);
}

static pdde_status tiny_step(tiny *t, float scale) {
    float x[12];
    for (int i = 0; i < 12; i++) x[i] = scale * (float)(i % 5 - 2);
    pdde_status st = pdde_session_write(t->s, t->x, x, sizeof x);
    return st ? st : pdde_session_run(t->s, PDDE_RUN_STEP);
}

/* Every tensor a checkpoint holds, read into one buffer (to see that a failed load changed nothing). */
static size_t snapshot(tiny *t, float *out, size_t cap) {
    size_t n = 0;
    for (int i = 0; i < pdde_graph_tensor_count(t->g); i++) {
        pdde_tensor *x = pdde_graph_tensor(t->g, i);
        if (x->op != PDDE_OP_NONE || !(x->flags & (PDDE_TENSOR_PARAM | PDDE_TENSOR_STATE))) continue;
        size_t k = (size_t)pdde_tensor_numel(x);
        if (n + k > cap) break;
        pdde_session_read(t->s, x, out + n, k * 4);
        n += k;
    }
    return n;
}

/* ------------------------------------------------------------------------------------------------
 * Checkpoints: a record repeated or left out */

static uint32_t crc32_of(const unsigned char *p, size_t n) {
    uint32_t crc = 0xffffffffu;
    while (n--) {
        crc ^= *p++;
        for (int k = 0; k < 8; k++) crc = crc & 1 ? 0xEDB88320u ^ (crc >> 1) : crc >> 1;
    }
    return ~crc;
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    if (b && fread(b, 1, *n, f) != *n) free(b), b = NULL;
    fclose(f);
    return b;
}

/* Writes a checkpoint made of the header of `file` and the records listed in `pick` (indices into the
 * file's records, in that order), with the count and the CRC fixed: a well-formed file. */
static void write_records(const char *path, const unsigned char *file, size_t size, const int *pick, int n_pick) {
    uint32_t count, version;
    memcpy(&count, file + 12, 4), memcpy(&version, file + 8, 4);
    size_t header = 48 + (version >= 3 ? 28 : 0), at = header, off[64], len[64]; /* (3 added the schedule) */
    for (uint32_t k = 0; k < count && k < 64; k++) {
        uint16_t nl, al;
        uint64_t nb;
        off[k] = at;
        memcpy(&nl, file + at, 2), at += 2 + nl;
        uint8_t ndim = file[at + 1];
        at += 2 + 8u * ndim;
        memcpy(&al, file + at, 2), at += 2 + al;
        memcpy(&nb, file + at, 8), at += 8 + nb;
        len[k] = at - off[k];
    }
    unsigned char *out = malloc(size * 2);
    memcpy(out, file, header);
    size_t w = header;
    for (int i = 0; i < n_pick; i++) memcpy(out + w, file + off[pick[i]], len[pick[i]]), w += len[pick[i]];
    uint32_t n = (uint32_t)n_pick, crc;
    memcpy(out + 12, &n, 4);
    crc = crc32_of(out, w);
    memcpy(out + w, &crc, 4), w += 4;
    FILE *f = fopen(path, "wb");
    fwrite(out, 1, w, f);
    fclose(f);
    free(out);
}

static void test_checkpoint_records(void) {
    tiny t;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.clip_norm = 1.0f;
    CHECK(tiny_init(&t, &op) == PDDE_OK, "tiny model: %s", pdde_last_error(t.ctx));
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s/tiny.ckpt", tmpdir);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", tmpdir);
    tiny_step(&t, 1.0f);
    CHECK(pdde_checkpoint_save(t.s, path, NULL) == PDDE_OK, "save: %s", pdde_last_error(t.ctx));
    size_t size = 0;
    unsigned char *file = slurp(path, &size);
    uint32_t count;
    memcpy(&count, file + 12, 4);
    CHECK(count == 6, "weight, bias and their two Adam moments: %u records", count);
    /* record 0 is the weight, 1 the bias (creation order) */
    tiny_step(&t, 2.0f); /* the model moves away from the file */
    float before[64], after[64];
    size_t n = snapshot(&t, before, 64);

    write_records(bad, file, size, (int[]){0, 0, 2, 3, 4, 5}, 6); /* the weight twice, the bias never */
    pdde_status st = pdde_checkpoint_load(t.s, bad, NULL);
    CHECK(st != PDDE_OK && contains(pdde_last_error(t.ctx), "weight") && contains(pdde_last_error(t.ctx), "twice"),
          "a repeated record is refused naming it: %s: %s", pdde_status_str(st), pdde_last_error(t.ctx));
    snapshot(&t, after, 64);
    CHECK(memcmp(before, after, n * 4) == 0, "a refused checkpoint changed the model");

    write_records(bad, file, size, (int[]){0, 2, 3, 4, 5}, 5); /* the bias left out */
    st = pdde_checkpoint_load(t.s, bad, NULL);
    CHECK(st == PDDE_ERR_MISMATCH && contains(pdde_last_error(t.ctx), "bias") && contains(pdde_last_error(t.ctx), "missing"),
          "an omitted tensor is refused naming it: %s: %s", pdde_status_str(st), pdde_last_error(t.ctx));
    snapshot(&t, after, 64);
    CHECK(memcmp(before, after, n * 4) == 0, "a refused checkpoint changed the model");

    /* the records in another order are a good file: it loads and restores the saved values */
    write_records(bad, file, size, (int[]){5, 4, 3, 2, 1, 0}, 6);
    st = pdde_checkpoint_load(t.s, bad, NULL);
    CHECK(st == PDDE_OK, "records in any order load: %s", pdde_last_error(t.ctx));
    snapshot(&t, after, 64);
    CHECK(memcmp(before, after, n * 4) != 0, "the load restored the saved values");
    free(file);
    tiny_free(&t);
}

/* ------------------------------------------------------------------------------------------------
 * Paths that are not regular files */

static void test_not_regular_files(void) {
    tiny t;
    CHECK(tiny_init(&t, NULL) == PDDE_OK, "tiny model: %s", pdde_last_error(t.ctx));
    char fifo[512], fifo_ckpt[512];
    snprintf(fifo, sizeof fifo, "%s/fifo", tmpdir);
    snprintf(fifo_ckpt, sizeof fifo_ckpt, "%s/fifo.ckpt", tmpdir);
    CHECK(mkfifo(fifo, 0600) == 0 && mkfifo(fifo_ckpt, 0600) == 0, "mkfifo");
    pdde_status st;
    pdde_data *d = NULL;
    WITHIN(10, "checkpoint load of a directory", st = pdde_checkpoint_load(t.s, tmpdir, NULL));
    /* (a directory is a sharded checkpoint: one without a manifest holds none) */
    CHECK(st == PDDE_ERR_NOT_FOUND && contains(pdde_last_error(t.ctx), "directory without a manifest"), "a directory without a checkpoint is refused as such: %s: %s",
          pdde_status_str(st), pdde_last_error(t.ctx));
    WITHIN(10, "checkpoint load of a FIFO", st = pdde_checkpoint_load(t.s, fifo, NULL));
    CHECK(st == PDDE_ERR_IO && contains(pdde_last_error(t.ctx), "FIFO"), "a FIFO is refused without blocking: %s: %s",
          pdde_status_str(st), pdde_last_error(t.ctx));
    WITHIN(10, "checkpoint load of /dev/zero", st = pdde_checkpoint_load(t.s, "/dev/zero", NULL));
    CHECK(st == PDDE_ERR_IO && contains(pdde_last_error(t.ctx), "character device"), "a device is refused: %s: %s",
          pdde_status_str(st), pdde_last_error(t.ctx));
    WITHIN(10, "data open of a directory", st = pdde_data_open(t.ctx, tmpdir, &d));
    CHECK(st == PDDE_ERR_IO && !d && contains(pdde_last_error(t.ctx), "directory"), "data: a directory is refused: %s: %s",
          pdde_status_str(st), pdde_last_error(t.ctx));
    WITHIN(10, "data open of a FIFO", st = pdde_data_open(t.ctx, fifo, &d));
    CHECK(st == PDDE_ERR_IO && !d && contains(pdde_last_error(t.ctx), "FIFO"), "data: a FIFO is refused without blocking: %s: %s",
          pdde_status_str(st), pdde_last_error(t.ctx));
    /* a save over a FIFO would rename a regular file over it (or, for a device node, replace the device) */
    struct stat sb;
    WITHIN(10, "checkpoint save over a FIFO", st = pdde_checkpoint_save(t.s, fifo_ckpt, NULL));
    CHECK(st == PDDE_ERR_IO && contains(pdde_last_error(t.ctx), "FIFO"), "a save over a FIFO is refused: %s: %s",
          pdde_status_str(st), pdde_last_error(t.ctx));
    CHECK(stat(fifo_ckpt, &sb) == 0 && S_ISFIFO(sb.st_mode), "the FIFO is still there");
    char tmp_fifo[600], path[512];
    snprintf(path, sizeof path, "%s/t.ckpt", tmpdir);
    snprintf(tmp_fifo, sizeof tmp_fifo, "%s.tmp", path);
    mkfifo(tmp_fifo, 0600); /* the temporary file's name taken by a FIFO: refused, not blocked on */
    WITHIN(10, "checkpoint save through a FIFO temporary", st = pdde_checkpoint_save(t.s, path, NULL));
    CHECK(st == PDDE_ERR_IO && contains(pdde_last_error(t.ctx), "FIFO"), "a FIFO in the temporary's place is refused: %s: %s",
          pdde_status_str(st), pdde_last_error(t.ctx));
    unlink(tmp_fifo);
    CHECK(pdde_checkpoint_save(t.s, path, NULL) == PDDE_OK && pdde_checkpoint_load(t.s, path, NULL) == PDDE_OK,
          "a regular file still saves and loads: %s", pdde_last_error(t.ctx));
    unlink(path), unlink(fifo), unlink(fifo_ckpt);
    tiny_free(&t);
}


/* ------------------------------------------------------------------------------------------------
 * Shapes and arguments: zero-sized dims are refused where a tensor is made (they divided by zero in
 * the backward pass), absurd sizes and NULLs give errors, threads are capped */

static void test_zero_and_absurd_shapes(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_context *ctx;
    pdde_graph *g;
    pdde_context_init(&cp, &ctx);
    /* the crash of the report: a batched matmul over a zero-sized inner dim, differentiated (its weight
     * gradient flattens the rows, which divided by the zero last dim). Empty tensors are legal: y is
     * the bias broadcast, the loss mean(bias^2), the bias gradient bias / 2 (mean over 4 columns x 2) */
    pdde_graph_init(ctx, &g);
    pdde_tensor *a = pdde_input(g, "a", PDDE_F32, 3, (int64_t[]){2, 3, 0});
    pdde_tensor *w = pdde_param(g, "w", 2, (int64_t[]){0, 4}, 0.1f);
    pdde_tensor *bias = pdde_param(g, "bias", 1, (int64_t[]){4}, 0.5f);
    pdde_tensor *y = pdde_bias_add(g, pdde_matmul(g, a, w, 0, 0), bias);
    pdde_tensor *loss = pdde_mean(g, pdde_mul(g, y, y), -1, 0);
    CHECK(pdde_backward(g, loss) == PDDE_OK, "backward through an empty matmul: %s", pdde_last_error(ctx));
    pdde_optimizer_params sgd = PDDE_OPTIMIZER_PARAMS_INIT;
    sgd.lr = 0.5f;
    CHECK(pdde_optimizer_sgd(g, &sgd) == PDDE_OK, "optimizer: %s", pdde_last_error(ctx));
    pdde_session *s = NULL;
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "session with empty tensors: %s", pdde_last_error(ctx));
    float b0[4], b1[4], expect = 0;
    if (s) {
        pdde_session_read(s, bias, b0, sizeof b0);
        for (int i = 0; i < 4; i++) expect += b0[i] * b0[i] / 4;
        CHECK(pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK, "a step: %s", pdde_last_error(ctx));
        CHECK(test_close(pdde_session_loss(s), expect, 1e-5, 1e-7), "loss %g, expected mean(bias^2) = %g", pdde_session_loss(s), expect);
        pdde_session_read(s, bias, b1, sizeof b1);
        for (int i = 0; i < 4; i++) /* d/db mean over 24 of b^2 = 6 * 2b / 24 */
            CHECK(test_close(b1[i], b0[i] - 0.5f * b0[i] / 2, 1e-5, 1e-7), "bias[%d] %g after SGD, expected %g", i, b1[i], b0[i] - 0.25f * b0[i]);
    }
    pdde_session_free(s);
    pdde_graph_free(g);

    /* negative dims, and an attention whose head dim is empty (its 1/sqrt(D) scale would be infinite) */
    pdde_graph_init(ctx, &g);
    CHECK(!pdde_input(g, "i", PDDE_F32, 2, (int64_t[]){-3, 2}) && pdde_graph_status(g) == PDDE_ERR_SHAPE &&
          contains(pdde_last_error(ctx), "negative"), "a negative dim is refused: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    pdde_graph_init(ctx, &g);
    pdde_tensor *q = pdde_input(g, "q", PDDE_F32, 4, (int64_t[]){1, 2, 3, 0});
    CHECK(!pdde_attention(g, q, q, q) && pdde_graph_status(g) == PDDE_ERR_SHAPE, "attention with D = 0 is refused: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    /* a document attention's starts: i32 [B, T] of its q, named with what is expected */
    const int64_t bt[][2] = {{1, 3}, {2, 3}, {1, 4}};
    for (int i = 0; i < 4; i++) {
        pdde_graph_init(ctx, &g);
        q = pdde_input(g, "q", PDDE_F32, 4, (int64_t[]){2, 2, 3, 4});
        pdde_tensor *qkv = pdde_input(g, "qkv", PDDE_F32, 3, (int64_t[]){2, 3, 24});
        pdde_tensor *st = i < 3 ? pdde_input(g, "st", PDDE_I32, 2, bt[i]) : pdde_input(g, "st", PDDE_F32, 2, bt[1]);
        bool refused = i == 1 ? pdde_attention_docs(g, q, q, q, st) && pdde_attention_qkv_docs(g, qkv, 2, st) && pdde_graph_status(g) == PDDE_OK
                              : !pdde_attention_docs(g, q, q, q, st) && pdde_graph_status(g) == PDDE_ERR_SHAPE &&
                                    contains(pdde_last_error(ctx), "starts st must be i32 [B, T] = [2, 3]");
        CHECK(refused, "attention starts case %d (%s [%lld, %lld]): %s", i, i < 3 ? "i32" : "f32", (long long)st->shape[0],
              (long long)st->shape[1], i == 1 ? "taken" : pdde_last_error(ctx));
        pdde_graph_free(g);
    }
    pdde_graph_init(ctx, &g);
    pdde_tensor *qkv = pdde_input(g, "qkv", PDDE_F32, 3, (int64_t[]){2, 3, 24});
    CHECK(!pdde_attention_qkv_docs(g, qkv, 2, pdde_input(g, "st", PDDE_I32, 2, (int64_t[]){2, 4})) && pdde_graph_status(g) == PDDE_ERR_SHAPE &&
              !pdde_attention_qkv_docs(g, qkv, 2, NULL),
          "the packed form's starts of another T refused: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    pdde_graph_init(ctx, &g);
    q = pdde_input(g, "q", PDDE_F32, 4, (int64_t[]){2, 2, 3, 4});
    CHECK(!pdde_attention_docs(g, q, q, q, NULL) && pdde_graph_status(g) == PDDE_ERR_INVALID_ARG && contains(pdde_last_error(ctx), "NULL starts"),
          "NULL starts refused: %s", pdde_last_error(ctx));
    pdde_graph_free(g);

    /* sizes whose byte count overflows, NULL arguments, non-finite constants */
    pdde_graph_init(ctx, &g);
    int64_t huge = (int64_t)1 << 40;
    CHECK(!pdde_input(g, "h", PDDE_F32, 3, (int64_t[]){huge, huge, huge}) && pdde_graph_status(g) == PDDE_ERR_SHAPE,
          "2^120 elements are refused: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){4, 6});
    CHECK(!pdde_slice(g, x, 1, INT64_MAX, 2) && pdde_graph_status(g) == PDDE_ERR_SHAPE, "a slice past the end (overflowing start + len)");
    pdde_graph_free(g);
    pdde_graph_init(ctx, &g);
    x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){4, 6});
    CHECK(!pdde_reshape(g, x, 2, NULL) && !pdde_permute(g, x, NULL) && !pdde_concat(g, 2, NULL, 0) && pdde_graph_status(g) != PDDE_OK,
          "NULL shapes and lists are refused");
    pdde_graph_free(g);
    pdde_graph_init(ctx, &g);
    x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){4, 6});
    CHECK(!pdde_scale(g, x, NAN) && pdde_graph_status(g) == PDDE_ERR_INVALID_ARG, "a NaN scale is refused");
    pdde_graph_free(g);
    pdde_graph_init(ctx, &g);
    CHECK(!pdde_dropout(g, pdde_input(g, "x", PDDE_F32, 1, (int64_t[]){4}), NAN, 1) && pdde_graph_status(g) == PDDE_ERR_INVALID_ARG,
          "a NaN dropout rate is refused");
    CHECK(pdde_graph_set_recompute(g, INT32_MAX, 1) != PDDE_OK, "a layer id of 2^31 - 1 is refused");
    pdde_graph_free(g);
    CHECK(!pdde_input(NULL, "x", PDDE_F32, 1, (int64_t[]){4}) && pdde_graph_tensor_count(NULL) == 0 && !pdde_graph_find(NULL, "x"),
          "a NULL graph is an error, not a crash");

    /* the example model: heads that do not divide the width */
    gpt_config bad = {.vocab = 32, .ctx = 8, .layers = 1, .heads = 0, .width = 16, .batch = 2};
    gpt_model m;
    pdde_graph_init(ctx, &g);
    CHECK(gpt_build(g, &bad, &m) == PDDE_ERR_INVALID_ARG && contains(pdde_last_error(ctx), "heads"), "gpt with 0 heads: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    pdde_context_free(ctx);

    cp.n_threads = 100000; /* thousands of threads exhaust the process's limit (a device runtime then aborts) */
    CHECK(pdde_context_init(&cp, &ctx) == PDDE_OK, "context");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK(pdde_context_thread_count(ctx) >= 1 && pdde_context_thread_count(ctx) <= 4 * cores, "threads capped: %d for %ld cores",
          pdde_context_thread_count(ctx), cores);
    pdde_context_free(ctx);
}

/* The tools refuse bad arguments with exit status 2 and a message naming the argument. */
static char build_dir[256];

static void test_tool_arguments(void) {
    static const char *const cases[][2] = {
        {"pdde-plan --dp -1", "--dp"}, {"pdde-plan --zero 5", "--zero"}, {"pdde-plan --width 0", "--width"},
        {"pdde-plan --heads 0", "--heads"}, {"pdde-plan --tp x", "--tp"}, {"gpt --lr nan", "--lr"},
        {"gpt --weight-decay nan", "--weight-decay"}, {"gpt --zero 5", "--zero"}, {"gpt --dp -1", "--dp"},
    };
    char exe[300];
    snprintf(exe, sizeof exe, "%s/pdde-plan", build_dir);
    if (access(exe, X_OK) != 0) { printf("skip: tool arguments (no %s)\n", exe); return; }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char cmd[600], out[4096] = "";
        snprintf(cmd, sizeof cmd, "%s/%s --steps 0 2>&1 >/dev/null", build_dir, cases[k][0]);
        FILE *p = popen(cmd, "r");
        size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
        out[n] = 0;
        int rc = p ? pclose(p) : -1;
        CHECK(WIFEXITED(rc) && WEXITSTATUS(rc) == 2 && contains(out, cases[k][1]), "%s: exit status %d, message '%s'", cases[k][0],
              WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out);
    }
}

/* ------------------------------------------------------------------------------------------------
 * Non-finite values: hyperparameters refused when the optimizer is made; a NaN or infinity in the
 * loss or the gradient norm stops the step before any update, naming where it came from */

static void test_nonfinite_hyperparameters(void) {
    static const char *const fields[] = {"lr", "weight_decay", "clip_norm", "eps", "beta1", "beta2", "momentum", "min_lr_ratio"};
    for (int k = 0; k < 8; k++)
        for (int v = 0; v < 3; v++) {
            float bad = v == 0 ? NAN : v == 1 ? INFINITY : -0.5f;
            pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
            float *f[] = {&op.lr, &op.weight_decay, &op.clip_norm, &op.eps, &op.beta1, &op.beta2, &op.momentum, &op.min_lr_ratio};
            *f[k] = bad;
            tiny t;
            pdde_status st = tiny_init(&t, &op);
            CHECK(st == PDDE_ERR_INVALID_ARG && contains(pdde_last_error(t.ctx), fields[k]), "%s = %g: %s: %s", fields[k], bad,
                  pdde_status_str(st), pdde_last_error(t.ctx));
            tiny_free(&t);
        }
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.beta2 = 1.0f; /* v would never forget */
    tiny t;
    CHECK(tiny_init(&t, &op) == PDDE_ERR_INVALID_ARG && contains(pdde_last_error(t.ctx), "beta2"), "beta2 = 1: %s", pdde_last_error(t.ctx));
    tiny_free(&t);
    /* cosine without total_steps (or with all of them warmup) would never decay */
    for (int k = 0; k < 2; k++) {
        op = (pdde_optimizer_params)PDDE_OPTIMIZER_PARAMS_INIT;
        op.schedule = PDDE_LR_COSINE, op.warmup_steps = k ? 10 : 0, op.total_steps = k ? 10 : 0;
        CHECK(tiny_init(&t, &op) == PDDE_ERR_INVALID_ARG && contains(pdde_last_error(t.ctx), "total_steps"), "cosine, total_steps %lld: %s",
              (long long)op.total_steps, pdde_last_error(t.ctx));
        tiny_free(&t);
    }
    op = (pdde_optimizer_params)PDDE_OPTIMIZER_PARAMS_INIT;
    op.schedule = PDDE_LR_COSINE, op.warmup_steps = 10, op.total_steps = 11;
    CHECK(tiny_init(&t, &op) == PDDE_OK, "cosine, 10 warmup of 11 steps: %s", pdde_last_error(t.ctx));
    tiny_free(&t);
}

/* Two sessions of one process under PDDE_TRACE: each trace is kept (the second numbered), not overwritten. */
static bool trace_has_events(const char *path) {
    FILE *f = fopen(path, "r");
    char line[512];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f)) found = strstr(line, "\"cat\":\"op\"") != NULL;
    if (f) fclose(f);
    return found;
}

static void test_trace_two_sessions(void) {
    char path[128], second[160];
    snprintf(path, sizeof path, "/tmp/pdde_test_robust_trace.%d.json", (int)getpid());
    snprintf(second, sizeof second, "%s.session2", path);
    unlink(path), unlink(second);
    setenv("PDDE_TRACE", path, 1);
    tiny a, b;
    pdde_status sa = tiny_init(&a, NULL), sb = tiny_init(&b, NULL);
    unsetenv("PDDE_TRACE");
    if (!sa) sa = tiny_step(&a, 1.0f);
    tiny_free(&a); /* writes its trace */
    if (!sb) sb = tiny_step(&b, 1.0f);
    tiny_free(&b);
    CHECK(!sa && !sb && trace_has_events(path) && trace_has_events(second), "both traces kept: %s %d, %s %d", path, trace_has_events(path),
          second, trace_has_events(second));
    unlink(path), unlink(second);
}

static void test_nonfinite_step(void) {
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.clip_norm = 1.0f, op.lr = 0.01f;
    tiny t, ref;
    CHECK(tiny_init(&t, &op) == PDDE_OK && tiny_init(&ref, &op) == PDDE_OK, "tiny models");
    float before[64], after[64], x[12];
    size_t n = snapshot(&t, before, 64);

    /* a NaN in an input: the loss is NaN; no parameter or optimizer state changes */
    for (int i = 0; i < 12; i++) x[i] = (float)(i % 5 - 2);
    x[5] = NAN;
    pdde_session_write(t.s, t.x, x, sizeof x);
    pdde_status st = pdde_session_run(t.s, PDDE_RUN_STEP);
    CHECK(st == PDDE_ERR_NONFINITE && contains(pdde_last_error(t.ctx), "loss") && contains(pdde_last_error(t.ctx), "input x[5]"),
          "a NaN input stops the step naming it: %s: %s", pdde_status_str(st), pdde_last_error(t.ctx));
    snapshot(&t, after, 64);
    CHECK(memcmp(before, after, n * 4) == 0, "the failed step changed parameters or optimizer state");
    CHECK(pdde_session_step(t.s) == 0, "no step was counted: %lld", (long long)pdde_session_step(t.s));

    /* a NaN in a gradient with a finite loss: the clipping norm is NaN */
    float grad[6] = {0, 0, NAN, 0, 0, 0};
    CHECK(pdde_session_write(t.s, t.w->grad, grad, sizeof grad) == PDDE_OK, "write the weight's gradient");
    st = tiny_step(&t, 1.0f);
    CHECK(st == PDDE_ERR_NONFINITE && contains(pdde_last_error(t.ctx), "norm") && contains(pdde_last_error(t.ctx), "gradient weight.grad[2]"),
          "a NaN gradient stops the step naming it: %s: %s", pdde_status_str(st), pdde_last_error(t.ctx));
    snapshot(&t, after, 64);
    CHECK(memcmp(before, after, n * 4) == 0, "the failed step changed parameters or optimizer state");

    /* the failed steps left nothing behind: the next good step is the first step of a fresh model */
    CHECK(tiny_step(&t, 1.0f) == PDDE_OK && tiny_step(&ref, 1.0f) == PDDE_OK, "good steps: %s", pdde_last_error(t.ctx));
    float wt[6], wr[6];
    pdde_session_read(t.s, t.w, wt, sizeof wt), pdde_session_read(ref.s, ref.w, wr, sizeof wr);
    CHECK(memcmp(wt, wr, sizeof wt) == 0 && pdde_session_loss(t.s) == pdde_session_loss(ref.s) && pdde_session_step(t.s) == 1,
          "after two refused steps a good one equals a fresh model's first (loss %g vs %g)", pdde_session_loss(t.s), pdde_session_loss(ref.s));
    tiny_free(&t), tiny_free(&ref);
}

/* An infinity made inside the graph from finite inputs: (x @ w * 1e30)^2 overflows. The loss check
 * reports the loss; PDDE_CHECK_NONFINITE=1 names the node that made it. */
static void test_nonfinite_first_node(void) {
    for (int debug = 0; debug < 2; debug++) {
        if (debug) setenv("PDDE_CHECK_NONFINITE", "1", 1);
        pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
        cp.backends = "cpu", cp.n_threads = 1;
        pdde_context *ctx;
        pdde_graph *g;
        pdde_session *s = NULL;
        pdde_context_init(&cp, &ctx);
        pdde_graph_init(ctx, &g);
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){4, 3});
        pdde_tensor *w = pdde_param(g, "w", 2, (int64_t[]){3, 2}, -1.0f); /* ones */
        pdde_tensor *big = pdde_scale(g, pdde_matmul(g, x, w, 0, 0), 1e30f);
        pdde_tensor *sq = pdde_mul(g, big, big);
        pdde_tensor_set_name(sq, "overflow");
        pdde_tensor *loss = pdde_mean(g, sq, -1, 0);
        pdde_backward(g, loss);
        pdde_optimizer_sgd(g, NULL);
        CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "session: %s", pdde_last_error(ctx));
        float xv[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
        pdde_session_write(s, x, xv, sizeof xv);
        pdde_status st = pdde_session_run(s, PDDE_RUN_STEP);
        const char *e = pdde_last_error(ctx);
        printf("%s\n", e);
        if (debug)
            CHECK(st == PDDE_ERR_NONFINITE && contains(e, "overflow[0] = inf") && contains(e, "first non-finite"),
                  "PDDE_CHECK_NONFINITE names the node: %s: %s", pdde_status_str(st), e);
        else
            CHECK(st == PDDE_ERR_NONFINITE && contains(e, "loss") && contains(e, "PDDE_CHECK_NONFINITE"), "the loss is inf: %s: %s",
                  pdde_status_str(st), e);
        float wv[6];
        pdde_session_read(s, w, wv, sizeof wv);
        CHECK(wv[0] == 1 && wv[5] == 1, "w unchanged: %g", wv[0]);
        pdde_session_free(s);
        pdde_graph_free(g);
        pdde_context_free(ctx);
        unsetenv("PDDE_CHECK_NONFINITE");
    }
}

/* ------------------------------------------------------------------------------------------------
 * A cross-entropy target >= V on a device: its kernel makes the loss NaN and the step's check of the loss
 * names the op, the target and its position, as the CPU's kernel does (also the fused loss and dlogits, and
 * under f16 loss scaling, where a NaN loss is otherwise an overflow that skips the step);
 * an embedding id outside its table likewise */

static void test_cross_entropy_targets_on_devices(void) {
    static const char *const backends[] = {"opencl", "cuda"};
    for (int b = 0; b < 2; b++)
        for (int variant = 0; variant < 3; variant++) {
            /* f16: under loss scaling, where a non-finite loss is an overflow that skips the step, unless a target made it */
            int fused = variant == 1, f16 = variant == 2;
            pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
            cp.backends = b ? "cpu,cuda" : "cpu,opencl";
            pdde_context *ctx;
            pdde_context_init(&cp, &ctx);
            int dev = pdde_device_find(ctx, backends[b], 0);
            if (dev < 0) {
                if (!variant) test_skip(backends[b], "cross-entropy targets on a device (no %s device)", backends[b]);
                pdde_context_free(ctx);
                continue;
            }
            if (fused) setenv("PDDE_FUSE_CE", "1", 1);
            pdde_graph *g;
            pdde_graph_init(ctx, &g);
            if (f16) pdde_graph_set_compute_dtype(g, PDDE_F16);
            pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){4, 3}), *t = pdde_input(g, "t", PDDE_I32, 1, (int64_t[]){4});
            pdde_tensor *loss = pdde_cross_entropy(g, pdde_matmul(g, x, pdde_param(g, "w", 2, (int64_t[]){3, 4}, 0.3f), 0, 0), t);
            pdde_backward(g, loss);
            pdde_optimizer_adamw(g, NULL);
            pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
            sp.device = dev;
            pdde_session *s = NULL;
            CHECK(pdde_session_init(g, &sp, &s) == PDDE_OK, "%s session: %s", backends[b], pdde_last_error(ctx));
            unsetenv("PDDE_FUSE_CE");
            float xs[12] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, 0.8f, 0.9f, 1, 1.1f, 1.2f};
            pdde_session_write(s, x, xs, sizeof xs);
            pdde_session_write(s, t, (int32_t[4]){0, 1, 7, -1}, 4 * sizeof(int32_t));
            pdde_status st = pdde_session_run(s, PDDE_RUN_STEP);
            CHECK(st == PDDE_ERR_INVALID_ARG && contains(pdde_last_error(ctx), "cross_entropy.") &&
                  contains(pdde_last_error(ctx), "target 7 at position 2 is outside the 4 classes"),
                  "%s%s: target 7 of 4: %s: %s", backends[b], fused ? " (PDDE_FUSE_CE=1)" : f16 ? " (f16, loss scaling)" : "", pdde_status_str(st),
                  pdde_last_error(ctx));
            pdde_session_write(s, t, (int32_t[4]){0, 1, -1, 3}, 4 * sizeof(int32_t));
            CHECK(pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK && isfinite(pdde_session_loss(s)), "%s: a negative target is ignored: %s", backends[b],
                  pdde_last_error(ctx));
            pdde_session_free(s);
            pdde_graph_free(g);
            if (!variant) { /* an embedding id outside the table: a NaN row there, named by the same check */
                pdde_graph_init(ctx, &g);
                pdde_tensor *ids = pdde_input(g, "ids", PDDE_I32, 1, (int64_t[]){4}), *table = pdde_param(g, "table", 2, (int64_t[]){5, 3}, 0.3f);
                t = pdde_input(g, "t", PDDE_I32, 1, (int64_t[]){4});
                loss = pdde_cross_entropy(g, pdde_matmul(g, pdde_embedding(g, table, ids), pdde_param(g, "w", 2, (int64_t[]){3, 4}, 0.3f), 0, 0), t);
                pdde_backward(g, loss);
                pdde_optimizer_adamw(g, NULL);
                CHECK(pdde_session_init(g, &sp, &s) == PDDE_OK, "%s session: %s", backends[b], pdde_last_error(ctx));
                pdde_session_write(s, t, (int32_t[4]){0, 1, 2, 3}, 4 * sizeof(int32_t));
                static const int32_t bad[2][4] = {{0, 1, 9, 2}, {-3, 1, 2, 4}};
                for (int k = 0; k < 2; k++) {
                    char want[64];
                    snprintf(want, sizeof want, "id %d at position %d is outside the table table [0, 5)", bad[k][k ? 0 : 2], k ? 0 : 2);
                    pdde_session_write(s, ids, bad[k], sizeof bad[k]);
                    st = pdde_session_run(s, PDDE_RUN_STEP);
                    CHECK(st == PDDE_ERR_INVALID_ARG && contains(pdde_last_error(ctx), "embedding.") && contains(pdde_last_error(ctx), want),
                          "%s: embedding '%s': %s: %s", backends[b], want, pdde_status_str(st), pdde_last_error(ctx));
                }
                pdde_session_write(s, ids, (int32_t[4]){0, 1, 4, 2}, 4 * sizeof(int32_t));
                CHECK(pdde_session_run(s, PDDE_RUN_STEP) == PDDE_OK && isfinite(pdde_session_loss(s)), "%s: ids inside the table train: %s",
                      backends[b], pdde_last_error(ctx));
                pdde_session_free(s);
                pdde_graph_free(g);
            }
            pdde_context_free(ctx);
        }
}

/* ------------------------------------------------------------------------------------------------
 * Memory admission: a plan bigger than the machine is refused at session init with the numbers,
 * before anything is allocated (the graph is symbolic: a 4 TB weight costs nothing to build) */

/* y = x @ w with w [n, n] and AdamW (n = 2^20: 4 TB of f32 and 16 TB of state), on `device`. */
static pdde_status absurd_session(pdde_context *ctx, int device, int64_t n, double headroom, pdde_graph **g, pdde_session **s) {
    pdde_graph_init(ctx, g);
    pdde_tensor *x = pdde_input(*g, "x", PDDE_F32, 2, (int64_t[]){2, n});
    pdde_tensor *w = pdde_param(*g, "w", 2, (int64_t[]){n, n}, 0.02f);
    pdde_tensor *y = pdde_matmul(*g, x, w, 0, 0);
    pdde_backward(*g, pdde_mean(*g, pdde_mul(*g, y, y), -1, 0));
    pdde_optimizer_adamw(*g, NULL);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.device = device, sp.memory_headroom = headroom;
    return pdde_session_init(*g, &sp, s);
}

static void test_memory_admission(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_context_init(&cp, &ctx);
    double t0 = test_now();
    pdde_status st = absurd_session(ctx, 0, (int64_t)1 << 20, 0, &g, &s);
    const char *e = pdde_last_error(ctx);
    printf("absurd model: %s\n", e);
    CHECK(st == PDDE_ERR_OOM && !s && contains(e, "bytes) of host memory") && contains(e, "available"),
          "a 16 TB plan is refused with the numbers: %s: %s", pdde_status_str(st), e);
    CHECK(test_now() - t0 < 5, "refused at once (%.1f s): nothing was allocated or touched", test_now() - t0);
    pdde_graph_free(g);

    /* what is available can be stated (PDDE_MEMORY_AVAILABLE), and the check skipped */
    setenv("PDDE_MEMORY_AVAILABLE", "100k", 1);
    gpt_config cfg = {.vocab = 32, .ctx = 8, .layers = 2, .heads = 2, .width = 16, .batch = 4};
    gpt_model m;
    pdde_graph_init(ctx, &g);
    gpt_build(g, &cfg, &m);
    pdde_backward(g, m.loss);
    pdde_optimizer_adamw(g, NULL);
    st = pdde_session_init(g, NULL, &s);
    e = pdde_last_error(ctx);
    CHECK(st == PDDE_ERR_OOM && contains(e, "100.00 kB is available (PDDE_MEMORY_AVAILABLE)") && contains(e, "90.00 kB may be used"),
          "a small model over a stated 100 kB: %s: %s", pdde_status_str(st), e);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.memory_headroom = -1;
    CHECK(pdde_session_init(g, &sp, &s) == PDDE_OK, "memory_headroom < 0 skips the check: %s", pdde_last_error(ctx));
    pdde_session_free(s), s = NULL;
    setenv("PDDE_MEMORY_HEADROOM", "off", 1);
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "PDDE_MEMORY_HEADROOM=off skips the check: %s", pdde_last_error(ctx));
    pdde_session_free(s), s = NULL;
    unsetenv("PDDE_MEMORY_HEADROOM");
    setenv("PDDE_MEMORY_AVAILABLE", "1G", 1);
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "it fits in 1 GB: %s", pdde_last_error(ctx));
    pdde_session_free(s), s = NULL;
    unsetenv("PDDE_MEMORY_AVAILABLE");
    pdde_graph_free(g);
    pdde_context_free(ctx);

    /* a device: its own memory (the OpenCL device, where there is one) */
    cp.backends = "cpu,opencl";
    pdde_context_init(&cp, &ctx);
    int dev = pdde_device_find(ctx, "opencl", 0);
    if (dev < 0) printf("skip: device admission (no OpenCL device)\n");
    else {
        st = absurd_session(ctx, dev, (int64_t)1 << 15, 0, &g, &s); /* 16 GB of state: the kernels take 2^31 elements */
        e = pdde_last_error(ctx);
        printf("absurd model on device %d: %s\n", dev, e);
        CHECK(st == PDDE_ERR_DEVICE_OOM && !s && contains(e, "on device") && contains(e, "may be used"),
              "a 20 GB plan on a device is refused with the numbers: %s: %s", pdde_status_str(st), e);
        pdde_graph_free(g);
    }
    pdde_context_free(ctx);
}

/* ------------------------------------------------------------------------------------------------
 * Defects the graph fuzzer (tests/fuzz_graph.c) found */

static void test_fuzzer_findings(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s = NULL;
    pdde_context_init(&cp, &ctx);

    /* float -> int casts of NaN and out-of-range values (undefined in C): saturate, NaN -> 0 */
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 1, (int64_t[]){5});
    pdde_tensor *i32 = pdde_cast(g, x, PDDE_I32), *i64 = pdde_cast(g, x, PDDE_I64);
    pdde_mark_output(i32), pdde_mark_output(i64);
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "cast session: %s", pdde_last_error(ctx));
    float xv[5] = {NAN, 1e30f, -1e30f, 3.7f, -2.5f};
    int32_t y32[5];
    int64_t y64[5];
    pdde_session_write(s, x, xv, sizeof xv);
    pdde_session_run(s, PDDE_RUN_FORWARD);
    pdde_session_read(s, i32, y32, sizeof y32), pdde_session_read(s, i64, y64, sizeof y64);
    CHECK(y32[0] == 0 && y32[1] == INT32_MAX && y32[2] == INT32_MIN && y32[3] == 3 && y32[4] == -2,
          "f32 -> i32 saturates: %d %d %d %d %d", y32[0], y32[1], y32[2], y32[3], y32[4]);
    CHECK(y64[0] == 0 && y64[1] == INT64_MAX && y64[2] == INT64_MIN && y64[3] == 3, "f32 -> i64 saturates: %lld %lld %lld",
          (long long)y64[0], (long long)y64[1], (long long)y64[2]);
    pdde_session_free(s), s = NULL;
    pdde_graph_free(g);

    /* kernels read f32 (data movement also i32): a 2- or 8-byte dtype was read past its end */
    for (int k = 0; k < 6; k++) {
        pdde_graph_init(ctx, &g);
        pdde_tensor *a = pdde_input(g, "a", PDDE_F32, 2, (int64_t[]){3, 4});
        pdde_tensor *h = pdde_input(g, "h", k % 2 ? PDDE_I64 : PDDE_F16, 1, (int64_t[]){4});
        pdde_tensor *h2 = pdde_input(g, "h2", PDDE_F16, 2, (int64_t[]){3, 4}), *y = NULL;
        switch (k) {
        case 0: case 1: y = pdde_layernorm(g, a, h, h, 1e-5f); break;
        case 2: y = pdde_slice(g, h2, 1, 0, 2); break;
        case 3: y = pdde_permute(g, h2, (int[]){1, 0}); break;
        case 4: y = pdde_sum(g, h2, 0, 0); break;
        case 5: y = pdde_cross_entropy(g, h2, pdde_input(g, "t", PDDE_I32, 1, (int64_t[]){3})); break;
        }
        CHECK(!y && pdde_graph_status(g) == PDDE_ERR_DTYPE, "case %d: a non-f32 operand is refused: %s", k, pdde_last_error(ctx));
        pdde_graph_free(g);
    }
    pdde_graph_init(ctx, &g);
    pdde_tensor *ids = pdde_input(g, "ids", PDDE_I32, 2, (int64_t[]){3, 4});
    CHECK(pdde_slice(g, pdde_permute(g, ids, (int[]){1, 0}), 0, 1, 2) != NULL, "i32 moves: %s", pdde_last_error(ctx));
    pdde_graph_free(g);

    /* a slice of an empty tensor whose other dim is huge: nothing to copy, and no 2^40 empty copies */
    pdde_graph_init(ctx, &g);
    x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){(int64_t)1 << 40, 0});
    pdde_tensor *sl = pdde_slice(g, x, 1, 0, 0);
    pdde_mark_output(sl);
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "empty slice session: %s", pdde_last_error(ctx));
    pdde_status st = PDDE_ERR_STATE;
    if (s) WITHIN(10, "a slice of an empty [2^40, 0] tensor", st = pdde_session_run(s, PDDE_RUN_FORWARD));
    CHECK(st == PDDE_OK, "an empty slice runs at once: %s", pdde_last_error(ctx));
    pdde_session_free(s), s = NULL;
    pdde_graph_free(g);

    /* exp of NaN (softmax of a row holding one): NaN comes out (so the guard sees it), not a value
     * made from converting NaN to int (undefined; UBSan reports it under make test-asan) */
    pdde_graph_init(ctx, &g);
    x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){2, 3});
    pdde_tensor *y = pdde_softmax(g, x, 0);
    pdde_mark_output(y);
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "softmax session: %s", pdde_last_error(ctx));
    float sx[6] = {0, NAN, 1, 0, 1, 2}, sy[6];
    pdde_session_write(s, x, sx, sizeof sx);
    pdde_session_run(s, PDDE_RUN_FORWARD);
    pdde_session_read(s, y, sy, sizeof sy);
    CHECK(isnan(sy[0]) && isnan(sy[2]) && test_close(sy[3] + sy[4] + sy[5], 1, 1e-5, 0), "a NaN row stays NaN, the next sums to 1: %g %g",
          sy[0], sy[3] + sy[4] + sy[5]);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);

    /* a peer's snapshot (pdde_snapshot_from_data) with a damaged but checksummed header or index:
     *  - its first block starting at 2^63 - 1 (its end past int64): refused, the box said as it is in
     *    the bytes, not wrapped to a negative end (signed overflow: UBSan stops make test-asan there);
     *  - rank 2^31 of 2^32 - 1: refused, not read as a snapshot of rank -2^31 of -1 */
    tiny t;
    CHECK(tiny_init(&t, NULL) == PDDE_OK && tiny_step(&t, 1) == PDDE_OK, "tiny model: %s", pdde_last_error(t.ctx));
    pdde_snapshot *sn = NULL, *back = NULL;
    size_t n = 0;
    const unsigned char *data = pdde_snapshot_take(t.s, NULL, NULL, &sn) == PDDE_OK ? pdde_snapshot_data(sn, &n) : NULL;
    CHECK(data && n > 120, "snapshot: %s", pdde_last_error(t.ctx));
    for (int k = 0; k < 2 && data && n > 120; k++) {
        unsigned char *bad = malloc(n);
        memcpy(bad, data, n);
        uint64_t index_bytes; /* (the header: magic, version, rank, world, ..., index bytes at 88; 104 bytes) */
        uint16_t name_len;
        memcpy(&index_bytes, bad + 88, 8), memcpy(&name_len, bad + 104, 2);
        int ndim = bad[104 + 2 + name_len + 1];
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)name_len, (const char *)bad + 106);
        int64_t start = INT64_MAX; /* start[0], after the name, 4 bytes (dtype, ndim, primary, 0) and the shape */
        uint32_t rank_world[2] = {1u << 31, UINT32_MAX};
        if (k == 0) memcpy(bad + 104 + 2 + name_len + 4 + 8 * ndim, &start, 8);
        else memcpy(bad + 12, rank_world, 8);
        uint32_t crc = crc32_of(bad, 104 + index_bytes);
        memcpy(bad + 104 + index_bytes, &crc, 4);
        st = pdde_snapshot_from_data(t.ctx, bad, n, &back);
        const char *msg = pdde_last_error(t.ctx);
        if (k == 0)
            CHECK(st == PDDE_ERR_CORRUPT && !back && contains(msg, "[9223372036854775807+") && contains(msg, name) && contains(msg, "outside its shape"),
                  "a block starting at 2^63 - 1 is refused, said as start+extent: %s", msg);
        else
            CHECK(st == PDDE_ERR_CORRUPT && !back && contains(msg, "rank 2147483648 of 4294967295"),
                  "rank 2^31 of 2^32 - 1 is refused: %s (read as rank %d of %d)", st ? msg : "accepted", pdde_snapshot_rank(back),
                  pdde_snapshot_world_size(back));
        pdde_snapshot_free(back), back = NULL;
        free(bad);
    }
    pdde_snapshot_free(sn);
    tiny_free(&t);
}

/* ------------------------------------------------------------------------------------------------
 * Errors under threads: threads sharing a context that fail at the same time each read their own
 * message, whole (errors are per thread, as errno is), through pdde_error, a failing call and a
 * graph's error; a pipeline stage's error carries that stage's message, and a stage that failed
 * without raising one is not given another stage's. */

enum { ERROR_THREADS = 4, ERROR_ROUNDS = 5000, ERROR_CALLS = 300 };

typedef struct {
    pdde_context *ctx;
    int id;
    pthread_barrier_t *start;
    int wrong;              /* messages read back that were not this thread's own */
    char first_wrong[200];
} error_thread;

static void error_thread_check(error_thread *e, const char *got, const char *want) {
    if (!strstr(got, want) && !e->wrong++) snprintf(e->first_wrong, sizeof e->first_wrong, "want '%.60s', got '%.120s'", want, got);
}

static void *error_thread_main(void *arg) {
    error_thread *e = arg;
    char pad[700], want[900];
    memset(pad, 'a' + e->id, sizeof pad - 1), pad[sizeof pad - 1] = 0; /* long: a torn message shows */
    pthread_barrier_wait(e->start);
    for (int i = 0; i < ERROR_ROUNDS; i++) {
        snprintf(want, sizeof want, "thread %d, error %d: %s", e->id, i, pad);
        pdde_error(e->ctx, PDDE_ERR_INVALID_ARG, "%s", want);
        sched_yield(); /* (the others raise theirs meanwhile, on a loaded core too) */
        const char *got = pdde_last_error(e->ctx);
        if (strcmp(got, want)) error_thread_check(e, got, want);
    }
    for (int i = 0; i < ERROR_CALLS; i++) {
        pdde_graph *g;
        pdde_graph_init(e->ctx, &g);
        int layer = -(1000 * e->id + i + 1);
        snprintf(want, sizeof want, "layer %d must be", layer);
        pdde_graph_set_recompute(g, layer, 1); /* a failing call: pdde_error */
        sched_yield();
        error_thread_check(e, pdde_last_error(e->ctx), want);
        char a[32], b[32];
        snprintf(a, sizeof a, "a_%d_%d", e->id, i), snprintf(b, sizeof b, "b_%d_%d", e->id, i);
        pdde_tensor *x = pdde_input(g, a, PDDE_F32, 2, (int64_t[]){2, 3}), *y = pdde_input(g, b, PDDE_F32, 2, (int64_t[]){4, 5});
        pdde_matmul(g, x, y, 0, 0); /* a graph's first error (it went straight into the context's buffer) */
        sched_yield();
        error_thread_check(e, pdde_last_error(e->ctx), b);
        pdde_graph_free(g);
    }
    return NULL;
}

typedef struct { pdde_context *ctx, *own; } error_stages;

/* Stage k of the both-fail case: raises its own message on batch fail_at and fails after a pause
 * (time for the other stage to raise its own meanwhile). */
static pdde_status stage_fails(error_stages *e, int k, int64_t index) {
    int at = k == 0 ? 1 : 0; /* stage 0 on batch 1 while stage 1 runs batch 0 */
    if (index != at) return PDDE_OK;
    pdde_status st = pdde_error(e->ctx, PDDE_ERR_IO, "stage %d failed batch %lld", k, (long long)index);
    usleep(2000);
    return st;
}
static pdde_status stage0_fails(void *user, void *slot, int64_t index, int worker) { (void)slot, (void)worker; return stage_fails(user, 0, index); }
static pdde_status stage1_fails(void *user, void *slot, int64_t index, int worker) { (void)slot, (void)worker; return stage_fails(user, 1, index); }

/* The silent case: stage 0 raises a message it recovers from (a retried read) on every batch; stage 1
 * fails batch 1 with a status and no message. */
static pdde_status stage_recovers(void *user, void *slot, int64_t index, int worker) {
    (void)slot, (void)worker;
    pdde_error(((error_stages *)user)->ctx, PDDE_ERR_IO, "read: batch %lld retried", (long long)index);
    return PDDE_OK;
}
static pdde_status stage_silent(void *user, void *slot, int64_t index, int worker) {
    (void)user, (void)slot, (void)worker;
    return index == 1 ? PDDE_ERR_IO : PDDE_OK;
}

/* A stage that drives a session of a context of its own fails batch 1 there. */
static pdde_status stage_own_context(void *user, void *slot, int64_t index, int worker) {
    (void)slot, (void)worker;
    return index == 1 ? pdde_error(((error_stages *)user)->own, PDDE_ERR_MISMATCH, "batch %lld failed on the stage's context", (long long)index)
                      : PDDE_OK;
}

static void test_errors_under_threads(void) {
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.backends = "cpu", cp.n_threads = 1;
    pdde_context *ctx;
    if (pdde_context_init(&cp, &ctx)) { CHECK(0, "context"); return; }
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, ERROR_THREADS);
    error_thread e[ERROR_THREADS];
    pthread_t th[ERROR_THREADS];
    for (int i = 0; i < ERROR_THREADS; i++) {
        e[i] = (error_thread){.ctx = ctx, .id = i, .start = &start};
        pthread_create(&th[i], NULL, error_thread_main, &e[i]);
    }
    for (int i = 0; i < ERROR_THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(e[i].wrong == 0, "thread %d read %d messages not its own (of %d): %s", i, e[i].wrong, ERROR_ROUNDS + 2 * ERROR_CALLS,
              e[i].first_wrong);
    }
    pthread_barrier_destroy(&start);
    CHECK(strstr(pdde_last_error(ctx), "thread ") || strstr(pdde_last_error(ctx), "must be") || strstr(pdde_last_error(ctx), "a_"),
          "a thread that raised nothing reads the context's last error: '%.80s'", pdde_last_error(ctx));

    /* both stages fail at once: the run's error names one stage, with that stage's message */
    error_stages es = {.ctx = ctx};
    int slot_mem[4];
    void *slots[4] = {&slot_mem[0], &slot_mem[1], &slot_mem[2], &slot_mem[3]};
    int mixed = 0;
    char example[300] = "";
    for (int run = 0; run < 20; run++) {
        pdde_pipeline_stage stages[2] = {{.name = "read", .fn = stage0_fails, .user = &es, .workers = 1},
                                         {.name = "train", .fn = stage1_fails, .user = &es, .workers = 1}};
        pdde_pipeline_params pp = PDDE_PIPELINE_PARAMS_INIT;
        pp.n_stages = 2, pp.stages = stages, pp.slots = slots, pp.n_slots = 4, pp.timeout_s = 20;
        pdde_pipeline *pl;
        if (pdde_pipeline_init(ctx, &pp, &pl)) { CHECK(0, "pipeline: %s", pdde_last_error(ctx)); break; }
        pdde_status st = pdde_pipeline_run(pl, 0, 4);
        const char *msg = pdde_last_error(ctx);
        int ok = st == PDDE_ERR_IO && (strstr(msg, "stage 0 (read), batch 1: stage 0 failed batch 1") ||
                                       strstr(msg, "stage 1 (train), batch 0: stage 1 failed batch 0"));
        if (!ok && !mixed++) snprintf(example, sizeof example, "%s: %.250s", pdde_status_str(st), msg);
        pdde_pipeline_free(pl);
    }
    CHECK(mixed == 0, "%d of 20 runs whose stages failed at once gave a message not the failing stage's own: %s", mixed, example);

    pdde_pipeline_stage stages[2] = {{.name = "read", .fn = stage_recovers, .user = &es, .workers = 1},
                                     {.name = "train", .fn = stage_silent, .user = &es, .workers = 1}};
    pdde_pipeline_params pp = PDDE_PIPELINE_PARAMS_INIT;
    pp.n_stages = 2, pp.stages = stages, pp.slots = slots, pp.n_slots = 1, pp.timeout_s = 20; /* one slot: batch 1 is read before it trains */
    pdde_pipeline *pl;
    if (pdde_pipeline_init(ctx, &pp, &pl) == PDDE_OK) {
        pdde_status st = pdde_pipeline_run(pl, 0, 3);
        const char *msg = pdde_last_error(ctx);
        CHECK(st == PDDE_ERR_IO && strstr(msg, "stage 1 (train), batch 1: i/o error (the stage left no message)") && !strstr(msg, "retried"),
              "a stage failing without a message: %s, '%s'", pdde_status_str(st), msg);
        pdde_pipeline_free(pl);
    }

    /* a stage whose error is on a context of its own: its message, on a worker thread and when
     * sizing runs the stages on the calling thread (workers 0) */
    pdde_context_init(&cp, &es.own);
    for (int workers = 1; workers >= 0; workers--) {
        stages[1] = (pdde_pipeline_stage){.name = "train", .fn = stage_own_context, .user = &es, .workers = workers};
        stages[0].workers = workers;
        if (pdde_pipeline_init(ctx, &pp, &pl) != PDDE_OK) continue;
        pdde_status st = pdde_pipeline_run(pl, 0, 3);
        const char *msg = pdde_last_error(ctx);
        CHECK(st == PDDE_ERR_MISMATCH && strstr(msg, "stage 1 (train), batch 1: batch 1 failed on the stage's context"),
              "a stage failing on its own context (%s): %s, '%s'", workers ? "a worker thread" : "sizing", pdde_status_str(st), msg);
        pdde_pipeline_free(pl);
    }
    pdde_context_free(es.own);
    pdde_context_free(ctx);
}

int main(int argc, char **argv) {
    (void)argc;
    test_binary_dir(argv[0], build_dir, sizeof build_dir);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pdde_test_robust.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    signal(SIGALRM, on_alarm);
    test_checkpoint_records();
    test_not_regular_files();
    test_zero_and_absurd_shapes();
    test_tool_arguments();
    test_nonfinite_hyperparameters();
    test_trace_two_sessions();
    test_nonfinite_step();
    test_nonfinite_first_node();
    test_memory_admission();
    test_cross_entropy_targets_on_devices();
    test_fuzzer_findings();
    test_errors_under_threads();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", tmpdir);
    return test_finish();
}
