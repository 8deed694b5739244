/* test_core — the engine around the ops: memory planning, optimizers (SGD momentum, AdamW, clipping,
 * schedules, gradient accumulation), checkpoints (bit-exact round trip, a save killed midway, corrupt
 * and mismatched files), the data loader, dtype conversions, bad input and misuse of the C API. */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include <malloc.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[256];

static const gpt_config small = {.vocab = 32, .ctx = 8, .layers = 2, .heads = 2, .width = 16, .batch = 4};

typedef struct { pdde_context *ctx; pdde_graph *g; pdde_session *s; gpt_model m; } trainer;

static int trainer_init(trainer *t, const gpt_config *cfg, const pdde_optimizer_params *op, int sgd) {
    memset(t, 0, sizeof *t);
    pdde_context_init(NULL, &t->ctx);
    pdde_graph_init(t->ctx, &t->g);
    if (gpt_build(t->g, cfg, &t->m) || pdde_backward(t->g, t->m.loss)) return -1;
    if ((sgd ? pdde_optimizer_sgd(t->g, op) : pdde_optimizer_adamw(t->g, op)) != PDDE_OK) return -1;
    return pdde_session_init(t->g, NULL, &t->s);
}

static void trainer_free(trainer *t) {
    pdde_session_free(t->s);
    pdde_graph_free(t->g);
    pdde_context_free(t->ctx);
}

static void make_batch(int B, int T, int V, int step, int32_t *x, int32_t *y) {
    for (int i = 0; i < B * T; i++) x[i] = (i * 7 + step * 3) % V, y[i] = (i * 5 + step + 1) % V;
}

static void feed(trainer *t, int step) {
    int BT = t->m.cfg.batch * t->m.cfg.ctx;
    int32_t x[4096], y[4096];
    make_batch(t->m.cfg.batch, t->m.cfg.ctx, t->m.cfg.vocab, step, x, y);
    pdde_session_write(t->s, t->m.ids, x, (size_t)BT * 4);
    pdde_session_write(t->s, t->m.targets, y, (size_t)BT * 4);
}

static void test_memory_plan(void) {
    trainer t;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    CHECK(trainer_init(&t, &small, &op, 0) == PDDE_OK, "session: %s", pdde_last_error(t.ctx));
    pdde_memory_stats ms;
    pdde_session_memory(t.s, &ms);
    CHECK(ms.arena_bytes < ms.activation_bytes / 2, "arena %zu should be well below the sum of activations %zu", ms.arena_bytes, ms.activation_bytes);
    size_t params = (size_t)gpt_n_params(&small) * 4;
    CHECK(ms.param_bytes == params, "param bytes %zu, expected %zu", ms.param_bytes, params);
    CHECK(ms.grad_bytes == params && ms.optimizer_bytes == 2 * params, "grads %zu, adam state %zu for %zu of params", ms.grad_bytes, ms.optimizer_bytes, params);
    printf("memory plan: arena %zu B for %zu B of activations (%d nodes)\n", ms.arena_bytes, ms.activation_bytes, ms.n_nodes);
    /* the plan must not change results: compare with one buffer per tensor */
    feed(&t, 0);
    pdde_session_run(t.s, PDDE_RUN_STEP);
    pdde_session_run(t.s, PDDE_RUN_STEP);
    float reuse_loss = pdde_session_loss(t.s);
    pdde_session *plain;
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.no_memory_reuse = 1;
    CHECK(pdde_session_init(t.g, &sp, &plain) == PDDE_ERR_STATE, "a second live session on one graph is refused");
    pdde_session_free(t.s);
    CHECK(pdde_session_init(t.g, &sp, &plain) == PDDE_OK, "no-reuse session");
    t.s = plain;
    feed(&t, 0);
    pdde_session_run(t.s, PDDE_RUN_STEP);
    pdde_session_run(t.s, PDDE_RUN_STEP);
    CHECK(pdde_session_loss(t.s) == reuse_loss, "memory reuse changed the loss: %.9g vs %.9g", reuse_loss, pdde_session_loss(t.s));
    trainer_free(&t);
}

static void test_grad_accumulation(void) {
    /* one step on batch 8 == two micro-batches of 4 with grad_accum_steps = 2 */
    gpt_config big = small, half = small;
    big.batch = 8;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT, op2 = op;
    op.clip_norm = op2.clip_norm = 0.5f; /* clipping sees the accumulated gradient */
    op2.grad_accum_steps = 2;
    /* b runs the micro-batches one call each; c writes both with pdde_session_write_micro and runs one step */
    trainer a, b, c;
    CHECK(trainer_init(&a, &big, &op, 0) == PDDE_OK && trainer_init(&b, &half, &op2, 0) == PDDE_OK &&
          trainer_init(&c, &half, &op2, 0) == PDDE_OK, "sessions");
    int32_t x[8 * 8], y[8 * 8];
    for (int step = 0; step < 3; step++) {
        make_batch(8, 8, small.vocab, step, x, y);
        pdde_session_write(a.s, a.m.ids, x, sizeof x), pdde_session_write(a.s, a.m.targets, y, sizeof y);
        pdde_session_run(a.s, PDDE_RUN_STEP);
        for (int mb = 0; mb < 2; mb++) {
            pdde_session_write(b.s, b.m.ids, x + mb * 32, 128), pdde_session_write(b.s, b.m.targets, y + mb * 32, 128);
            pdde_session_run(b.s, PDDE_RUN_FORWARD_BACKWARD);
            CHECK(pdde_session_write_micro(c.s, c.m.ids, mb, x + mb * 32, 128) == PDDE_OK &&
                  pdde_session_write_micro(c.s, c.m.targets, mb, y + mb * 32, 128) == PDDE_OK, "write micro-batch %d", mb);
        }
        pdde_session_run(b.s, PDDE_RUN_OPTIMIZER);
        CHECK(pdde_session_run(c.s, PDDE_RUN_STEP) == PDDE_OK, "a step of two micro-batches");
        CHECK(fabsf(pdde_session_loss(c.s) - pdde_session_loss(a.s)) <= 1e-5f * fabsf(pdde_session_loss(a.s)),
              "the micro-batches' mean loss %.6f, the full batch's %.6f", pdde_session_loss(c.s), pdde_session_loss(a.s));
    }
    pdde_tensor *wa = pdde_graph_find(a.g, "h1.fc.w"), *wb = pdde_graph_find(b.g, "h1.fc.w"), *wc = pdde_graph_find(c.g, "h1.fc.w");
    float va[16 * 64], vb[16 * 64], vc[16 * 64];
    pdde_session_read(a.s, wa, va, sizeof va), pdde_session_read(b.s, wb, vb, sizeof vb), pdde_session_read(c.s, wc, vc, sizeof vc);
    double maxd = 0, maxdc = 0;
    for (int i = 0; i < 16 * 64; i++) {
        double d = fabs(va[i] - vb[i]), dc = fabs(vb[i] - vc[i]);
        if (!(d <= maxd)) maxd = d; /* (NaN counts) */
        if (!(dc <= maxdc)) maxdc = dc;
    }
    CHECK(maxd < 1e-5, "accumulated micro-batches differ from the full batch by %.3g", maxd);
    CHECK(maxdc == 0, "one call per micro-batch and one step of written micro-batches differ by %.3g", maxdc);
    CHECK(pdde_session_step(b.s) == 3 && pdde_session_step(c.s) == 3, "3 optimizer steps, got %lld and %lld",
          (long long)pdde_session_step(b.s), (long long)pdde_session_step(c.s));
    CHECK(pdde_session_write_micro(c.s, c.m.ids, 2, x, 128) == PDDE_ERR_INVALID_ARG, "micro-batch 2 of 2 is refused");
    CHECK(pdde_session_write_micro(c.s, c.m.ids, 0, x, 64) == PDDE_ERR_SHAPE, "a short micro-batch is refused");
    trainer_free(&a), trainer_free(&b), trainer_free(&c);
}

