/* test_matmul_dispatch — the scratch the GPU dispatcher (backends/gpu_dispatch.h) reserves for the matmuls that
 * hold part of it (an epilogue matmul with a bf16 output, a fused GELU / DGELU matmul, a gradient-accumulating
 * matmul) and for their bf16 operands' f32 copies, without a GPU: the dispatcher runs with a recording pgd_ctx
 * whose bf16 GEMM (gemm_lowp) reads the operands itself, declines, or is absent (OpenCL), and whose epilogue GEMM
 * declines. Room for the widened operands is asked for only where they are widened (the largest scratch asked is
 * what the node holds, no more, where the bf16 GEMM takes the product); where they are widened, it lies after what
 * the node holds, in the scratch as it is after the last request (each request that grows it moves it here), and
 * the GEMM and the kernels after it read that scratch. */
#define _GNU_SOURCE
#include "pdde_extension.h"
#include "tests/test_util.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "backends/gpu_dispatch.h"
#pragma GCC diagnostic pop

enum { LOWP_ABSENT, LOWP_DECLINES, LOWP_TAKES };
enum { MAX_CASTS = 8 };

static size_t scratch_size, scratch_max; /* the recording scratch: its size, the largest request */
static uint64_t scratch_base;            /* where it is: a new place each time it grows */
static int n_casts;
static uint64_t cast_src[MAX_CASTS], cast_dst[MAX_CASTS];
static uint64_t gemm_c; /* the C the last GEMM (bf16 or f32) wrote */

static uint64_t arg_addr(const pgd_arg *a) { return pgd_addr(*(const pgd_ptr *)a->p); }

static int rec_launch(void *impl, void *stream, int k, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, int nargs,
                      const pgd_arg *args) {
    (void)impl, (void)stream, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)nargs;
    if (k == PGD_K_CAST && n_casts < MAX_CASTS) cast_src[n_casts] = arg_addr(&args[0]), cast_dst[n_casts++] = arg_addr(&args[1]);
    if (k == PGD_K_GEMM) gemm_c = arg_addr(&args[2]);
    return 0;
}
static int rec_scratch(void *impl, void *stream, size_t nbytes, pgd_ptr *out) {
    (void)impl, (void)stream;
    if (nbytes > scratch_max) scratch_max = nbytes;
    if (nbytes > scratch_size) scratch_size = nbytes, scratch_base += 0x1000000;
    *out = (pgd_ptr){scratch_base, 0};
    return 0;
}
static int rec_fill32(void *impl, void *stream, pgd_ptr dst, uint32_t value, size_t count) {
    (void)impl, (void)stream, (void)dst, (void)value, (void)count;
    return 0;
}
static int lowp_takes(void *impl, void *stream, pdde_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a, int64_t sA,
                      pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    (void)impl, (void)stream, (void)dt, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)a, (void)sA, (void)b, (void)sB, (void)sC, (void)batch;
    gemm_c = pgd_addr(c);
    return 0;
}
static int lowp_declines(void *impl, void *stream, pdde_dtype dt, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a, int64_t sA,
                         pgd_ptr b, int64_t sB, pgd_ptr c, int64_t sC, int64_t batch) {
    (void)impl, (void)stream, (void)dt, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)a, (void)sA, (void)b, (void)sB, (void)c, (void)sC, (void)batch;
    return 1;
}
static int epi_declines(void *impl, void *stream, pdde_dtype dt, pdde_dtype ddt, int ta, int tb, int64_t M, int64_t N, int64_t K, pgd_ptr a,
                        int64_t sA, pgd_ptr b, int64_t sB, pgd_ptr d, int64_t sD, int64_t batch, pgd_ptr bias, pgd_ptr c, float beta) {
    (void)impl, (void)stream, (void)dt, (void)ddt, (void)ta, (void)tb, (void)M, (void)N, (void)K, (void)a, (void)sA, (void)b, (void)sB, (void)d;
    (void)sD, (void)batch, (void)bias, (void)c, (void)beta;
    return 1;
}

static pdde_tensor tensors[6];
static pdde_tensor *tensor(int i, pdde_dtype dt, int64_t rows, int64_t cols) {
    pdde_tensor *t = &tensors[i];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "t%d", i);
    t->dtype = dt, t->ndim = 2, t->shape[0] = rows, t->shape[1] = cols;
    t->data = (void *)(uintptr_t)(0x10000000ull * (uint64_t)(i + 1)); /* (apart from the scratch's places) */
    return t;
}

enum { M = 64, N = 40, K = 48 };
enum { EPI_BIAS_BF16, EPI_BIAS_F32, ACT_GELU, ACT_DGELU, GRAD_ACCUM, N_KINDS };
static const char *const kind_name[N_KINDS] = {"bias, bf16 output", "bias, f32 output", "GELU, bf16", "DGELU, bf16 X", "grad_accum"};

/* One node of the kind with bf16 operands A [M, K], B [K, N]; *held: the scratch bytes the node keeps for itself
 * (before the widened operands), *c_in_scratch: the GEMM writes into its start */
