/* test_attention_dispatch — which kernels the GPU dispatcher (backends/gpu_dispatch.h) launches for an
 * attention node on a CUDA device, and whether each launch's arguments match the kernel's parameters in
 * the PTX the CUDA backend loads (backends/cuda_kernels_ptx.h), where there is no GPU: the dispatcher
 * runs with a recording pgd_ctx holding the CUDA backend's attention settings (PGD_CUDA_ATTENTION_*,
 * PGD_CUDA_FLASH, which backends/cuda.c's dispatcher takes, and its 64-row groups of 128 items). Checked, for q, k, v apart and packed in qkv (pdde_attention_qkv),
 * at head sizes 64 and 128, forward and backward: by default flash2 apart and flash packed; named
 * flash2 takes flash2's packed kernels (k_flash2_*_qkv); named flash takes flash in both layouts; f32
 * q, k, v take the unfused path by default and the f32 tiled kernels (k_flash_f32_*) where flash or
 * flash2 is named (by PDDE_CUDA_ATTENTION or PDDE_ATTENTION; flash2: the one-pass backward after dq is
 * zeroed), with their own grid (backends/flash_f32_tiles.h). Also a layernorm's kernels with and without PGD_MEM_LN2 (the
 * warp-per-row kernels' instances, rows up to 768, 1024, 1664, 2048 wide; wider rows the group-per-row kernels). And rope:
 * CUDA takes it only under PDDE_CUDA_ROPE=1 (pgd_cuda_takes_rope; pgd_supports_op, which every GPU backend asks, never),
 * its forward and backward launch k_rope, heads up to D 256. Every launch: the PTX (compute_80 and compute_75) has the kernel, with as
 * many parameters as the launch passes, each of the launch's size. Nodes with starts (pdde_attention_docs,
 * pdde_attention_qkv_docs): bf16 takes flash by default and flash2's *_docs kernels (each variant) where flash2 is
 * named, f32 the unfused path where flash or flash2 is named (said once), and the tiled kernels get the starts; nodes
 * without starts never run a *_docs kernel. */
#define _GNU_SOURCE
#include "pdde_extension.h"
#include "tests/test_util.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "backends/gpu_dispatch.h"
#include "backends/cuda_kernels_ptx.h"
#pragma GCC diagnostic pop

enum { MAX_LAUNCHES = 64 };
static int launched[MAX_LAUNCHES], n_launched;
static unsigned flash2_variant; /* the recording pgd_ctx's (PGD_FLASH2_*, as backends/cuda.c reads PDDE_FLASH2_VARIANT) */
static unsigned launched_gx[MAX_LAUNCHES], launched_bx[MAX_LAUNCHES];
static char *ptx, *ptx75;
static int with_starts; /* attention() builds the nodes with starts (pdde_attention_docs, pdde_attention_qkv_docs) */
static int starts_passed; /* launches of tiled kernels given a non-null starts */

/* The parameter sizes (bytes) of PTX entry name, in order; their count, or -1 where there is no such entry. */
static int ptx_params(const char *text, const char *name, int *sizes, int max) {
    char want[128];
    snprintf(want, sizeof want, ".entry %s(", name);
    const char *p = strstr(text, want);
    if (!p) return -1;
    const char *end = strchr(p, ')');
    int n = 0;
    for (const char *q = strstr(p, ".param"); q && q < end && n < max; q = strstr(q + 6, ".param")) {
        char ty[16] = "";
        int align, bytes;
        if (sscanf(q, ".param .align %d .b8 %*[A-Za-z0-9_][%d]", &align, &bytes) == 2) { /* (a struct by value: its bytes) */
            sizes[n++] = bytes;
            continue;
        }
        if (sscanf(q, ".param .%15s", ty) != 1) return -1;
        sizes[n++] = ty[1] == '6' ? 8 : ty[1] == '3' ? 4 : ty[1] == '1' ? 2 : ty[1] == '8' ? 1 : 0; /* (.u64 .f32 .b16 .u8 ...) */
    }
    return n;
}

/* The .maxntid of PTX entry name (its __launch_bounds__' threads), or 0 where it has none */
static unsigned ptx_maxntid(const char *text, const char *name) {
    char want[128];
    snprintf(want, sizeof want, ".entry %s(", name);
    const char *p = strstr(text, want), *body = p ? strchr(p, '{') : NULL, *m = p ? strstr(p, ".maxntid") : NULL;
    unsigned n = 0;
    return m && m < body && sscanf(m, ".maxntid %u", &n) == 1 ? n : 0;
}