static void test_sgd_and_schedule(void) {
    /* SGD with momentum on f(x) = sum(x^2)/2: x_{t+1} = x_t - lr * buf, buf = m*buf + x */
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    pdde_context_init(NULL, &ctx);
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_param(g, "x", 1, (int64_t[]){3}, 0.0f);
    pdde_tensor *loss = pdde_scale(g, pdde_sum(g, pdde_mul(g, x, x), -1, 0), 0.5f);
    pdde_backward(g, loss);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 0.1f, op.momentum = 0.9f;
    pdde_optimizer_sgd(g, &op);
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "sgd session: %s", pdde_last_error(ctx));
    float v[3] = {1, -2, 3}, ref[3] = {1, -2, 3}, buf[3] = {0};
    pdde_session_write(s, x, v, sizeof v);
    for (int step = 0; step < 5; step++) {
        pdde_session_run(s, PDDE_RUN_STEP);
        for (int i = 0; i < 3; i++) buf[i] = 0.9f * buf[i] + ref[i], ref[i] -= 0.1f * buf[i];
    }
    pdde_session_read(s, x, v, sizeof v);
    for (int i = 0; i < 3; i++) CHECK(test_close(v[i], ref[i], 1e-5, 1e-6), "sgd x[%d] = %g, expected %g", i, v[i], ref[i]);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);

    pdde_optimizer_params cs = PDDE_OPTIMIZER_PARAMS_INIT;
    cs.lr = 1.0f, cs.schedule = PDDE_LR_COSINE, cs.warmup_steps = 10, cs.total_steps = 110, cs.min_lr_ratio = 0.1f;
    CHECK(test_close(pdde_lr_at(&cs, 0), 0.1, 1e-6, 0) && test_close(pdde_lr_at(&cs, 9), 1.0, 1e-6, 0), "warmup");
    CHECK(test_close(pdde_lr_at(&cs, 60), 0.55, 1e-5, 0), "cosine midpoint %g", pdde_lr_at(&cs, 60));
    CHECK(test_close(pdde_lr_at(&cs, 500), 0.1, 1e-6, 0), "cosine floor %g", pdde_lr_at(&cs, 500));
}

/* A load of the weights only (pdde_checkpoint_extra.weights_only), from a file and from a directory,
 * into a session with another optimizer (SGD: none of the saving run's AdamW state is this model's, and
 * a whole load refuses it): every parameter is the saved one, bit for bit, and the session's step and
 * the data position stay its own. */
static void test_checkpoint_weights_only(void) {
    char file[512], dir[512];
    snprintf(file, sizeof file, "%s/weights.bin", tmpdir), snprintf(dir, sizeof dir, "%s/weights_dir/", tmpdir);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 0.05f, op.momentum = 0.9f;
    trainer a;
    CHECK(trainer_init(&a, &small, &op, 0) == PDDE_OK, "adamw session");
    for (int step = 0; step < 3; step++) feed(&a, step), pdde_session_run(a.s, PDDE_RUN_STEP);
    pdde_checkpoint_extra ex = {.data_position = 777};
    CHECK(pdde_checkpoint_save(a.s, file, &ex) == PDDE_OK && pdde_checkpoint_save(a.s, dir, &ex) == PDDE_OK, "save: %s", pdde_last_error(a.ctx));
    for (int k = 0; k < 2; k++) {
        const char *from = k ? dir : file;
        trainer b;
        CHECK(trainer_init(&b, &small, &op, 1) == PDDE_OK, "sgd session");
        feed(&b, 9), pdde_session_run(b.s, PDDE_RUN_STEP); /* b's step 1 */
        pdde_checkpoint_extra whole = {0}, got = {.data_position = 5, .weights_only = 1};
        CHECK(pdde_checkpoint_load(b.s, from, &whole) == PDDE_ERR_MISMATCH, "%s: a whole load into the SGD model is refused (AdamW's state)", from);
        pdde_status st = pdde_checkpoint_load(b.s, from, &got);
        CHECK(!st && got.data_position == 5 && pdde_session_step(b.s) == 1, "%s: weights only: loaded (%s), data position %llu (5), step %lld (1)", from,
              st ? pdde_last_error(b.ctx) : "ok", (unsigned long long)got.data_position, (long long)pdde_session_step(b.s));
        int same = 1, params = 0;
        for (int i = 0; i < pdde_graph_tensor_count(b.g); i++) {
            pdde_tensor *t = pdde_graph_tensor(b.g, i);
            if (!(t->flags & PDDE_TENSOR_PARAM)) continue;
            size_t n = pdde_tensor_nbytes(t);
            char *x = malloc(n), *y = malloc(n);
            same &= !pdde_session_read(b.s, t, x, n) && !pdde_session_read(a.s, pdde_graph_find(a.g, t->name), y, n) && !memcmp(x, y, n);
            params++;
            free(x), free(y);
        }
        CHECK(same && params > 10, "%s: weights only: each of the %d parameters is the saved one, bit for bit", from, params);
        trainer_free(&b);
    }
    /* a model with a weight the checkpoint does not hold is refused, naming it */
    gpt_config bigger = small;
    bigger.layers = 3;
    trainer c;
    CHECK(trainer_init(&c, &bigger, &op, 1) == PDDE_OK, "3-layer session");
    pdde_checkpoint_extra wo = {.weights_only = 1};
    pdde_status st = pdde_checkpoint_load(c.s, file, &wo);
    CHECK(st == PDDE_ERR_MISMATCH && strstr(pdde_last_error(c.ctx), "h2.") && strstr(pdde_last_error(c.ctx), "of the model is missing"),
          "weights only: a model with more layers is refused naming a missing weight: %s", pdde_last_error(c.ctx));
    trainer_free(&a), trainer_free(&c);
}

