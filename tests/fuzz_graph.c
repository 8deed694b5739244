/* fuzz_graph — a fuzz target for graph building: the input bytes are a program of random leaves and
 * ops with random shapes (zeros, negatives, absurd sizes, NULL operands, bad axes, NaN constants),
 * then autodiff, an optimizer with random hyperparameters, sometimes a mesh, annotations and
 * completion, and, when the graph is small enough, a session that runs a step on random data.
 * Whatever the program, the library must return errors, never crash, hang or trip a sanitizer.
 *
 * Built by `make test-fuzz` with clang's libFuzzer under AddressSanitizer and UBSan; without
 * libFuzzer (or with -DFUZZ_DRIVER) main() below feeds it seeded random inputs:
 *     fuzz_graph [seconds] [seed]          (the smoke run in `make test`) */
#define _GNU_SOURCE
#include "pdde.h"
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct { const uint8_t *p; size_t n, at; } reader;

static uint32_t next_u8(reader *r) { return r->at < r->n ? r->p[r->at++] : 0; }
static bool more(const reader *r) { return r->at < r->n; }

/* A dim: mostly small, sometimes 0, negative or absurd. */
static int64_t next_dim(reader *r) {
    static const int64_t dims[] = {1, 2, 3, 4, 5, 8, 2, 3, 4, 0, 1, 6, 7, -1, (int64_t)1 << 31, (int64_t)1 << 62};
    return dims[next_u8(r) % 16];
}

static float next_float(reader *r) {
    static const float vals[] = {0.0f, 0.1f, 1.0f, -1.0f, 0.5f, 2.0f, 1e-3f, 0.02f, 1e30f, -0.5f, 0.9f, 0.999f, NAN, INFINITY, 1e-8f, 3.0f};
    return vals[next_u8(r) % 16];
}

#define POOL 24

typedef struct {
    pdde_graph *g;
    pdde_tensor *t[POOL];
    int n;
} fuzz_state;

static pdde_tensor *pick(fuzz_state *f, reader *r) {
    uint32_t k = next_u8(r);
    if (f->n == 0 || k == 255) return NULL; /* a NULL operand now and then */
    return f->t[k % (uint32_t)f->n];
}

static void push(fuzz_state *f, pdde_tensor *t) {
    if (!t) return;
    if (f->n < POOL) f->t[f->n++] = t;
    else f->t[POOL - 1] = t;
}

static pdde_tensor *leaf(fuzz_state *f, reader *r, int kind) {
    int ndim = (int)(next_u8(r) % 5);
    if (next_u8(r) == 7) ndim = 7; /* too many dims */
    int64_t shape[8];
    for (int d = 0; d < 8; d++) shape[d] = next_dim(r);
    char name[32];
    snprintf(name, sizeof name, "leaf%d", f->n);
    if (kind == 0) return pdde_param(f->g, name, ndim, shape, next_float(r));
    pdde_dtype dt = kind == 1 ? PDDE_F32 : kind == 2 ? PDDE_I32 : (pdde_dtype)(next_u8(r) % 7);
    return pdde_input(f->g, name, dt, ndim, shape);
}