static int rec_launch(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, int nargs,
                      const pgd_arg *args) {
    (void)impl, (void)stream, (void)gy, (void)gz, (void)by;
    if (n_launched < MAX_LAUNCHES) launched_gx[n_launched] = gx, launched_bx[n_launched] = bx, launched[n_launched++] = k;
    const char *name = pgd_kernel_name(k);
    if (!strncmp(name, "k_flash_fwd", 11) || !strncmp(name, "k_flash_back", 12)) { /* (starts: the argument after H) */
        int at = !strncmp(name, "k_flash_fwd", 11) ? 10 : 13;
        starts_passed += nargs > at && args[at].is_ptr && ((const pgd_ptr *)args[at].p)->base != 0;
    }
    size_t len = strlen(name);
    int docs_kernel = len > 5 && !strcmp(name + len - 5, "_docs"); /* (flash2's twins: starts and heads their last arguments) */
    CHECK(docs_kernel == with_starts || !strncmp(name, "k_flash2_prep", 13) || strncmp(name, "k_flash2", 8),
          "%s: launched for a node %s starts", name, with_starts ? "with" : "without");
    if (docs_kernel) starts_passed += nargs >= 2 && args[nargs - 2].is_ptr && ((const pgd_ptr *)args[nargs - 2].p)->base != 0;
    unsigned most = ptx_maxntid(ptx, name); /* (a group larger than the kernel's launch bounds fails to launch) */
    CHECK(!most || bx * by <= most, "%s: launched with groups of %u items, its launch bounds allow %u", name, bx * by, most);
    for (int m = 0; m < 2; m++) { /* (the compute_75 module has every kernel too: the backend looks each up there) */
        int sizes[32], n = ptx_params(m ? ptx75 : ptx, name, sizes, 32), same = n == nargs;
        for (int i = 0; same && i < n; i++) same = sizes[i] == (int)(args[i].is_ptr ? 8 : args[i].size);
        CHECK(same, "%s: the launch passes %d arguments, the %s PTX entry has %d parameters (or their sizes differ)", name, nargs,
              m ? "compute_75" : "compute_80", n);
    }
    return 0;
}
static int rec_scratch(void *impl, void *stream, size_t nbytes, pgd_ptr *out) {
    (void)impl, (void)stream, (void)nbytes;
    *out = (pgd_ptr){4096, 0};
    return 0;
}
static int rec_fill32(void *impl, void *stream, pgd_ptr dst, uint32_t value, size_t count) {
    (void)impl, (void)stream, (void)dst, (void)value, (void)count;
    return 0;
}

/* The kernels one attention node (op) of graph g launches, as names joined by spaces, into out. */
static void kernels_of(pdde_context *ctx, pdde_graph *g, pdde_op op, char *out, size_t cap) {
    pgd_ctx c = {.ctx = ctx, .name = "cuda", .units = 132, .max_block = 1024, .launch = rec_launch, .scratch = rec_scratch,
                 .fill32 = rec_fill32, .attention_env = PGD_CUDA_ATTENTION_ENV, .attention_default = PGD_CUDA_ATTENTION_DEFAULT,
                 .has_flash = PGD_CUDA_FLASH, .flash_rows = 64, .flash_threads = 128, .flash2_variant = flash2_variant};
    out[0] = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = (pdde_tensor *)pdde_graph_tensor(g, i);
        if (t->op != op) continue;
        n_launched = 0;
        int e = pgd_attention(&c, t);
        CHECK(e == 0, "the dispatcher failed: %s", pdde_last_error(ctx));
        size_t len = 0;
        for (int j = 0; j < n_launched && len + 40 < cap; j++)
            len += (size_t)snprintf(out + len, cap - len, "%s%s", j ? " " : "", pgd_kernel_name(launched[j]));
        return;
    }
}