static void test_checkpoints(void) {
    char path[512], path2[512], before[512], after[512];
    snprintf(path, sizeof path, "%s/ckpt.bin", tmpdir);
    snprintf(path2, sizeof path2, "%s/other.bin", tmpdir);
    snprintf(before, sizeof before, "%s/before.bin", tmpdir), snprintf(after, sizeof after, "%s/after.bin", tmpdir);
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    trainer a, b;
    CHECK(trainer_init(&a, &small, &op, 0) == PDDE_OK && trainer_init(&b, &small, &op, 0) == PDDE_OK, "sessions");
    for (int step = 0; step < 3; step++) feed(&a, step), pdde_session_run(a.s, PDDE_RUN_STEP);
    pdde_checkpoint_extra ex = {.data_position = 12345};
    CHECK(pdde_checkpoint_save(a.s, path, &ex) == PDDE_OK, "save: %s", pdde_last_error(a.ctx));
    pdde_checkpoint_extra got = {0};
    feed(&b, 7), pdde_session_run(b.s, PDDE_RUN_STEP); /* b's tensors differ from what a saved */
    CHECK(pdde_checkpoint_load(b.s, path, &got) == PDDE_OK, "load: %s", pdde_last_error(b.ctx));
    CHECK(got.data_position == 12345 && pdde_session_step(b.s) == 3, "extra/step restored");
    /* what b holds right after the load is what a saved, tensor for tensor */
    CHECK(pdde_checkpoint_save(b.s, after, NULL) == PDDE_OK, "save after load");
    test_ckpt_compare("right after the load", after, path, 0, 0);
    /* bit-exact: the next steps of a and b agree to the last bit */
    for (int step = 3; step < 6; step++) {
        feed(&a, step), pdde_session_run(a.s, PDDE_RUN_STEP);
        feed(&b, step), pdde_session_run(b.s, PDDE_RUN_STEP);
        CHECK(pdde_session_loss(a.s) == pdde_session_loss(b.s), "step %d after resume: %.9g vs %.9g", step, pdde_session_loss(a.s), pdde_session_loss(b.s));
    }
    /* a second save of b round-trips byte for byte */
    CHECK(pdde_checkpoint_save(a.s, path, NULL) == PDDE_OK && pdde_checkpoint_save(b.s, path2, NULL) == PDDE_OK, "saves");
    FILE *f1 = fopen(path, "rb"), *f2 = fopen(path2, "rb");
    int same = f1 && f2;
    for (int c1 = 0, c2 = 0; same && c1 != EOF;) c1 = fgetc(f1), c2 = fgetc(f2), same = c1 == c2;
    if (f1) fclose(f1);
    if (f2) fclose(f2);
    CHECK(same, "checkpoints of two identical runs differ");

    /* every failed load below leaves b as it was: its tensors and step (compared at the end) */
    CHECK(pdde_checkpoint_save(b.s, before, NULL) == PDDE_OK, "save before the failed loads");
    /* corrupt: flip a byte in the middle */
    FILE *f = fopen(path2, "r+b");
    fseek(f, 200, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 200, SEEK_SET);
    fputc(c ^ 0x55, f);
    fclose(f);
    pdde_status st = pdde_checkpoint_load(b.s, path2, NULL);
    CHECK(st == PDDE_ERR_CORRUPT && strstr(pdde_last_error(b.ctx), "checksum"), "corrupt file: %d %s", st, pdde_last_error(b.ctx));
    /* truncated */
    CHECK(truncate(path2, 100) == 0, "truncate");
    st = pdde_checkpoint_load(b.s, path2, NULL);
    CHECK(st == PDDE_ERR_CORRUPT, "truncated file: %d %s", st, pdde_last_error(b.ctx));
    /* not a checkpoint at all, and a missing one */
    f = fopen(path2, "wb");
    fputs("hello, this is not a checkpoint at all.............................", f);
    fclose(f);
    st = pdde_checkpoint_load(b.s, path2, NULL);
    CHECK(st == PDDE_ERR_CORRUPT && strstr(pdde_last_error(b.ctx), "magic"), "bad magic: %s", pdde_last_error(b.ctx));
    st = pdde_checkpoint_load(b.s, "/nonexistent/ckpt.bin", NULL);
    CHECK(st == PDDE_ERR_NOT_FOUND && strstr(pdde_last_error(b.ctx), "/nonexistent/ckpt.bin"), "missing: %s", pdde_last_error(b.ctx));
    CHECK(pdde_checkpoint_save(b.s, after, NULL) == PDDE_OK, "save after the failed loads");
    test_ckpt_compare("after four failed loads", after, before, 0, 0);
    /* a checkpoint of another model: mismatch, named */
    gpt_config wide = small;
    wide.width = 32;
    trainer w;
    CHECK(trainer_init(&w, &wide, &op, 0) == PDDE_OK, "wide session");
    CHECK(pdde_checkpoint_save(w.s, before, NULL) == PDDE_OK, "save before the mismatched load");
    st = pdde_checkpoint_load(w.s, path, NULL);
    char wte_there[64], wte_model[64]; /* (both shapes named: which model the file is of) */
    snprintf(wte_there, sizeof wte_there, "wte is f32 [%d,%d] there", small.vocab, small.width);
    snprintf(wte_model, sizeof wte_model, "the model's is f32 [%d,%d]", wide.vocab, wide.width);
    CHECK(st == PDDE_ERR_MISMATCH && strstr(pdde_last_error(w.ctx), wte_there) && strstr(pdde_last_error(w.ctx), wte_model), "mismatch: %s",
          pdde_last_error(w.ctx));
    CHECK(pdde_checkpoint_save(w.s, after, NULL) == PDDE_OK, "save after the mismatched load");
    test_ckpt_compare("after a mismatched load", after, before, 0, 0);
    trainer_free(&w);
    trainer_free(&a), trainer_free(&b);
}

/* A child saves a large checkpoint over and over; we SIGKILL it mid-save. The previous file must load. */
static void test_killed_save(void) {
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/big.bin", tmpdir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fds[2];
    CHECK(pipe(fds) == 0, "pipe");
    pid_t pid = fork();
    if (pid == 0) {
        pdde_context *ctx;
        pdde_graph *g;
        pdde_session *s;
        pdde_context_init(NULL, &ctx);
        pdde_graph_init(ctx, &g);
        pdde_param(g, "big", 2, (int64_t[]){4096, 4096}, 0.02f); /* 64 MiB: a save takes a while */
        pdde_mark_output(pdde_graph_tensor(g, 0));
        if (pdde_session_init(g, NULL, &s) || pdde_checkpoint_save(s, path, NULL)) _exit(3);
        if (write(fds[1], "k", 1) != 1) _exit(4);
        for (;;) pdde_checkpoint_save(s, path, NULL);
    }
    close(fds[1]);
    char ch;
    CHECK(read(fds[0], &ch, 1) == 1, "child saved the first checkpoint");
    struct stat stt;
    for (int i = 0; i < 5000 && stat(tmp, &stt) != 0; i++) usleep(1000); /* wait until a save is under way */
    usleep(20000);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    close(fds[0]);
    CHECK(WIFSIGNALED(status), "child was killed");
    pdde_context *ctx;
    pdde_graph *g;
    pdde_session *s;
    pdde_context_init(NULL, &ctx);
    pdde_graph_init(ctx, &g);
    pdde_param(g, "big", 2, (int64_t[]){4096, 4096}, 0.0f);
    pdde_mark_output(pdde_graph_tensor(g, 0));
    pdde_session_init(g, NULL, &s);
    pdde_status st = pdde_checkpoint_load(s, path, NULL);
    CHECK(st == PDDE_OK, "the checkpoint before the killed save must load: %s", pdde_last_error(ctx));
    float v[4];
    pdde_session_read(s, pdde_graph_tensor(g, 0), NULL, 0); /* size mismatch -> error, no crash */
    float *all = malloc(4096 * 4096 * 4);
    pdde_session_read(s, pdde_graph_tensor(g, 0), all, (size_t)4096 * 4096 * 4);
    memcpy(v, all, sizeof v);
    CHECK(v[0] != 0.0f || v[1] != 0.0f, "loaded values are the saved ones");
    free(all);
    pdde_session_free(s);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    unlink(path), unlink(tmp);
}