static pdde_tensor *node_of(int kind, int64_t *held, int *c_in_scratch) {
    int64_t c_bytes = ((int64_t)M * N * 4 + 255) & ~(int64_t)255;
    pdde_tensor *a = tensor(1, PDDE_BF16, M, K), *b = tensor(2, PDDE_BF16, K, N), *node;
    if (kind == GRAD_ACCUM) {
        node = tensor(0, PDDE_F32, M, N);
        node->op = PDDE_OP_GRAD_ACCUM, node->nsrc = 3;
        node->src[0] = tensor(3, PDDE_F32, M, N), node->src[1] = a, node->src[2] = b;
        *held = c_bytes, *c_in_scratch = 1;
    } else {
        node = tensor(0, kind == EPI_BIAS_F32 ? PDDE_F32 : PDDE_BF16, M, N);
        node->op = PDDE_OP_MATMUL, node->nsrc = 3, node->src[0] = a, node->src[1] = b;
        node->src[2] = kind == ACT_DGELU ? tensor(3, PDDE_BF16, M, N) : tensor(3, PDDE_F32, 1, N);
        node->src[2]->ndim = kind == ACT_DGELU ? 2 : 1, node->src[2]->shape[0] = kind == ACT_DGELU ? M : N;
        if (kind == ACT_GELU || kind == ACT_DGELU) pdde_op_set_i32(node, PDDE_P_MATMUL_ACT, kind == ACT_GELU ? PDDE_MATMUL_GELU : PDDE_MATMUL_DGELU);
        /* (epilogue: the f32 sum of a bf16 output; GELU / DGELU: the f32 product, X widened (DGELU), a zero bias) */
        *held = kind == EPI_BIAS_F32 ? 0 : kind == EPI_BIAS_BF16 ? c_bytes : c_bytes + (kind == ACT_DGELU ? c_bytes : 0) + 256;
        *c_in_scratch = kind != EPI_BIAS_F32;
    }
    node->flags |= PDDE_TENSOR_SUPPORTED;
    return node;
}

static void check(pdde_context *ctx, int kind, int lowp) {
    pgd_ctx c = {.ctx = ctx, .name = "recording", .units = 132, .max_block = 1024, .launch = rec_launch, .scratch = rec_scratch,
                 .fill32 = rec_fill32, .gemm_epi = epi_declines,
                 .gemm_lowp = lowp == LOWP_TAKES ? lowp_takes : lowp == LOWP_DECLINES ? lowp_declines : NULL};
    int64_t held;
    int c_in_scratch;
    pdde_tensor *node = node_of(kind, &held, &c_in_scratch);
    scratch_size = scratch_max = 0, n_casts = 0, gemm_c = 0;
    int e = pgd_compute(&c, node);
    static const char *const lowp_name[3] = {"no bf16 GEMM", "the bf16 GEMM declines", "the bf16 GEMM takes it"};
    const char *what = lowp_name[lowp];
    CHECK(e == 0, "%s, %s: the dispatcher failed: %s", kind_name[kind], what, pdde_last_error(ctx));
    uint64_t pa = (uint64_t)(uintptr_t)tensors[1].data, pb = (uint64_t)(uintptr_t)tensors[2].data;
    int widened = 0;
    uint64_t wa = 0, wb = 0;
    for (int i = 0; i < n_casts; i++) {
        if (cast_src[i] == pa) widened++, wa = cast_dst[i];
        if (cast_src[i] == pb) widened++, wb = cast_dst[i];
    }
    size_t wide = (size_t)(M * K + K * N) * sizeof(float), want = (size_t)held + (lowp == LOWP_TAKES ? 0 : wide);
    printf("%-17s %-22s: scratch %6zu bytes (held %lld), operands widened %d\n", kind_name[kind], what, scratch_max, (long long)held, widened);
    CHECK(scratch_max == want, "%s, %s: the largest scratch asked is %zu bytes, want %zu (held %lld%s)", kind_name[kind], what, scratch_max, want,
          (long long)held, lowp == LOWP_TAKES ? ", nothing widened" : " and the widened operands");
    CHECK(widened == (lowp == LOWP_TAKES ? 0 : 2), "%s, %s: %d operands widened", kind_name[kind], what, widened);
    if (widened == 2)
        CHECK(wa == scratch_base + (uint64_t)held && wb == wa + (uint64_t)M * K * 4,
              "%s, %s: the widened A at %#llx, B at %#llx; want them after the %lld bytes held of the scratch at %#llx", kind_name[kind], what,
              (unsigned long long)wa, (unsigned long long)wb, (long long)held, (unsigned long long)scratch_base);
    uint64_t want_c = c_in_scratch ? scratch_base : (uint64_t)(uintptr_t)tensors[0].data;
    CHECK(gemm_c == want_c, "%s, %s: the GEMM wrote %#llx, want %#llx (%s)", kind_name[kind], what, (unsigned long long)gemm_c,
          (unsigned long long)want_c, c_in_scratch ? "the scratch where it is now" : "the node");
    if (kind == EPI_BIAS_BF16 || kind == ACT_GELU) { /* (the last kernel rounds the f32 sum into the node) */
        CHECK(n_casts > 0 && cast_src[n_casts - 1] == scratch_base && cast_dst[n_casts - 1] == (uint64_t)(uintptr_t)tensors[0].data,
              "%s, %s: the output's cast reads %#llx, want the scratch at %#llx", kind_name[kind], what,
              n_casts ? (unsigned long long)cast_src[n_casts - 1] : 0ull, (unsigned long long)scratch_base);
    }
}

int main(void) {
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    for (int kind = 0; kind < N_KINDS; kind++)
        for (int lowp = LOWP_ABSENT; lowp <= LOWP_TAKES; lowp++) check(ctx, kind, lowp);
    pdde_context_free(ctx);
    return test_finish();
}