/* An attention graph of head size D under compute dtype dt, q, k, v apart or packed, with its backward. */
static pdde_graph *attention(pdde_context *ctx, int D, pdde_dtype dt, int packed) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    int64_t B = 2, H = 3, T = 100, s[4] = {B, H, T, D};
    pdde_tensor *y, *starts = with_starts ? pdde_input(g, "starts", PDDE_I32, 2, (int64_t[]){B, T}) : NULL;
    if (starts) starts->data = (void *)(uintptr_t)8192; /* (a device address the launches pass on) */
    if (packed) {
        pdde_tensor *qkv = pdde_param(g, "qkv", 3, (int64_t[]){B, T, H * 3 * D}, 0.0f);
        pdde_graph_set_compute_dtype(g, dt);
        y = starts ? pdde_attention_qkv_docs(g, qkv, (int)H, starts) : pdde_attention_qkv(g, qkv, (int)H);
    } else {
        pdde_tensor *q = pdde_param(g, "q", 4, s, 0.0f), *k = pdde_param(g, "k", 4, s, 0.0f), *v = pdde_param(g, "v", 4, s, 0.0f);
        pdde_graph_set_compute_dtype(g, dt);
        y = starts ? pdde_attention_docs(g, q, k, v, starts) : pdde_attention(g, q, k, v);
    }
    pdde_graph_set_compute_dtype(g, PDDE_F32);
    pdde_backward(g, pdde_sum(g, y, -1, 0));
    CHECK(pdde_graph_status(g) == PDDE_OK, "the graph: %s", pdde_last_error(ctx));
    return g;
}

static void expect(pdde_context *ctx, const char *env, int D, pdde_dtype dt, int packed, const char *fwd, const char *back) {
    if (env) setenv("PDDE_CUDA_ATTENTION", env, 1);
    else unsetenv("PDDE_CUDA_ATTENTION");
    pdde_graph *g = attention(ctx, D, dt, packed);
    char got_f[512], got_b[512];
    kernels_of(ctx, g, PDDE_OP_ATTENTION, got_f, sizeof got_f);
    kernels_of(ctx, g, PDDE_OP_ATTENTION_BACK, got_b, sizeof got_b);
    const char *what = packed ? "packed" : "apart";
    printf("%-7s D %3d %-4s %-6s: %s | %s\n", env ? env : "default", D, pdde_dtype_name(dt), what, got_f, got_b);
    if (fwd) CHECK(!strcmp(got_f, fwd), "PDDE_CUDA_ATTENTION=%s D %d %s %s forward: %s, want %s", env ? env : "", D, pdde_dtype_name(dt), what, got_f, fwd);
    if (back) CHECK(!strcmp(got_b, back), "PDDE_CUDA_ATTENTION=%s D %d %s %s backward: %s, want %s", env ? env : "", D, pdde_dtype_name(dt), what, got_b, back);
    if (!fwd) CHECK(!strstr(got_f, "flash") && !strstr(got_b, "flash"), "D %d %s %s: a tiled kernel ran: %s | %s", D, pdde_dtype_name(dt), what, got_f, got_b);
    pdde_graph_free(g);
}

/* The kernels of the layernorm graph x [R, C] (forward, dx, dgamma) with the memory-bound kernels mk (PGD_MEM_*), as
 * "forward | dx | dgamma" */
static void layernorm_kernels(pdde_context *ctx, int64_t R, int64_t C, unsigned mk, char *out, size_t cap) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_param(g, "x", 2, (int64_t[]){R, C}, 0.0f);
    pdde_tensor *y = pdde_layernorm(g, x, pdde_param(g, "gamma", 1, (int64_t[]){C}, 1.0f), pdde_param(g, "beta", 1, (int64_t[]){C}, 0.0f), 1e-5f);
    pdde_backward(g, pdde_sum(g, y, -1, 0));
    pgd_ctx c = {.ctx = ctx, .name = "cuda", .units = 132, .max_block = 1024, .launch = rec_launch, .scratch = rec_scratch,
                 .fill32 = rec_fill32, .mem_kernels = mk};
    static const pdde_op ops[3] = {PDDE_OP_LAYERNORM, PDDE_OP_LAYERNORM_BACK, PDDE_OP_LAYERNORM_BACK_GAMMA};
    size_t len = 0;
    out[0] = 0;
    for (int o = 0; o < 3; o++)
        for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
            pdde_tensor *t = (pdde_tensor *)pdde_graph_tensor(g, i);
            if (t->op != ops[o]) continue;
            n_launched = 0;
            CHECK(pgd_compute(&c, t) == 0, "the dispatcher failed: %s", pdde_last_error(ctx));
            len += (size_t)snprintf(out + len, cap - len, "%s", o ? " |" : "");
            for (int j = 0; j < n_launched && len + 40 < cap; j++) len += (size_t)snprintf(out + len, cap - len, " %s", pgd_kernel_name(launched[j]));
            break;
        }
    pdde_graph_free(g);
}