static void test_bad_input(void) {
    pdde_context *ctx;
    pdde_graph *g;
    pdde_context_init(NULL, &ctx);
    pdde_graph_init(ctx, &g);
    pdde_tensor *a = pdde_param(g, "a", 2, (int64_t[]){3, 4}, 0.1f), *b = pdde_param(g, "b", 2, (int64_t[]){5, 6}, 0.1f);
    CHECK(pdde_matmul(g, a, b, 0, 0) == NULL, "matmul shape mismatch returns NULL");
    CHECK(pdde_graph_status(g) == PDDE_ERR_SHAPE && strstr(pdde_last_error(ctx), "a [3,4]") && strstr(pdde_last_error(ctx), "b [5,6]"),
          "message names both tensors and shapes: %s", pdde_last_error(ctx));
    CHECK(pdde_add(g, a, a) == NULL, "later calls fail after the first error");
    pdde_session *s = NULL;
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_ERR_SHAPE && s == NULL, "session of a failed graph");
    pdde_graph_free(g);

    pdde_graph_init(ctx, &g);
    a = pdde_param(g, "a", 2, (int64_t[]){3, 4}, 0.1f);
    CHECK(pdde_reshape(g, a, 2, (int64_t[]){5, 5}) == NULL && strstr(pdde_last_error(ctx), "reshape"), "reshape: %s", pdde_last_error(ctx));
    pdde_graph_free(g);

    /* a norm of a scalar has no last dim (found by fuzz_graph: gamma [0] passed as its width, a run read past it) */
    for (int op = 0; op < 2; op++) {
        pdde_graph_init(ctx, &g);
        pdde_tensor *x = pdde_param(g, "x", 0, NULL, 0.1f), *w = pdde_param(g, "w", 1, (int64_t[]){0}, 0.1f);
        pdde_tensor *y = op ? pdde_rmsnorm(g, x, w, 1e-5f) : pdde_layernorm(g, x, w, w, 1e-5f);
        CHECK(!y && pdde_graph_status(g) == PDDE_ERR_SHAPE && strstr(pdde_last_error(ctx), "scalar"), "%s of a scalar: %s", op ? "rmsnorm" : "layernorm",
              pdde_last_error(ctx));
        pdde_graph_free(g);
    }

    pdde_graph_init(ctx, &g);
    a = pdde_param(g, "a", 2, (int64_t[]){3, 4}, 0.1f);
    pdde_tensor *y = pdde_relu(g, a);
    y->op = (pdde_op)999; /* a corrupted node: unknown op */
    pdde_mark_output(y);
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_ERR_UNKNOWN_OP, "unknown op: %s", pdde_last_error(ctx));
    pdde_graph_free(g);

    pdde_graph_init(ctx, &g);
    pdde_tensor *ids = pdde_input(g, "ids", PDDE_I32, 1, (int64_t[]){2});
    pdde_tensor *tab = pdde_param(g, "tab", 2, (int64_t[]){4, 3}, 0.1f);
    pdde_tensor *e = pdde_embedding(g, tab, ids);
    pdde_mark_output(e);
    CHECK(pdde_session_init(g, NULL, &s) == PDDE_OK, "embedding session");
    int32_t bad[2] = {1, 9};
    pdde_session_write(s, ids, bad, sizeof bad);
    CHECK(pdde_session_run(s, PDDE_RUN_FORWARD) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "id 9"), "id out of range: %s", pdde_last_error(ctx));
    CHECK(pdde_session_write(s, ids, bad, 4) == PDDE_ERR_SHAPE, "write of the wrong size");
    CHECK(pdde_backward(g, e) == PDDE_ERR_SHAPE, "backward of a non-scalar");
    pdde_session_free(s);
    pdde_graph_free(g);

    pdde_data *d;
    pdde_status st = pdde_data_open(ctx, "/nonexistent/corpus.txt", &d);
    CHECK(st == PDDE_ERR_NOT_FOUND && strstr(pdde_last_error(ctx), "/nonexistent/corpus.txt"), "missing data file: %s", pdde_last_error(ctx));
    pdde_context_free(ctx);
    pdde_session_free(NULL), pdde_graph_free(NULL), pdde_context_free(NULL), pdde_data_close(NULL);
}

/* A two-layer classifier x [16, 8] -> h = gelu(x @ w1) [16, 16] -> logits = h @ w2 [16, 4] -> cross-entropy
 * with AdamW (lr 0: the parameters stay, so runs compare); h is marked an output when keep_h. */
typedef struct { pdde_graph *g; pdde_session *s; pdde_tensor *x, *t, *w1, *w2, *h, *logits, *loss; } classifier;

static pdde_status classifier_init(pdde_context *ctx, classifier *c, int keep_h, int no_memory_reuse) {
    memset(c, 0, sizeof *c);
    pdde_graph_init(ctx, &c->g);
    c->x = pdde_input(c->g, "x", PDDE_F32, 2, (int64_t[]){16, 8});
    c->t = pdde_input(c->g, "t", PDDE_I32, 1, (int64_t[]){16});
    c->w1 = pdde_param(c->g, "w1", 2, (int64_t[]){8, 16}, 0.5f);
    c->w2 = pdde_param(c->g, "w2", 2, (int64_t[]){16, 4}, 0.5f);
    c->h = pdde_gelu(c->g, pdde_matmul(c->g, c->x, c->w1, 0, 0));
    c->logits = pdde_matmul(c->g, pdde_gelu(c->g, c->h), c->w2, 0, 0);
    c->loss = pdde_cross_entropy(c->g, c->logits, c->t);
    if (keep_h) pdde_mark_output(c->h);
    pdde_optimizer_params o = PDDE_OPTIMIZER_PARAMS_INIT;
    o.lr = 0;
    pdde_status st = pdde_backward(c->g, c->loss);
    if (!st) st = pdde_optimizer_adamw(c->g, &o);
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.no_memory_reuse = no_memory_reuse;
    return st ? st : pdde_session_init(c->g, &sp, &c->s);
}

static void classifier_feed(classifier *c, const int32_t *targets) {
    float xs[16 * 8];
    for (int i = 0; i < 16 * 8; i++) xs[i] = sinf((float)i);
    pdde_session_write(c->s, c->x, xs, sizeof xs);
    pdde_session_write(c->s, c->t, targets, 16 * sizeof *targets);
}

static const int32_t class_targets[16] = {0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3};

/* Misuse of the C API as a user writes it from the docs: each refused with an error that names the call
 * and what was wrong, never a crash, a lost training or garbage with status 0. */