static void one_op(fuzz_state *f, reader *r) {
    pdde_graph *g = f->g;
    pdde_tensor *a = pick(f, r), *b = pick(f, r), *c = pick(f, r), *y = NULL;
    int i0 = (int)next_u8(r) % 9 - 2, i1 = (int)next_u8(r) % 9 - 2;
    switch (next_u8(r) % 41) {
    case 0: y = leaf(f, r, 0); break;
    case 1: y = leaf(f, r, 1); break;
    case 2: y = leaf(f, r, 2); break;
    case 3: y = pdde_add(g, a, b); break;
    case 4: y = pdde_sub(g, a, b); break;
    case 5: y = pdde_mul(g, a, b); break;
    case 6: y = pdde_scale(g, a, next_float(r)); break;
    case 7: y = i0 & 1 ? pdde_gelu(g, a) : i0 & 2 ? pdde_relu(g, a) : pdde_silu(g, a); break;
    case 8: y = pdde_layernorm(g, a, b, c, next_float(r)); break;
    case 9: y = pdde_rmsnorm(g, a, b, next_float(r)); break;
    case 10: y = pdde_softmax(g, a, i0 & 1); break;
    case 11: y = pdde_attention(g, a, b, c); break;
    case 12: y = pdde_cross_entropy(g, a, b); break;
    case 13: y = pdde_embedding(g, a, b); break;
    case 14: {
        int64_t shape[8];
        for (int d = 0; d < 8; d++) shape[d] = next_dim(r);
        y = pdde_reshape(g, a, i0 + 2, shape);
        break;
    }
    case 15: {
        int perm[PDDE_MAX_DIMS];
        for (int d = 0; d < PDDE_MAX_DIMS; d++) perm[d] = (int)next_u8(r) % 7 - 1;
        y = pdde_permute(g, a, perm);
        break;
    }
    case 16: y = pdde_transpose(g, a, i0, i1); break;
    case 17: {
        pdde_tensor *xs[PDDE_MAX_SRC] = {a, b, c, a, b, c};
        y = pdde_concat(g, i0 + 1, xs, i1);
        break;
    }
    case 18: y = pdde_slice(g, a, i0, next_dim(r), next_dim(r)); break;
    case 19: {
        pdde_tensor *out[8];
        y = pdde_split(g, a, i0, i1 + 2, i1 + 2 <= 8 ? out : NULL);
        break;
    }
    case 20: y = pdde_sum(g, a, i0, i1 & 1); break;
    case 21: y = pdde_mean(g, a, i0, i1 & 1); break;
    case 22: y = pdde_dropout(g, a, next_float(r), next_u8(r)); break;
    case 23: y = pdde_cast(g, a, (pdde_dtype)(next_u8(r) % 7 - 1)); break;
    case 24: case 25: y = pdde_matmul(g, a, b, i0 & 1, i1 & 1); break;
    case 26: y = pdde_bias_add(g, a, b); break;
    case 27: pdde_graph_set_layer(g, i0 * 3); break;
    case 28: pdde_mark_output(a); break;
    case 29: pdde_graph_set_recompute(g, i0, 1); break;
    case 30: y = pdde_bias_gelu(g, a, b); break;
    case 31: /* (the packed form with b as its starts where i0 says so) */
        y = i0 & 1 ? pdde_attention_unfused(g, a, b, c) : i0 & 2 ? pdde_attention_qkv_docs(g, a, i1 + 1, b) : pdde_attention_qkv(g, a, i1 + 1);
        break;
    /* Mixture-of-Experts: routing (k, experts and capacity small, zero or negative; flags any) and the expert path */
    case 32: y = pdde_moe_topk(g, a, i0 & 1 ? b : NULL, i1, next_u8(r)); break;
    case 33: y = pdde_moe_gate(g, a, b, next_u8(r)); break;
    case 34: y = pdde_moe_counts(g, a, i0 * 2); break;
    case 35: y = pdde_moe_dispatch(g, a, b, i0 * 2, next_dim(r)); break;
    case 36: y = pdde_moe_dispatch_experts(g, a, b, i0 * 2, next_dim(r)); break;
    case 37: y = pdde_moe_grouped_matmul(g, a, b, c, next_dim(r), i1 & 1); break;
    case 38: y = pdde_moe_combine(g, a, b, c, i0 * 2, next_dim(r)); break;
    case 39: y = pdde_moe_aux_loss(g, a, b, i0 * 2); break;
    case 40: y = pdde_rope(g, a, i0 & 1 ? next_float(r) : 10000.0f); break; /* (a base of 0, negative, NaN or infinite sometimes) */
    }
    push(f, y);
}

/* Random bytes into every input of a session (ids within a small range, sometimes out of it). */
static void fill_inputs(pdde_session *s, pdde_graph *g, reader *r) {
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = pdde_graph_tensor(g, i);
        if (!(t->flags & PDDE_TENSOR_INPUT)) continue;
        size_t n = pdde_tensor_nbytes(t);
        uint8_t *buf = malloc(n + 4);
        if (!buf) continue;
        for (size_t k = 0; k < n; k += 4) {
            uint32_t v = next_u8(r);
            if (t->dtype == PDDE_I32) v = v % 10 - 1; /* ids and targets: -1..8 */
            else if (t->dtype == PDDE_F32) { float x = (float)v / 64.0f - 1.0f; memcpy(&v, &x, 4); }
            memcpy(buf + k, &v, n - k < 4 ? n - k : 4);
        }
        pdde_session_write(s, t, buf, n);
        free(buf);
    }
}