/* rope of x [2, 7, 3, D] and its backward (a rope by minus the angle): CUDA's gate, and the kernels they launch */
static void rope_dispatch(pdde_context *ctx, int64_t D, int want_taken) {
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_tensor *x = pdde_param(g, "x", 4, (int64_t[]){2, 7, 3, D}, 0.0f);
    pdde_backward(g, pdde_sum(g, pdde_rope(g, x, 10000.0f), -1, 0));
    CHECK(pdde_graph_status(g) == PDDE_OK, "rope graph: %s", pdde_last_error(ctx));
    pgd_ctx c = {.ctx = ctx, .name = "cuda", .units = 132, .max_block = 1024, .launch = rec_launch, .scratch = rec_scratch, .fill32 = rec_fill32};
    int nodes = 0;
    for (int i = 0; i < pdde_graph_tensor_count(g); i++) {
        pdde_tensor *t = (pdde_tensor *)pdde_graph_tensor(g, i);
        if (t->op != PDDE_OP_ROPE) continue;
        const char *what = pdde_op_i32(t, PDDE_P_ROPE_INVERSE) ? "backward" : "forward";
        nodes++;
        CHECK(!pgd_supports_op(t), "rope D %lld %s: pgd_supports_op takes it (every GPU backend would, CUDA without its switch)", (long long)D, what);
        CHECK(!pgd_cuda_takes_rope(t, 0), "rope D %lld %s: CUDA takes it without %s=1", (long long)D, what, PGD_CUDA_ROPE_ENV);
        CHECK(!pgd_cuda_takes_rope(t, -1), "rope D %lld %s: CUDA takes it with %s unread (-1)", (long long)D, what, PGD_CUDA_ROPE_ENV);
        CHECK(pgd_cuda_takes_rope(t, 1) == want_taken, "rope D %lld %s: under %s=1 CUDA %s it", (long long)D, what, PGD_CUDA_ROPE_ENV,
              want_taken ? "does not take" : "takes");
        if (!want_taken) continue;
        n_launched = 0;
        t->flags |= PDDE_TENSOR_SUPPORTED; /* (as a session marks the nodes its device took) */
        CHECK(pgd_compute(&c, t) == 0, "rope %s: the dispatcher failed: %s", what, pdde_last_error(ctx));
        CHECK(n_launched == 1 && launched[0] == PGD_K_ROPE && (int64_t)launched_gx[0] * launched_bx[0] >= 1,
              "rope D %lld %s: %d launches, the first %s", (long long)D, what, n_launched, n_launched ? pgd_kernel_name(launched[0]) : "none");
    }
    CHECK(nodes == 2, "rope graph: %d rope nodes, want the forward and its backward", nodes);
    pdde_graph_free(g);
}