static void test_api_misuse(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);

    /* a name twice: a checkpoint would hold two tensors of that name and never load */
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *w = pdde_param(g, "w", 2, (int64_t[]){3, 3}, 0.5f);
    CHECK(w && !pdde_param(g, "w", 2, (int64_t[]){3, 3}, 0.5f) && pdde_graph_status(g) == PDDE_ERR_INVALID_ARG &&
          strstr(pdde_last_error(ctx), "param: the name w is already used"), "a second parameter w: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    pdde_graph_init(ctx, &g);
    pdde_input(g, "x", PDDE_F32, 1, (int64_t[]){3});
    CHECK(!pdde_input(g, "x", PDDE_F32, 1, (int64_t[]){3}) && strstr(pdde_last_error(ctx), "input: the name x is already used"),
          "a second input x: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    { /* ... or given by a rename: the session refuses the graph before it trains and saves */
        pdde_graph_init(ctx, &g);
        pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){2, 3}), *w1 = pdde_param(g, "w1", 2, (int64_t[]){3, 3}, 0.5f);
        pdde_tensor *w2 = pdde_param(g, "w2", 2, (int64_t[]){3, 3}, 0.5f), *h = pdde_matmul(g, pdde_matmul(g, x, w1, 0, 0), w2, 0, 0);
        pdde_session *s = NULL;
        pdde_mark_output(h);
        CHECK(pdde_tensor_set_name(h, "hidden") == PDDE_OK && pdde_tensor_set_name(w2, "w1") == PDDE_OK, "renames");
        CHECK(pdde_session_init(g, NULL, &s) == PDDE_ERR_INVALID_ARG && !s && strstr(pdde_last_error(ctx), "tensors 1 and 2 are both named w1"),
              "a parameter renamed to another's name: %s", pdde_last_error(ctx));
        CHECK(pdde_tensor_set_name(w2, "w2") == PDDE_OK && pdde_session_init(g, NULL, &s) == PDDE_OK, "renamed back: %s", pdde_last_error(ctx));
        pdde_session_free(s);
        pdde_graph_free(g);
    }

    /* a tensor of another graph: its id means another node here */
    classifier a, b;
    CHECK(classifier_init(ctx, &a, 0, 0) == PDDE_OK && classifier_init(ctx, &b, 0, 0) == PDDE_OK, "two classifiers: %s", pdde_last_error(ctx));
    pdde_graph *g2;
    pdde_graph_init(ctx, &g2);
    pdde_tensor *w2 = pdde_param(g2, "w2", 2, (int64_t[]){4, 2}, 0.1f);
    CHECK(!pdde_matmul(g2, a.logits, w2, 0, 0) && pdde_graph_status(g2) == PDDE_ERR_INVALID_ARG &&
          strstr(pdde_last_error(ctx), "matmul: input 0 (matmul.") && strstr(pdde_last_error(ctx), "belongs to another graph"),
          "matmul of another graph's tensor: %s", pdde_last_error(ctx));
    pdde_graph_free(g2);
    pdde_graph_init(ctx, &g2);
    pdde_tensor *y = pdde_input(g2, "y", PDDE_F32, 2, (int64_t[]){16, 8});
    CHECK(!pdde_add(g2, y, a.x) && strstr(pdde_last_error(ctx), "add: input 1 (x) belongs to another graph"), "add: %s", pdde_last_error(ctx));
    pdde_graph_free(g2);
    pdde_graph_init(ctx, &g2);
    pdde_param(g2, "p", 1, (int64_t[]){1}, 0.1f);
    CHECK(pdde_backward(g2, a.loss) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "belongs to another graph"), "backward of another graph's loss: %s",
          pdde_last_error(ctx));
    pdde_graph_free(g2);
    /* b's x is not a's: writes and reads of a's session refuse it */
    CHECK(pdde_session_write(a.s, b.x, (float[16 * 8]){0}, 16 * 8 * sizeof(float)) == PDDE_ERR_INVALID_ARG, "b's x in a's session");
    pdde_session_free(b.s), pdde_graph_free(b.g);

    /* reads after a step: h's memory is reused within the step unless it is an output */
    classifier_feed(&a, class_targets);
    CHECK(pdde_session_run(a.s, PDDE_RUN_STEP) == PDDE_OK, "step: %s", pdde_last_error(ctx));
    float h[16 * 16], h_kept[16 * 16], h_whole[16 * 16], loss, p[8 * 16], grad[8 * 16];
    CHECK(pdde_session_read(a.s, a.h, h, sizeof h) == PDDE_ERR_STATE && strstr(pdde_last_error(ctx), "session_read: gelu.") &&
          strstr(pdde_last_error(ctx), "pdde_mark_output it before pdde_session_init"), "an intermediate is refused: %s", pdde_last_error(ctx));
    CHECK(pdde_session_read(a.s, a.loss, &loss, sizeof loss) == PDDE_OK && loss == pdde_session_loss(a.s), "the loss is readable");
    CHECK(pdde_session_read(a.s, a.w1, p, sizeof p) == PDDE_OK && pdde_session_read(a.s, a.w1->grad, grad, sizeof grad) == PDDE_OK,
          "a parameter and its gradient are readable: %s", pdde_last_error(ctx));
    classifier kept, whole;
    CHECK(classifier_init(ctx, &kept, 1, 0) == PDDE_OK && classifier_init(ctx, &whole, 0, 1) == PDDE_OK, "kept and unreused: %s", pdde_last_error(ctx));
    classifier_feed(&kept, class_targets), classifier_feed(&whole, class_targets);
    CHECK(pdde_session_run(kept.s, PDDE_RUN_STEP) == PDDE_OK && pdde_session_run(whole.s, PDDE_RUN_STEP) == PDDE_OK, "steps");
    CHECK(pdde_session_read(kept.s, kept.h, h_kept, sizeof h_kept) == PDDE_OK && pdde_session_read(whole.s, whole.h, h_whole, sizeof h_whole) == PDDE_OK &&
          !memcmp(h_kept, h_whole, sizeof h_kept), "a marked output reads as without memory reuse: %s", pdde_last_error(ctx));
    pdde_session_free(kept.s), pdde_graph_free(kept.g);
    pdde_session_free(whole.s), pdde_graph_free(whole.g);

    /* a tensor built after compiling is the next session's, not this one's */
    pdde_tensor *late = pdde_relu(a.g, a.logits);
    float late_v[16 * 4];
    CHECK(late && pdde_session_read(a.s, late, late_v, sizeof late_v) == PDDE_ERR_INVALID_ARG &&
          strstr(pdde_last_error(ctx), "is not part of this session's schedule"), "a tensor built after compile: %s", pdde_last_error(ctx));

    /* NULL where a pointer is required */
    CHECK(pdde_session_write(a.s, a.x, NULL, 16 * 8 * sizeof(float)) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "session_write: x: src is NULL"),
          "write from NULL: %s", pdde_last_error(ctx));
    CHECK(pdde_session_read(a.s, a.loss, NULL, sizeof loss) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "session_read: cross_entropy.") &&
          strstr(pdde_last_error(ctx), "dst is NULL"), "read into NULL: %s", pdde_last_error(ctx));
    CHECK(pdde_session_read(a.s, NULL, &loss, sizeof loss) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "session_read: the tensor is NULL"),
          "read of NULL: %s", pdde_last_error(ctx));
    CHECK(pdde_session_write_global(a.s, a.x, NULL, 4) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "session_write_global: src is NULL"),
          "write_global from NULL: %s", pdde_last_error(ctx));
    CHECK(pdde_checkpoint_save(a.s, NULL, NULL) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "checkpoint_save: path is NULL"),
          "save to NULL: %s", pdde_last_error(ctx));
    CHECK(pdde_checkpoint_load(a.s, NULL, NULL) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "checkpoint_load: path is NULL"),
          "load from NULL: %s", pdde_last_error(ctx));
    pdde_data *d;
    CHECK(pdde_data_open(ctx, NULL, &d) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "data_open: path is NULL"), "data from NULL: %s",
          pdde_last_error(ctx));
    pdde_plan plan;
    CHECK(pdde_plan_parse(NULL, &plan) == PDDE_ERR_INVALID_ARG && strstr(plan.why, "NULL"), "plan of NULL text: %s", plan.why);

    /* targets >= V: an error naming the op, the value and its position; a negative one is ignored */
    classifier_feed(&a, (const int32_t[16]){0, 1, 7, -1, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
    CHECK(pdde_session_run(a.s, PDDE_RUN_STEP) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "cross_entropy.") &&
          strstr(pdde_last_error(ctx), "target 7 at position 2 is outside the 4 classes"), "target 7 of 4: %s", pdde_last_error(ctx));
    classifier_feed(&a, (const int32_t[16]){0, 1, -1, -1, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3});
    CHECK(pdde_session_run(a.s, PDDE_RUN_STEP) == PDDE_OK && isfinite(pdde_session_loss(a.s)), "negative targets are ignored: %s", pdde_last_error(ctx));

    /* the graph freed before its session: the session keeps it until it is freed */
    classifier_feed(&a, class_targets);
    mallopt(M_PERTURB, 0x5a); /* (freed memory is overwritten: a session reading a freed graph crashes) */
    pdde_graph_free(a.g);
    char path[300];
    snprintf(path, sizeof path, "%s/freed_graph.ckpt", tmpdir);
    CHECK(pdde_session_run(a.s, PDDE_RUN_STEP) == PDDE_OK && pdde_session_write(a.s, a.t, class_targets, sizeof class_targets) == PDDE_OK &&
          pdde_checkpoint_save(a.s, path, NULL) == PDDE_OK && pdde_checkpoint_load(a.s, path, NULL) == PDDE_OK,
          "run, write, save and load after the graph is freed: %s", pdde_last_error(ctx));
    unlink(path);
    pdde_session_free(a.s); /* (frees the graph: ASan sees a leak or a use after free) */

    /* the context freed before its graph and session: freed with the last graph */
    pdde_context *ctx2;
    CHECK(pdde_context_init(NULL, &ctx2) == PDDE_OK && classifier_init(ctx2, &b, 0, 0) == PDDE_OK, "a classifier: %s", pdde_last_error(ctx2));
    classifier_feed(&b, class_targets);
    pdde_context_free(ctx2);
    CHECK(pdde_session_run(b.s, PDDE_RUN_STEP) == PDDE_OK && isfinite(pdde_session_loss(b.s)), "a step after the context is freed: %s",
          pdde_last_error(ctx2));
    classifier_feed(&b, (const int32_t[16]){0, 1, 9});
    CHECK(pdde_session_run(b.s, PDDE_RUN_STEP) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx2), "target 9 at position 2"),
          "its errors after the context is freed: %s", pdde_last_error(ctx2));
    pdde_session_free(b.s), pdde_graph_free(b.g); /* (the last frees the context: ASan sees a leak or a use after free) */
    mallopt(M_PERTURB, 0);
    pdde_context_free(ctx);
}