static pdde_context *fuzz_ctx;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!fuzz_ctx) {
        pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
        cp.backends = "cpu", cp.n_threads = 1;
        if (pdde_context_init(&cp, &fuzz_ctx)) return 0;
    }
    reader r = {data, size, 0};
    fuzz_state f = {0};
    if (pdde_graph_init(fuzz_ctx, &f.g)) return 0;
    int n_ops = (int)next_u8(&r) % 24 + 1;
    push(&f, leaf(&f, &r, 1));
    push(&f, leaf(&f, &r, 0));
    for (int k = 0; k < n_ops && more(&r); k++) one_op(&f, &r);
    /* a scalar loss from the last tensor */
    pdde_tensor *last = f.n ? f.t[f.n - 1] : NULL;
    pdde_tensor *loss = last && last->dtype == PDDE_F32 ? pdde_mean(f.g, last, -1, 0) : NULL;
    uint32_t flags = next_u8(&r);
    if (loss && (flags & 1)) pdde_backward(f.g, loss);
    if (flags & 2) {
        pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
        op.lr = next_float(&r), op.clip_norm = next_float(&r), op.weight_decay = next_float(&r);
        op.beta1 = next_float(&r), op.grad_accum_steps = (int)next_u8(&r) % 3;
        if (flags & 4) pdde_optimizer_sgd(f.g, &op);
        else pdde_optimizer_adamw(f.g, &op);
    }
    if (flags & 8) { /* distributed attributes: a random mesh, data parallel, completion */
        int shape[3] = {(int)next_u8(&r) % 4, (int)next_u8(&r) % 4 + 1, 2};
        const char *names[3] = {"dp", "tp", "pp"};
        int ndim = (int)next_u8(&r) % 3 + 1;
        const pdde_mesh *mesh = pdde_mesh_create(f.g, ndim, shape, names, NULL);
        if (mesh) {
            pdde_strategy_data_parallel(f.g, mesh, "dp");
            if (flags & 16) pdde_strategy_zero(f.g, mesh, "dp", (int)next_u8(&r) % 5 - 1);
            if (pdde_complete_dist_attrs(f.g) == PDDE_OK && (flags & 32)) {
                FILE *null = fopen("/dev/null", "w");
                if (null) pdde_graph_dump_dist(f.g, null), fclose(null);
            }
        }
    } else if (pdde_graph_status(f.g) == PDDE_OK) {
        /* small graphs run: every node's bytes summed stay under 4 MB */
        double bytes = 0;
        for (int i = 0; i < pdde_graph_tensor_count(f.g); i++) bytes += (double)pdde_tensor_nbytes(pdde_graph_tensor(f.g, i));
        pdde_session *s = NULL;
        if (bytes < 4e6 && pdde_session_init(f.g, NULL, &s) == PDDE_OK) {
            fill_inputs(s, f.g, &r);
            pdde_session_run(s, flags & 64 ? PDDE_RUN_FORWARD : PDDE_RUN_STEP);
            pdde_session_run(s, PDDE_RUN_FORWARD);
            if (loss) {
                float v;
                pdde_session_read(s, loss, &v, sizeof v);
            }
            pdde_session_free(s);
        }
    }
    pdde_graph_free(f.g);
    return 0;
}

#if !defined(FUZZ_LIBFUZZER)
/* The seeded driver: random programs for `seconds` (default 10), each from an xorshift stream. */
int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint8_t buf[512];
    long runs = 0;
    for (;; runs++) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > seconds) break;
        uint64_t x = seed * 0x9E3779B97F4A7C15ull + (uint64_t)runs + 1;
        size_t n = 16 + (size_t)(x % (sizeof buf - 16));
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = (uint8_t)(x >> 24);
        }
        LLVMFuzzerTestOneInput(buf, n);
    }
    pdde_context_free(fuzz_ctx);
    printf("fuzz_graph: %ld random programs in %.0f s (seed %llu), no crash\n", runs, seconds, (unsigned long long)seed);
    printf("1 passed, 0 failed\n");
    return 0;
}
#endif