int main(void) {
    size_t n = 0;
    for (int i = 0; pdde_cuda_ptx_mma_parts[i]; i++) n += strlen(pdde_cuda_ptx_mma_parts[i]);
    ptx = malloc(n + 1);
    ptx[0] = 0;
    for (int i = 0, at = 0; pdde_cuda_ptx_mma_parts[i]; i++) at += sprintf(ptx + at, "%s", pdde_cuda_ptx_mma_parts[i]);
    n = 0;
    for (int i = 0; pdde_cuda_ptx_parts[i]; i++) n += strlen(pdde_cuda_ptx_parts[i]);
    ptx75 = malloc(n + 1);
    ptx75[0] = 0;
    for (int i = 0, at = 0; pdde_cuda_ptx_parts[i]; i++) at += sprintf(ptx75 + at, "%s", pdde_cuda_ptx_parts[i]);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    unsetenv("PDDE_ATTENTION");
    const char *flash_b = "k_flash_rowdot k_flash_back_dq k_flash_back_dkv", *flash_b128 = "k_flash_rowdot k_flash_back_dq_d128 k_flash_back_dkv_d128";
    /* the defaults: flash2 on q, k, v apart and on packed qkv (its packed kernels) */
    expect(ctx, NULL, 64, PDDE_BF16, 0, "k_flash2_fwd", "k_flash2_prep k_flash2_back");
    expect(ctx, NULL, 128, PDDE_BF16, 0, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_d128");
    expect(ctx, NULL, 64, PDDE_BF16, 1, "k_flash2_fwd_qkv", "k_flash2_prep k_flash2_back_qkv");
    expect(ctx, NULL, 128, PDDE_BF16, 1, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_qkv_d128");
    expect(ctx, "flash", 128, PDDE_BF16, 1, "k_flash_fwd_d128", flash_b128);
    /* named flash2: the same */
    expect(ctx, "flash2", 64, PDDE_BF16, 1, "k_flash2_fwd_qkv", "k_flash2_prep k_flash2_back_qkv");
    expect(ctx, "flash2", 128, PDDE_BF16, 1, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_qkv_d128");
    expect(ctx, "flash2", 64, PDDE_BF16, 0, "k_flash2_fwd", "k_flash2_prep k_flash2_back");
    /* named flash: flash in both layouts */
    expect(ctx, "flash", 64, PDDE_BF16, 0, "k_flash_fwd", flash_b);
    expect(ctx, "flash", 64, PDDE_BF16, 1, "k_flash_fwd", flash_b);
    /* where the tiled kernels do not apply (f32 q, k, v; head size 32): the unfused path */
    expect(ctx, NULL, 64, PDDE_F32, 0, NULL, NULL);
    expect(ctx, NULL, 32, PDDE_BF16, 1, NULL, NULL);
    expect(ctx, "flash2", 32, PDDE_BF16, 0, NULL, NULL);
    /* f32 (no TF32): the f32 tiled kernels only where a tiled path is named; flash2: flash's forward, the one-pass backward */
    const char *f32_b = "k_flash_rowdot k_flash_f32_back_dq k_flash_f32_back_dkv";
    const char *f32_b128 = "k_flash_rowdot k_flash_f32_back_dq_d128 k_flash_f32_back_dkv_d128";
    expect(ctx, "flash", 64, PDDE_F32, 0, "k_flash_f32_fwd", f32_b);
    expect(ctx, "flash", 64, PDDE_F32, 1, "k_flash_f32_fwd", f32_b);
    expect(ctx, "flash2", 64, PDDE_F32, 0, "k_flash_f32_fwd", "k_flash_rowdot k_flash_f32_zero_dq k_flash_f32_back2");
    expect(ctx, "flash2", 128, PDDE_F32, 1, "k_flash_f32_fwd_d128", "k_flash_rowdot k_flash_f32_zero_dq k_flash_f32_back2_d128");
    expect(ctx, "flash", 128, PDDE_F32, 0, "k_flash_f32_fwd_d128", f32_b128);
    expect(ctx, NULL, 64, PDDE_F32, 1, NULL, NULL);
    expect(ctx, NULL, 128, PDDE_F32, 0, NULL, NULL);
    expect(ctx, "unfused", 64, PDDE_F32, 0, NULL, NULL);
    expect(ctx, "flash", 32, PDDE_F32, 0, NULL, NULL);
    setenv("PDDE_ATTENTION", "flash", 1); /* (the generic switch names it too) */
    expect(ctx, NULL, 64, PDDE_F32, 1, "k_flash_f32_fwd", f32_b);
    unsetenv("PDDE_ATTENTION");
    /* their grid: a group of PDDE_FF_THREADS per PDDE_FF_FWD_ROWS (forward) or PDDE_FF_BWD_ROWS (backward) rows of a head */
    static const int64_t dims[2] = {64, 128};
    for (int di = 0; di < 4; di++) {
        int64_t D = dims[di % 2], BH = 2 * 3, T = 100; /* (attention()'s shape) */
        setenv("PDDE_CUDA_ATTENTION", di < 2 ? "flash" : "flash2", 1);
        pdde_graph *g = attention(ctx, (int)D, PDDE_F32, 0);
        char got[512];
        kernels_of(ctx, g, PDDE_OP_ATTENTION, got, sizeof got);
        CHECK(n_launched == 1 && launched_gx[0] == BH * ((T + PDDE_FF_FWD_ROWS(D) - 1) / PDDE_FF_FWD_ROWS(D)) &&
                  launched_bx[0] == PDDE_FF_THREADS, "f32 D %lld forward: %s on %u groups of %u", (long long)D, got, launched_gx[0], launched_bx[0]);
        kernels_of(ctx, g, PDDE_OP_ATTENTION_BACK, got, sizeof got);
        unsigned want = (unsigned)(BH * ((T + PDDE_FF_BWD_ROWS(D) - 1) / PDDE_FF_BWD_ROWS(D)));
        /* (flash: rowdot, dq, dk and dv; flash2: rowdot, the zeroing of dq, the one pass) */
        CHECK(n_launched == 3 && launched_gx[2] == want && launched_bx[2] == PDDE_FF_THREADS &&
                  (di >= 2 || (launched_gx[1] == want && launched_bx[1] == PDDE_FF_THREADS)),
              "f32 D %lld %s backward: %s on %u and %u groups (want %u)", (long long)D, di < 2 ? "flash" : "flash2", got, launched_gx[1],
              launched_gx[2], want);
        pdde_graph_free(g);
    }
    /* flash2's variants (PDDE_FLASH2_VARIANT): their kernels, groups of 128 rows (k128: of 256 items), where they apply */
    static const struct { const char *env; unsigned bits; } words[] = {
        {"k128", PGD_FLASH2_K128}, {"dqsmem", PGD_FLASH2_DQSMEM}, {"q128", PGD_FLASH2_Q128}, {"k128,q128", PGD_FLASH2_K128 | PGD_FLASH2_Q128},
        {"q128,nonesuch,dqsmem", PGD_FLASH2_Q128 | PGD_FLASH2_DQSMEM}, {"dqsmem+q128", PGD_FLASH2_Q128 | PGD_FLASH2_DQSMEM}, {"", 0}, {"k12", 0},
        {"k128,", PGD_FLASH2_K128}};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++) {
        setenv("PDDE_FLASH2_VARIANT", words[i].env, 1);
        unsigned got = pgd_flash2_variant_env();
        CHECK(got == words[i].bits, "PDDE_FLASH2_VARIANT=%s: variant bits %u, want %u", words[i].env, got, words[i].bits);
    }
    unsetenv("PDDE_FLASH2_VARIANT");
    CHECK(pgd_flash2_variant_env() == 0, "PDDE_FLASH2_VARIANT unset: variants on");
    flash2_variant = PGD_FLASH2_K128 | PGD_FLASH2_Q128;
    expect(ctx, "flash2", 64, PDDE_BF16, 1, "k_flash2_fwd_qkv_q128", "k_flash2_prep k_flash2_back_qkv_k128");
    expect(ctx, "flash2", 64, PDDE_BF16, 0, "k_flash2_fwd_q128", "k_flash2_prep k_flash2_back_k128");
    expect(ctx, "flash2", 128, PDDE_BF16, 1, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_qkv_d128"); /* (D 64 only) */
    expect(ctx, "flash", 64, PDDE_BF16, 1, "k_flash_fwd", flash_b); /* (flash2's only) */
    for (int packed = 0; packed < 2; packed++) {
        int64_t BH = 2 * 3, T = 100; /* (attention()'s shape) */
        unsigned want = (unsigned)(BH * ((T + 127) / 128));
        setenv("PDDE_CUDA_ATTENTION", "flash2", 1);
        pdde_graph *g = attention(ctx, 64, PDDE_BF16, packed);
        char got[512];
        kernels_of(ctx, g, PDDE_OP_ATTENTION, got, sizeof got);
        CHECK(n_launched == 1 && launched_gx[0] == want && launched_bx[0] == 128, "q128 forward: %s on %u groups of %u, want %u of 128", got,
              launched_gx[0], launched_bx[0], want);
        kernels_of(ctx, g, PDDE_OP_ATTENTION_BACK, got, sizeof got);
        CHECK(n_launched == 2 && launched_gx[1] == want && launched_bx[1] == 256, "k128 backward: %s on %u groups of %u, want %u of 256", got,
              launched_gx[1], launched_bx[1], want);
        pdde_graph_free(g);
    }
    flash2_variant = PGD_FLASH2_DQSMEM;
    expect(ctx, "flash2", 64, PDDE_BF16, 1, "k_flash2_fwd_qkv", "k_flash2_prep k_flash2_back_qkv_dqs");
    expect(ctx, "flash2", 128, PDDE_BF16, 1, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_qkv_d128_dqs");
    expect(ctx, NULL, 64, PDDE_BF16, 0, "k_flash2_fwd", "k_flash2_prep k_flash2_back_dqs");
    expect(ctx, NULL, 128, PDDE_BF16, 0, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_d128_dqs");
    flash2_variant = PGD_FLASH2_DQSMEM | PGD_FLASH2_K128; /* (k128 first; dqsmem where k128 does not run) */
    expect(ctx, "flash2", 64, PDDE_BF16, 1, "k_flash2_fwd_qkv", "k_flash2_prep k_flash2_back_qkv_k128");
    expect(ctx, "flash2", 128, PDDE_BF16, 0, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_d128_dqs");
    flash2_variant = 0;
    unsetenv("PDDE_CUDA_ATTENTION");
    /* nodes with starts: bf16 by default on flash (flash2's *_docs twins have not run on a GPU yet), where flash2 is named
     * on those twins (each variant), the unfused path for f32 where a tiled path is named (its tiled kernels do not take
     * them: said once, on stderr, caught in a file here); every tiled kernel but flash2's preprocessing gets the starts */
    with_starts = 1, starts_passed = 0;
    FILE *said_docs = tmpfile();
    int saved_err = dup(2);
    fflush(stderr), dup2(fileno(said_docs), 2);
    expect(ctx, NULL, 64, PDDE_BF16, 0, "k_flash_fwd", flash_b);
    expect(ctx, NULL, 128, PDDE_BF16, 1, "k_flash_fwd_d128", flash_b128);
    expect(ctx, "flash", 64, PDDE_BF16, 1, "k_flash_fwd", flash_b);
    expect(ctx, "flash2", 64, PDDE_BF16, 1, "k_flash2_fwd_qkv_docs", "k_flash2_prep k_flash2_back_qkv_docs");
    expect(ctx, "flash2", 128, PDDE_BF16, 0, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_d128_docs");
    flash2_variant = PGD_FLASH2_K128 | PGD_FLASH2_Q128;
    expect(ctx, "flash2", 64, PDDE_BF16, 1, "k_flash2_fwd_qkv_q128_docs", "k_flash2_prep k_flash2_back_qkv_k128_docs");
    expect(ctx, "flash2", 64, PDDE_BF16, 0, "k_flash2_fwd_q128_docs", "k_flash2_prep k_flash2_back_k128_docs");
    flash2_variant = PGD_FLASH2_DQSMEM;
    expect(ctx, "flash2", 64, PDDE_BF16, 1, "k_flash2_fwd_qkv_docs", "k_flash2_prep k_flash2_back_qkv_dqs_docs");
    expect(ctx, "flash2", 64, PDDE_BF16, 0, "k_flash2_fwd_docs", "k_flash2_prep k_flash2_back_dqs_docs");
    expect(ctx, "flash2", 128, PDDE_BF16, 1, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_qkv_d128_dqs_docs");
    expect(ctx, "flash2", 128, PDDE_BF16, 0, "k_flash_fwd_d128", "k_flash2_prep_d128 k_flash2_back_d128_dqs_docs");
    expect(ctx, NULL, 64, PDDE_BF16, 1, "k_flash_fwd", flash_b); /* (the variants are flash2's) */
    flash2_variant = 0;
    expect(ctx, NULL, 64, PDDE_F32, 0, NULL, NULL);
    expect(ctx, "flash", 64, PDDE_F32, 1, NULL, NULL);
    expect(ctx, "flash2", 128, PDDE_F32, 0, NULL, NULL);
    fflush(stderr), dup2(saved_err, 2), close(saved_err);
    /* (12 bf16 nodes: flash's 3 launches on 4, flash2's 2 on 8, those at D 128 flash's forward and flash2's backward) */
    CHECK(starts_passed == 28, "the tiled kernels of 12 nodes with starts: %d of their 28 launches but flash2's preprocessing got the starts",
          starts_passed);
    char docs_text[512] = "";
    rewind(said_docs);
    docs_text[fread(docs_text, 1, sizeof docs_text - 1, said_docs)] = 0;
    fclose(said_docs);
    CHECK(!strcmp(docs_text, "pdde: cuda: the tiled attention does not run a node where its f32 q, k, v come with starts "
                             "(pdde_attention_docs): those take the unfused path\n"),
          "nodes with starts on a named path they do not take: each said once: '%s'", docs_text);
    with_starts = 0;
    /* layernorm: the warp-per-row kernels under PGD_MEM_LN2 (rows up to 2048 wide), their launches' arguments the PTX's */
    char got[512];
    layernorm_kernels(ctx, 8192, 768, PGD_CUDA_MEM_KERNELS | PGD_MEM_LN2, got, sizeof got);
    CHECK(!strcmp(got, " k_layernorm2 | k_layernorm_back2 | k_layernorm_gamma2 k_colsum"), "PGD_MEM_LN2, [8192, 768]: %s", got);
    /* the wider rows: the narrowest instance that holds the row (1024, 1664, 2048 columns); above 2048 the group-per-row kernels */
    static const struct { int64_t C; const char *want; } wide[] = {
        {769, " k_layernorm2_1024 | k_layernorm_back2_1024 | k_layernorm_gamma2_1024 k_colsum"},
        {1024, " k_layernorm2_1024 | k_layernorm_back2_1024 | k_layernorm_gamma2_1024 k_colsum"},
        {1025, " k_layernorm2_1664 | k_layernorm_back2_1664 | k_layernorm_gamma2_1664 k_colsum"},
        {1600, " k_layernorm2_1664 | k_layernorm_back2_1664 | k_layernorm_gamma2_1664 k_colsum"},
        {1665, " k_layernorm2_2048 | k_layernorm_back2_2048 | k_layernorm_gamma2_2048 k_colsum"},
        {2048, " k_layernorm2_2048 | k_layernorm_back2_2048 | k_layernorm_gamma2_2048 k_colsum"},
        {2049, " k_layernorm | k_layernorm_back | k_row_stats k_gamma_back k_colsum"}};
    for (size_t i = 0; i < sizeof wide / sizeof wide[0]; i++) {
        layernorm_kernels(ctx, 1024, wide[i].C, PGD_CUDA_MEM_KERNELS | PGD_MEM_LN2, got, sizeof got);
        CHECK(!strcmp(got, wide[i].want), "PGD_MEM_LN2, [1024, %lld]: %s", (long long)wide[i].C, got);
    }
    layernorm_kernels(ctx, 8192, 768, PGD_CUDA_MEM_KERNELS, got, sizeof got);
    CHECK(!strcmp(got, " k_layernorm | k_layernorm_back | k_row_stats k_gamma_back k_colsum"), "the defaults, [8192, 768]: %s", got);
    /* rope: CUDA's gate, k_rope's launches; heads wider than the angle table (D 256) left to the CPU */
    rope_dispatch(ctx, 64, 1), rope_dispatch(ctx, 256, 1), rope_dispatch(ctx, 258, 0);
    pdde_context_free(ctx);
    free(ptx), free(ptx75);
    /* CUDA's memory-bound kernels: k_colsum2 and k_adamw_chunks by default, each "0" leaves one, "1" keeps it */
    unsetenv("PDDE_CUDA_COLSUM2"), unsetenv("PDDE_CUDA_ADAMW_CHUNKS");
    unsigned mk = pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS);
    CHECK(mk == (PGD_MEM_COLSUM2 | PGD_MEM_ADAMW_CHUNKS), "CUDA's memory kernels by default: bits %u", mk);
    setenv("PDDE_CUDA_COLSUM2", "0", 1), setenv("PDDE_CUDA_ADAMW_CHUNKS", "1", 1);
    mk = pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS);
    CHECK(mk == PGD_MEM_ADAMW_CHUNKS, "PDDE_CUDA_COLSUM2=0: bits %u", mk);
    setenv("PDDE_CUDA_ADAMW_CHUNKS", "0", 1);
    CHECK(pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS) == 0, "both 0: none");
    unsetenv("PDDE_CUDA_COLSUM2"), unsetenv("PDDE_CUDA_ADAMW_CHUNKS");
    /* the warp-per-row layernorm: off until a GPU run measures it, "1" takes it */
    unsetenv("PDDE_CUDA_LN2");
    CHECK(!(pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS) & PGD_MEM_LN2), "PDDE_CUDA_LN2 off by default");
    setenv("PDDE_CUDA_LN2", "1", 1);
    CHECK(pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS) & PGD_MEM_LN2, "PDDE_CUDA_LN2=1 takes it");
    /* a value other than 0 or 1 changes nothing and is said once (on stderr, caught in a file here) */
    setenv("PDDE_CUDA_LN2", "On", 1);
    CHECK(pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS) & PGD_MEM_LN2, "PDDE_CUDA_LN2=On takes it, as the library's switches");
    setenv("PDDE_CUDA_LN2", "yes please", 1);
    FILE *said = tmpfile();
    int saved = dup(2);
    fflush(stderr), dup2(fileno(said), 2);
    unsigned typo = pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS), typo2 = pgd_mem_kernels_env("PDDE_CUDA_", PGD_CUDA_MEM_KERNELS);
    fflush(stderr), dup2(saved, 2), close(saved);
    char text[256] = "";
    rewind(said);
    size_t n_said = fread(text, 1, sizeof text - 1, said);
    fclose(said);
    text[n_said] = 0;
    CHECK(typo == PGD_CUDA_MEM_KERNELS && typo2 == typo, "PDDE_CUDA_LN2='yes please' leaves the defaults: bits %u", typo);
    CHECK(!strcmp(text, "pdde: PDDE_CUDA_LN2=yes please is not 1 or 0 (on/off, true/false, yes/no): it stays off\n"),
          "PDDE_CUDA_LN2='yes please' is said once: '%s'", text);
    unsetenv("PDDE_CUDA_LN2");
    return test_finish();
}