static void test_data(void) {
    char path[512], tok[512];
    snprintf(path, sizeof path, "%s/text.txt", tmpdir);
    snprintf(tok, sizeof tok, "%s/text.tok", tmpdir);
    FILE *f = fopen(path, "w");
    for (int i = 0; i < 100; i++) fprintf(f, "line %d of the corpus\n", i);
    fclose(f);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_data *a = NULL, *b = NULL, *c = NULL;
    CHECK(pdde_data_open(ctx, path, &a) == PDDE_OK && pdde_data_write_tokens(ctx, path, tok) == PDDE_OK && pdde_data_open(ctx, tok, &b) == PDDE_OK, "open");
    CHECK(pdde_data_token_count(a) == pdde_data_token_count(b) && pdde_data_token_count(a) > 1000, "token file has the text's tokens");
    CHECK(pdde_data_is_text(a) == 1 && pdde_data_is_text(b) == 0 && pdde_data_is_text(NULL) == 0, "text told from a token file: %d %d",
          pdde_data_is_text(a), pdde_data_is_text(b));
    int32_t x1[4 * 16], y1[4 * 16], x2[4 * 16], y2[4 * 16];
    pdde_data_next_batch(a, 4, 16, 7, x1, y1);
    pdde_data_next_batch(b, 4, 16, 7, x2, y2);
    CHECK(memcmp(x1, x2, sizeof x1) == 0 && memcmp(y1, y2, sizeof y1) == 0, "same seed, same batches");
    CHECK(memcmp(x1 + 1, y1, 15 * 4) == 0, "targets are the next tokens");
    /* resuming at a saved position gives the same next batch */
    uint64_t pos = pdde_data_position(a);
    pdde_data_next_batch(a, 4, 16, 7, x1, y1);
    pdde_data_set_position(b, pos);
    pdde_data_next_batch(b, 4, 16, 7, x2, y2);
    CHECK(memcmp(x1, x2, sizeof x1) == 0, "resume at a position");
    pdde_data_next_batch(a, 4, 16, 8, x1, y1);
    pdde_data_next_batch(b, 4, 16, 7, x2, y2);
    CHECK(memcmp(x1, x2, sizeof x1) != 0, "another seed, other batches");
    /* a permutation: one epoch visits every window once (tokens 0..n-1, so a window names its start) */
    f = fopen(tok, "wb");
    uint64_t n = 1000;
    fwrite("PDDETOK1", 1, 8, f), fwrite(&n, 8, 1, f);
    for (int32_t i = 0; i < (int32_t)n; i++) fwrite(&i, 4, 1, f);
    fclose(f);
    CHECK(pdde_data_open(ctx, tok, &c) == PDDE_OK, "open token file");
    int64_t windows = (int64_t)n - 4;
    char *seen = calloc((size_t)n, 1);
    int32_t wx[4], wy[4];
    int repeats = 0;
    for (int64_t k = 0; k < windows; k++) {
        pdde_data_next_batch(c, 1, 4, 3, wx, wy);
        repeats += seen[wx[0]]++ != 0;
    }
    free(seen);
    CHECK(repeats == 0, "one epoch visits each of %lld windows once (%d repeats)", (long long)windows, repeats);
    pdde_data_close(a), pdde_data_close(b), pdde_data_close(c);
    pdde_context_free(ctx);
    unlink(path), unlink(tok);
}

/* An llm.c token shard at path: its header (magic, version, count) and n tokens of `width` bytes. */
static void write_llmc(const char *path, int32_t magic, int32_t version, int32_t count, const uint32_t *tokens, int n, int width) {
    int32_t header[256] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    fwrite(header, sizeof header, 1, f);
    for (int i = 0; i < n; i++) fwrite(&tokens[i], (size_t)width, 1, f); /* (little-endian: the low bytes) */
    fclose(f);
}

/* llm.c's shards (GPT-2's u16 tokens, LLaMA 3's u32) read as their ids; a wrong version or a count the
 * file does not hold are refused at open naming the file and the field, an id past int32 where it is read;
 * a PDDETOK1 file's negative token ~id is id with no target (-1); the largest id is known (a vocabulary must be larger). A glob
 * opens its files as one corpus: every window inside one file, each visited once an epoch; a file of
 * another format, no match, a file that shrank: refused. */
static void test_data_token_files(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/shard.bin", tmpdir);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    uint32_t tokens[64];
    for (int i = 0; i < 64; i++) tokens[i] = (uint32_t)(i * 787) % 50257; /* (the last one of GPT-2's: 50256, its end of text) */
    tokens[5] = 50256;
    pdde_data *d = NULL;
    write_llmc(path, 20240520, 1, 64, tokens, 64, 2);
    int32_t x[8], y[8];
    CHECK(pdde_data_open(ctx, path, &d) == PDDE_OK && pdde_data_token_count(d) == 64 && pdde_data_max_token(d) == 50256, "a GPT-2 shard: %s",
          pdde_last_error(ctx));
    int in_order = 1; /* (a window's tokens are the file's, in order: find where x starts) */
    if (d && pdde_data_next_batch(d, 1, 8, 1, x, y) == PDDE_OK) {
        int at = -1;
        for (int i = 0; i + 9 <= 64 && at < 0; i++)
            if (tokens[i] == (uint32_t)x[0] && tokens[i + 1] == (uint32_t)x[1]) at = i;
        for (int k = 0; k < 8; k++) in_order &= at >= 0 && (uint32_t)x[k] == tokens[at + k] && (uint32_t)y[k] == tokens[at + k + 1];
    } else in_order = 0;
    CHECK(in_order, "a GPT-2 shard's window holds its u16 tokens in order");
    pdde_data_close(d), d = NULL;
    tokens[7] = 128255; /* (LLaMA 3's last id: past u16) */
    write_llmc(path, 20240801, 7, 64, tokens, 64, 4);
    CHECK(pdde_data_open(ctx, path, &d) == PDDE_OK && pdde_data_max_token(d) == 128255, "a LLaMA 3 shard (u32 ids): %s", pdde_last_error(ctx));
    pdde_data_close(d), d = NULL;
    static const struct { int32_t magic, version, count; int n, width; uint32_t bad; const char *want; } refused[] = {
        {20240520, 2, 64, 64, 2, 0, "header[1], the version, is 2: expected 1"},
        {20240520, 1, 65, 64, 2, 0, "header[2] says 65 tokens, the file holds 128 bytes of tokens"},
        {20240801, 7, 63, 64, 2, 0, "header[2] says 63 tokens, the file holds 128 bytes of tokens (32 of 4 bytes each)"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof *refused; k++) {
        uint32_t t = tokens[3];
        if (refused[k].bad) tokens[3] = refused[k].bad;
        write_llmc(path, refused[k].magic, refused[k].version, refused[k].count, tokens, refused[k].n, refused[k].width);
        tokens[3] = t;
        pdde_status st = pdde_data_open(ctx, path, &d);
        CHECK(st == PDDE_ERR_CORRUPT && !d && strstr(pdde_last_error(ctx), path) && strstr(pdde_last_error(ctx), refused[k].want),
              "refused with '%s': %s: %s", refused[k].want, pdde_status_str(st), pdde_last_error(ctx));
        pdde_data_close(d), d = NULL;
    }
    tokens[3] = 0x80000000u;
    write_llmc(path, 20240801, 7, 64, tokens, 64, 4);
    CHECK(pdde_data_open(ctx, path, &d) == PDDE_OK && pdde_data_max_token(d) == -1 && strstr(pdde_last_error(ctx), "token 3 is 2^31 or more") &&
              pdde_data_next_batch(d, 1, 63, 1, (int32_t[63]){0}, (int32_t[63]){0}) == PDDE_ERR_CORRUPT,
          "an id past int32 is refused where it is read: %s", pdde_last_error(ctx));
    pdde_data_close(d), d = NULL;
    FILE *f = fopen(path, "wb");
    uint64_t n = 4;
    int32_t ids[4] = {1, 2, -7, 3};
    fwrite("PDDETOK1", 1, 8, f), fwrite(&n, 8, 1, f), fwrite(ids, 4, 4, f);
    fclose(f);
    int32_t wx[3] = {0}, wy[3] = {0};
    CHECK(pdde_data_open(ctx, path, &d) == PDDE_OK && pdde_data_max_token(d) == 6 && pdde_data_next_batch(d, 1, 3, 1, wx, wy) == PDDE_OK &&
              wx[0] == 1 && wx[1] == 2 && wx[2] == 6 && wy[0] == 2 && wy[1] == -1 && wy[2] == 3,
          "a negative token ~6 in a token file is id 6, no target: x %d %d %d, y %d %d %d (%s)", wx[0], wx[1], wx[2], wy[0], wy[1], wy[2],
          pdde_last_error(ctx));
    pdde_data_close(d), d = NULL;

    /* a glob of two shards: tokens 0..99 and 1000..1099 */
    char pattern[512], second[512];
    snprintf(pattern, sizeof pattern, "%s/shard_*.bin", tmpdir);
    snprintf(path, sizeof path, "%s/shard_0.bin", tmpdir);
    snprintf(second, sizeof second, "%s/shard_1.bin", tmpdir);
    uint32_t part[100];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 100; i++) part[i] = (uint32_t)(k * 1000 + i);
        write_llmc(k ? second : path, 20240520, 1, 100, part, 100, 2);
    }
    enum { W = 8 };
    CHECK(pdde_data_open(ctx, pattern, &d) == PDDE_OK && pdde_data_token_count(d) == 200 && pdde_data_max_token(d) == 1099, "a glob of 2 shards: %s",
          pdde_last_error(ctx));
    int seen[2][100] = {{0}}, inside = 1, repeats = 0;
    for (int k = 0; d && k < 2 * (100 - W); k++) {
        int32_t wx[W], wy[W];
        if (pdde_data_next_batch(d, 1, W, 5, wx, wy) != PDDE_OK) { inside = 0; break; }
        for (int i = 0; i < W; i++) inside &= wx[i] == wx[0] + i && wy[i] == wx[0] + i + 1 && wx[0] % 1000 + W < 100;
        if (inside) repeats += seen[wx[0] / 1000][wx[0] % 1000]++ != 0;
    }
    CHECK(inside && repeats == 0, "a glob's windows lie inside one shard each, each visited once an epoch (%d repeats)", repeats);
    pdde_data_close(d), d = NULL;
    CHECK(pdde_data_open_part(ctx, pattern, 0.9, 1.0, &d) == PDDE_OK && pdde_data_token_count(d) == 20 && pdde_data_max_token(d) == 1099,
          "the last 10%% of a glob is the last shard's last 20 tokens: %s", pdde_last_error(ctx));
    pdde_data_close(d), d = NULL;
    /* windows aligned to documents' starts (pdde_data_align_windows): two token files of documents 1 to 13 tokens
     * long, each starting with id 1 (a prompt's start stored as ~1 in the second); every window starts at one whose
     * window fits its file (of a run of starts, as a one-token document's, the last), each such start once an epoch;
     * another start token, or none fitting, refused by name */
    char docs_glob[512], docs_path[2][512];
    snprintf(docs_glob, sizeof docs_glob, "%s/docs_*.bin", tmpdir);
    int n_eligible = 0, doc_at[2][100] = {{0}};
    for (int k = 0; k < 2; k++) {
        int32_t docs[100];
        for (int i = 0, next = 0, len = 1; i < 100; i++) {
            if (i == next) doc_at[k][i] = 1, len = len % 11 + 2 * k + 1, next = i + len;
            docs[i] = doc_at[k][i] ? (k && i % 2 ? ~1 : 1) : 1000 * (k + 1) + i;
        }
        for (int i = 0; i + W < 100; i++) n_eligible += doc_at[k][i] && !doc_at[k][i + 1];
        snprintf(docs_path[k], sizeof docs_path[k], "%s/docs_%d.bin", tmpdir, k);
        FILE *tf = fopen(docs_path[k], "wb");
        uint64_t count = 100;
        fwrite("PDDETOK1", 1, 8, tf), fwrite(&count, 8, 1, tf), fwrite(docs, 4, 100, tf);
        fclose(tf);
    }
    int aligned = pdde_data_open(ctx, docs_glob, &d) == PDDE_OK && pdde_data_next_batch(d, 1, W, 5, x, y) == PDDE_OK &&
                  pdde_data_align_windows(d, 1) == PDDE_OK && pdde_data_position(d) == 0, starts_seen = 0;
    memset(seen, 0, sizeof seen), repeats = 0;
    for (int k = 0; aligned && k < n_eligible; k++) {
        int32_t wx[W], wy[W], file = -1, at = -1;
        aligned = pdde_data_next_batch(d, 1, W, 5, wx, wy) == PDDE_OK && wx[0] == 1;
        for (int j = 1; j < W && file < 0; j++) /* (where the window is: its first token that starts no document) */
            if (wx[j] != 1) file = wx[j] / 1000 - 1, at = wx[j] % 1000 - j;
        aligned &= file >= 0 && file < 2 && at >= 0 && at + W < 100 && doc_at[file][at] && !doc_at[file][at + 1];
        if (aligned) repeats += seen[file][at]++ != 0, starts_seen++;
    }
    CHECK(aligned && repeats == 0 && starts_seen == n_eligible, "aligned windows start at the %d documents' starts that fit, each once an "
          "epoch (%d seen, %d repeats): %s", n_eligible, starts_seen, repeats, pdde_last_error(ctx));
    pdde_status st = pdde_data_align_windows(d, 7);
    if (st == PDDE_OK) st = pdde_data_next_batch(d, 1, W, 5, x, y);
    CHECK(st == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "none of the 0 starts in") && strstr(pdde_last_error(ctx), "docs_0.bin and the files after"),
          "aligned to a token no document starts with: %s", pdde_last_error(ctx));
    CHECK(pdde_data_align_windows(d, -1) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "start token -1"), "a negative start token: %s",
          pdde_last_error(ctx));
    pdde_data_close(d), d = NULL;
    unlink(docs_path[0]), unlink(docs_path[1]);
    f = fopen(second, "w"); /* (the second shard is text now) */
    fputs("some text of more than sixteen bytes\n", f);
    fclose(f);
    st = pdde_data_open(ctx, pattern, &d);
    CHECK(st == PDDE_ERR_INVALID_ARG && !d && strstr(pdde_last_error(ctx), "is an llm.c shard of GPT-2 tokens but") &&
              strstr(pdde_last_error(ctx), "is text"), "a glob of two formats is refused: %s", pdde_last_error(ctx));
    unlink(second);
    snprintf(second, sizeof second, "%s/none_*.bin", tmpdir);
    st = pdde_data_open(ctx, second, &d);
    CHECK(st == PDDE_ERR_NOT_FOUND && strstr(pdde_last_error(ctx), "no file matches"), "a glob without a match: %s", pdde_last_error(ctx));
    /* a glob of more shards than the process may hold files open (300 under a limit of 64): opened and read */
    char dir[400];
    snprintf(dir, sizeof dir, "%.300s/many", tmpdir);
    mkdir(dir, 0700);
    for (int k = 0; k < 300; k++) {
        char shard[600];
        snprintf(shard, sizeof shard, "%s/s%03d.bin", dir, k);
        for (int i = 0; i < 20; i++) part[i] = (uint32_t)(k * 20 + i);
        write_llmc(shard, 20240520, 1, 20, part, 20, 2);
    }
    struct rlimit was, few = {64, 64};
    getrlimit(RLIMIT_NOFILE, &was);
    few.rlim_max = was.rlim_max, setrlimit(RLIMIT_NOFILE, &few);
    snprintf(pattern, sizeof pattern, "%s/s*.bin", dir);
    int64_t n_many = -1;
    st = pdde_data_open(ctx, pattern, &d);
    if (!st) n_many = pdde_data_token_count(d);
    for (int k = 0; !st && k < 120; k++) st = pdde_data_next_batch(d, 1, W, 5, (int32_t[W]){0}, (int32_t[W]){0});
    setrlimit(RLIMIT_NOFILE, &was);
    CHECK(st == PDDE_OK && n_many == 6000, "a glob of 300 shards under a limit of 64 open files: %lld tokens, %s: %s", (long long)n_many,
          pdde_status_str(st), st ? pdde_last_error(ctx) : "");
    pdde_data_close(d), d = NULL;
    char rm[600];
    snprintf(rm, sizeof rm, "rm -rf %s", dir);
    if (system(rm)) {}
    /* a file that shrinks after it was opened: an error where a window reads past its end, not a crash */
    CHECK(pdde_data_open(ctx, path, &d) == PDDE_OK && truncate(path, 1024 + 20) == 0, "open, then truncate");
    st = PDDE_OK;
    for (int k = 0; k < 100 && !st; k++) st = pdde_data_next_batch(d, 1, W, 5, (int32_t[W]){0}, (int32_t[W]){0});
    CHECK(st == PDDE_ERR_IO && strstr(pdde_last_error(ctx), "shorter than when it was opened"), "a shrunk file: %s", pdde_last_error(ctx));
    pdde_data_close(d);
    pdde_context_free(ctx);
    unlink(path);
}

static void test_dtypes(void) {
    float vals[] = {0.0f, 1.0f, -2.5f, 65504.0f, 1e-7f, 3.14159f, -1e-3f};
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
        float h = pdde_f16_to_f32(pdde_f32_to_f16(vals[i])), b = pdde_bf16_to_f32(pdde_f32_to_bf16(vals[i]));
        CHECK(test_close(h, vals[i], 1e-3, 1e-7), "f16 round trip of %g gave %g", vals[i], h);
        CHECK(test_close(b, vals[i], 1e-2, 0), "bf16 round trip of %g gave %g", vals[i], b);
    }
    CHECK(isinf(pdde_f16_to_f32(pdde_f32_to_f16(1e6f))), "f16 overflow is inf");
    float sub = pdde_f16_to_f32(pdde_f32_to_f16(3e-6f)); /* an f16 subnormal (unit 2^-24) */
    CHECK(fabsf(sub - 3e-6f) <= 0x1p-25f, "f16 subnormal round trip of 3e-6 gave %g", sub);
    CHECK(pdde_f32_to_f16(0x1p-24f) == 1 && pdde_f32_to_f16(0x1p-25f) == 0, "smallest subnormal, ties to even");
    CHECK(pdde_dtype_size(PDDE_BF16) == 2 && pdde_dtype_size(PDDE_I64) == 8, "sizes");
    CHECK(strcmp(pdde_status_str(PDDE_ERR_SHAPE), "shape mismatch") == 0, "status strings");
}

/* pdde_log_set: what the library says on its own reaches the program's function, a line a call with
 * its level (a context asked for more threads than allowed: a warning; PDDE_PROFILE=1's report: info),
 * and NULL gives stderr back */
typedef struct {
    int warnings, info, newlines;
    char first_warning[256];
} log_seen;

static void note_log(pdde_log_level level, const char *line, void *user) {
    log_seen *seen = user;
    if (level == PDDE_LOG_WARN && !seen->warnings++) snprintf(seen->first_warning, sizeof seen->first_warning, "%s", line);
    seen->info += level == PDDE_LOG_INFO;
    seen->newlines += strchr(line, '\n') != NULL;
}

static void test_log(void) {
    log_seen seen = {0};
    pdde_log_set(note_log, &seen);
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 100000;
    pdde_context *ctx = NULL;
    CHECK(pdde_context_init(&cp, &ctx) == PDDE_OK && seen.warnings == 1 && strstr(seen.first_warning, "100000 threads asked for"),
          "a capped thread count is one warning through pdde_log_set: %d warnings, '%s'", seen.warnings, seen.first_warning);
    pdde_context_free(ctx);
    setenv("PDDE_PROFILE", "1", 1);
    pdde_context_init(NULL, &ctx);
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_input(g, "x", PDDE_F32, 2, (int64_t[]){2, 3});
    pdde_tensor *loss = pdde_mean(g, pdde_matmul(g, x, pdde_param(g, "w", 2, (int64_t[]){3, 4}, 0.3f), 0, 0), -1, 0);
    pdde_session *s = NULL;
    CHECK(!pdde_backward(g, loss) && !pdde_optimizer_adamw(g, NULL) && !pdde_session_init(g, NULL, &s) && !pdde_session_run(s, PDDE_RUN_STEP),
          "a profiled step: %s", pdde_last_error(ctx));
    pdde_session_free(s); /* (the PDDE_PROFILE report: a line per op, at info) */
    unsetenv("PDDE_PROFILE");
    CHECK(seen.info >= 3 && seen.newlines == 0, "the profile report went to the log as %d info lines (%d with a newline)", seen.info, seen.newlines);
    pdde_graph_free(g);
    pdde_context_free(ctx);
    pdde_log_set(NULL, NULL);
    int before = seen.warnings;
    pdde_context_init(&cp, &ctx); /* (to stderr now) */
    CHECK(seen.warnings == before, "after pdde_log_set(NULL) the log is stderr's again: %d more warnings here", seen.warnings - before);
    pdde_context_free(ctx);
}

int main(void) {
    /* ranks are fork()ed from this process: device runtimes (PoCL's threads) do not survive a fork */
    setenv("PDDE_BACKENDS", "cpu", 0);
    snprintf(tmpdir, sizeof tmpdir, "/tmp/pdde_test_core.XXXXXX");
    if (!mkdtemp(tmpdir)) return 1;
    test_log();
    test_memory_plan();
    test_grad_accumulation();
    test_sgd_and_schedule();
    test_checkpoints();
    test_checkpoint_weights_only();
    test_killed_save();
    test_bad_input();
    test_api_misuse();
    test_data();
    test_data_token_files();
    test_dtypes();
    rmdir(tmpdir);
    return test_finish();
}
