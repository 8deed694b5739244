/* flash_emu.cpp — the CUDA backend's tensor-core attention (backends/cuda_flash.cuh) run on the CPU.
 *
 * The kernels' device code is compiled for the host with the warp-level primitives it uses emulated
 * from their definitions in NVIDIA's PTX manual: mma.sync m16n8k16 (bf16 in, f32 accumulation) with its
 * A, B and C fragment layouts, ldmatrix .x4 (and .trans), cvt.rn.bf16x2.f32, shfl.xor and bar.sync. A
 * block's 128 threads are cooperative fibers (ucontext) that all yield at each barrier and warp-collective
 * step, so a block runs as the GPU would run it in lockstep. What this checks is the kernels' own
 * bookkeeping (which fragment holds which element, the tile loops, masking, the online softmax, the
 * scales), against a float64 reference: forward, dq, dk and dv, for head sizes 64 and 128, sequence
 * lengths that are not multiples of the tiles, one and several heads; the same for the flash2 path
 * (backends/cuda_flash2.cuh: its preprocessing, one-pass backward with dq by atomicAdd, and forward),
 * with cp.async copies done both at issue and as late as the PTX allows; and both with starts (each query's
 * first key: documents, sliding windows). It cannot see what only a GPU shows (timing, races between real
 * warps, the hardware's rounding inside the mma).
 *
 * Built and run by tests/test_flash_emu.sh; prints "N passed, N failed" last. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

/* ---- a block of cooperative threads ----------------------------------------------------------- */

enum { EMU_THREADS = 256 }; /* a block at most (8 warps: flash2's k128; the others 4) */
#define EMU_MAX_THREADS EMU_THREADS
#define EMU_STACK (1 << 18)
#include "cuda_emu.h"
struct uint4 { uint32_t x, y, z, w; };
static uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return uint4{x, y, z, w}; }
struct float4 { float x, y, z, w; };
static float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct float2 { float x, y; };
static float2 make_float2(float x, float y) { return float2{x, y}; }

/* ---- the warp-level primitives, after the PTX manual ---------------------------------------- */

static int lane() { return emu_cur & 31; }
static int warp_base() { return emu_cur & ~31; }

static float sh_f[EMU_THREADS];
static float __shfl_xor_sync(unsigned, float v, int o) {
    sh_f[emu_cur] = v;
    emu_yield();
    float r = sh_f[warp_base() + (lane() ^ o)];
    emu_yield();
    return r;
}

static float bf16_f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint16_t f_bf16(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* cvt.rn.bf16x2.f32 d, a, b: a (here hi) into the upper half, b (lo) into the lower */
static uint32_t pack_bf16(float lo, float hi) { return (uint32_t)f_bf16(lo) | (uint32_t)f_bf16(hi) << 16; }

/* mma.m16n8k16 .row.col bf16: groupID g = lane / 4, threadID_in_group t = lane % 4.
 * A: a_i (i = 0..7, two per register) at row g + 8 * ((i / 2) % 2), column 2t + i % 2 + 8 * (i / 4).
 * B: b_i (i = 0..3) at row (k) 2t + i % 2 + 8 * (i / 2), column (n) g.
 * C, D: c_i (i = 0..3) at row g + 8 * (i / 2), column 2t + i % 2. */
static uint32_t mma_a[EMU_THREADS][4], mma_b[EMU_THREADS][2];
static void mma16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    for (int i = 0; i < 4; i++) mma_a[emu_cur][i] = a[i];
    mma_b[emu_cur][0] = b0, mma_b[emu_cur][1] = b1;
    emu_yield();
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4, w = warp_base() + l;
        for (int i = 0; i < 8; i++) {
            uint16_t h = (uint16_t)(mma_a[w][i / 2] >> (16 * (i % 2)));
            A[g + 8 * ((i / 2) % 2)][2 * t + i % 2 + 8 * (i / 4)] = bf16_f(h);
        }
        for (int i = 0; i < 4; i++) {
            uint16_t h = (uint16_t)(mma_b[w][i / 2] >> (16 * (i % 2)));
            B[2 * t + i % 2 + 8 * (i / 2)][g] = bf16_f(h);
        }
    }
    int g = lane() / 4, t = lane() % 4;
    for (int i = 0; i < 4; i++) {
        int r = g + 8 * (i / 2), n = 2 * t + i % 2;
        float acc = c[i];
        for (int k = 0; k < 16; k++) acc += A[r][k] * B[k][n];
        c[i] = acc;
    }
    emu_yield();
}

/* ldmatrix .m8n8.x4 .b16: thread l gives the address of row l % 8 of matrix l / 8; register j of thread l
 * holds row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix j (the first in the low half); .trans
 * delivers the transposed matrices. */
static const uint16_t *ldsm_row[EMU_THREADS];
static void ldsm_any(uint32_t r[4], const uint16_t *p, int trans) {
    ldsm_row[emu_cur] = p;
    emu_yield();
    int l = lane();
    for (int j = 0; j < 4; j++) {
        uint16_t e[2];
        for (int h = 0; h < 2; h++) {
            int row = l / 4, col = 2 * (l % 4) + h;
            if (trans) { int x = row; row = col; col = x; }
            e[h] = ldsm_row[warp_base() + 8 * j + row][col];
        }
        r[j] = (uint32_t)e[0] | (uint32_t)e[1] << 16;
    }
    emu_yield();
}
static void ldsm4(uint32_t r[4], const uint16_t *p) { ldsm_any(r, p, 0); }
static void ldsm4t(uint32_t r[4], const uint16_t *p) { ldsm_any(r, p, 1); }

/* cp.async .cg 16 bytes, commit_group, wait_group N: each thread's copies are kept in order with their
 * group and done either at once (emu_cp_late 0) or as late as the PTX allows, at the wait_group that
 * needs them (1): a kernel that reads a tile before waiting for it, or overwrites a buffer still being
 * read, gets wrong data in one of the two runs. */
static int emu_cp_late;
enum { EMU_CP_MAX = 256 };
static struct { void *dst; const void *src; int group; } emu_cp[EMU_THREADS][EMU_CP_MAX];
static int emu_cp_n[EMU_THREADS], emu_cp_group[EMU_THREADS], emu_cp_overflow;
static void cp_async16(void *smem, const void *gmem) {
    int t = emu_cur;
    if (!emu_cp_late) { memcpy(smem, gmem, 16); return; }
    if (emu_cp_n[t] == EMU_CP_MAX) { emu_cp_overflow = 1; memcpy(smem, gmem, 16); return; }
    emu_cp[t][emu_cp_n[t]].dst = smem, emu_cp[t][emu_cp_n[t]].src = gmem, emu_cp[t][emu_cp_n[t]].group = emu_cp_group[t];
    emu_cp_n[t]++;
}
static void cp_async_commit() { emu_cp_group[emu_cur]++; }
template <int N> static void cp_async_wait() { /* groups up to committed - N - 1 complete; uncommitted copies stay */
    int t = emu_cur, keep = 0;
    for (int i = 0; i < emu_cp_n[t]; i++)
        if (emu_cp[t][i].group < emu_cp_group[t] - N) memcpy(emu_cp[t][i].dst, emu_cp[t][i].src, 16);
        else emu_cp[t][keep++] = emu_cp[t][i];
    emu_cp_n[t] = keep;
}
/* the threads of a block take turns between barriers and warp steps: an atomic add is a plain one */
static float atomicAdd(float *p, float v) {
    float o = *p;
    *p = o + v;
    return o;
}

#define PDDE_FLASH_EMU
#include "../backends/cuda_att_layout.cuh"
#include "../backends/cuda_flash.cuh"
#include "../backends/cuda_flash2.cuh"
#include "../backends/cuda_flash_f32.cuh"

/* ---- the launches (as backends/cuda_kernels.cu's k_flash_* with the dispatcher's grid) ----------- */

static uint16_t emu_sm[FL_SMEM(128)] __attribute__((aligned(16)));
static struct {
    const uint16_t *q, *k, *v;
    float *y, *out;
    uint16_t *ycp, *cp; /* (packed: the bf16 copies of y and dqkv beside them, the kernels' cp; NULL: none) */
    const float *dy, *rowdot;
    long long BH, T, H; /* H: the layout (0: heads apart; > 0: packed qkv, cuda_att_layout.cuh) */
    int D;
    float scale;
    const int *starts; /* each query's first key (pdde_attention_docs; NULL: plain causal) at batch row bh / heads */
    long long heads;
} L;
static void body_fwd() {
    if (L.D == 64) flash_fwd<64>(emu_sm, L.q, L.k, L.v, L.y, L.BH, L.T, L.scale, L.H, L.ycp, L.starts, L.heads);
    else flash_fwd<128>(emu_sm, L.q, L.k, L.v, L.y, L.BH, L.T, L.scale, L.H, L.ycp, L.starts, L.heads);
}
static void body_dq() {
    if (L.D == 64) flash_dq<64>(emu_sm, L.q, L.k, L.v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H, L.cp, L.starts, L.heads);
    else flash_dq<128>(emu_sm, L.q, L.k, L.v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H, L.cp, L.starts, L.heads);
}
static void body_dkv() {
    if (L.D == 64) flash_dkv<64>(emu_sm, L.q, L.k, L.v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H, L.cp, L.starts, L.heads);
    else flash_dkv<128>(emu_sm, L.q, L.k, L.v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H, L.cp, L.starts, L.heads);
}
static void launch(void (*body)(void)) {
    long long groups = L.BH * ((L.T + FL_ROWS - 1) / FL_ROWS);
    emu_launch(emu_dim{(unsigned)groups, 1, 1}, 32 * FL_WARPS, body);
}
/* flash2 (backends/cuda_flash2.cuh), as the dispatcher launches k_flash2_prep and k_flash2_back, and the variants
 * PDDE_FLASH2_VARIANT picks (L2_var: the backward's, L2_fwd_var: the forward's) */
enum { V2_DEFAULT, V2_K128, V2_DQSMEM, V2_COUNT }; /* backward */
static const char *const v2_names[V2_COUNT] = {"", " k128", " dqsmem"}, *const v2_fwd_names[2] = {"", " q128"};
static int L2_var, L2_fwd_var;
static uint16_t *L_dob;
static float *L_stats, emu_stat_s[4 * FL2_BQ(64)], emu_dqs[FL2_DQS_SMEM(64) > FL2_DQS_SMEM(128) ? FL2_DQS_SMEM(64) : FL2_DQS_SMEM(128)]
    __attribute__((aligned(16)));
static constexpr int emu_max(int a, int b) { return a > b ? a : b; }
static uint16_t emu_sm2[emu_max(emu_max(FL2_SMEM(128), FL2_FWD_SMEM(64)), FL2_SMEM_W(64, FL2_K128_WARPS))] __attribute__((aligned(16)));
static void body_prep() {
    if (L.D == 64) flash2_prep<64>(L.y, L.dy, L_dob, L_stats, L.out, L.BH * L.T, L.T, L.H);
    else flash2_prep<128>(L.y, L.dy, L_dob, L_stats, L.out, L.BH * L.T, L.T, L.H);
}
/* flash2_bwd at head size D, layout PK, with starts or not (ST: the *_docs kernels; L.starts, L.heads) */
template <int D, bool PK, bool ST>
static void back2() {
    long long H = PK ? L.H : 0;
    if (L2_var == V2_K128)
        flash2_bwd<64, PK, FL2_K128_WARPS, false, ST>(emu_sm2, emu_stat_s, L.q, L.k, L.v, L_dob, L_stats, L.out, L.BH, L.T, L.scale, H,
                                                      nullptr, L.starts, L.heads);
    else if (L2_var == V2_DQSMEM)
        flash2_bwd<D, PK, FL_WARPS, true, ST>(emu_sm2, emu_stat_s, L.q, L.k, L.v, L_dob, L_stats, L.out, L.BH, L.T, L.scale, H, emu_dqs,
                                              L.starts, L.heads);
    else
        flash2_bwd<D, PK, FL_WARPS, false, ST>(emu_sm2, emu_stat_s, L.q, L.k, L.v, L_dob, L_stats, L.out, L.BH, L.T, L.scale, H, nullptr,
                                               L.starts, L.heads);
}
template <bool ST>
static void back2_st() {
    if (L.D == 64 && L.H) back2<64, true, ST>();
    else if (L.D == 64) back2<64, false, ST>();
    else if (L.H) back2<128, true, ST>();
    else back2<128, false, ST>();
}
static void body_back2() { /* (k_flash2_back or, packed, k_flash2_back_qkv; their variants and *_docs twins as cuda_kernels.cu's) */
    if (L.starts) back2_st<true>();
    else back2_st<false>();
}
template <bool PK, bool ST>
static void fwd2() {
    long long H = PK ? L.H : 0;
    if (L2_fwd_var) flash2_fwd_q128<64, PK, ST>(emu_sm2, L.q, L.k, L.v, L.y, L.BH, L.T, L.scale, H, L.ycp, L.starts, L.heads);
    else flash2_fwd<64, PK, ST>(emu_sm2, L.q, L.k, L.v, L.y, L.BH, L.T, L.scale, H, L.ycp, L.starts, L.heads);
}
static void body_fwd2() {
    if (L.H) L.starts ? fwd2<true, true>() : fwd2<true, false>();
    else L.starts ? fwd2<false, true>() : fwd2<false, false>();
}
static void launch_fwd2(void) { /* (at D 64 only: flash2 runs flash_fwd at D 128) */
    long long rows = L2_fwd_var ? FL2_Q128_ROWS : FL_ROWS, groups = L.BH * ((L.T + rows - 1) / rows);
    emu_launch(emu_dim{(unsigned)groups, 1, 1}, 32 * FL_WARPS, body_fwd2);
}
static void launch2(void) { /* (k_flash2_prep zeroes dq: the dispatcher launches nothing else before k_flash2_back) */
    long long warps = L2_var == V2_K128 ? FL2_K128_WARPS : FL_WARPS, rows = L.BH * L.T, groups = L.BH * ((L.T + 16 * warps - 1) / (16 * warps));
    emu_launch(emu_dim{(unsigned)((rows + FL_WARPS - 1) / FL_WARPS), 1, 1}, 32 * FL_WARPS, body_prep);
    emu_launch(emu_dim{(unsigned)groups, 1, 1}, (unsigned)(32 * warps), body_back2);
}

/* the f32 kernels (backends/cuda_flash_f32.cuh), as the dispatcher launches k_flash_f32_* (flash_f32_tiles.h) */
static constexpr int ff_max(int a, int b) { return a > b ? a : b; }
static float emu_smf[ff_max(ff_max(ff_max(FF_SMEM_FWD(64), FF_SMEM_DQ(64)), FF_SMEM_DKV(64)),
                            ff_max(ff_max(FF_SMEM_FWD(128), FF_SMEM_DQ(128)), FF_SMEM_DKV(128)))] __attribute__((aligned(16)));
static const float *F_q, *F_k, *F_v;
static void body_ffwd() {
    if (L.D == 64) ff_fwd<64>(emu_smf, F_q, F_k, F_v, L.y, L.BH, L.T, L.scale, L.H);
    else ff_fwd<128>(emu_smf, F_q, F_k, F_v, L.y, L.BH, L.T, L.scale, L.H);
}
static void body_fdq() {
    if (L.D == 64) ff_dq<64>(emu_smf, F_q, F_k, F_v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H);
    else ff_dq<128>(emu_smf, F_q, F_k, F_v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H);
}
static void body_fdkv() {
    if (L.D == 64) ff_dkv<64, false>(emu_smf, F_q, F_k, F_v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H);
    else ff_dkv<128, false>(emu_smf, F_q, F_k, F_v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H);
}
static void body_fback2() { /* (k_flash_f32_back2: flash2's one pass, dq by atomics) */
    if (L.D == 64) ff_dkv<64, true>(emu_smf, F_q, F_k, F_v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H);
    else ff_dkv<128, true>(emu_smf, F_q, F_k, F_v, L.y, L.dy, L.rowdot, L.out, L.BH, L.T, L.scale, L.H);
}
static void launch_f32(void (*body)(void), long long rows) {
    emu_launch(emu_dim{(unsigned)(L.BH * ((L.T + rows - 1) / rows)), 1, 1}, PDDE_FF_THREADS, body);
}

/* ---- the check ------------------------------------------------------------------------------- */

static int passed, failed;
static uint64_t rng = 88172645463325252ull;
static float urand() { /* [-1, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) / 8388608.0) - 1.0f;
}
static double nmse(const float *got, const double *ref, long long n) {
    double e = 0, r = 0;
    for (long long i = 0; i < n; i++) e += (got[i] - ref[i]) * (got[i] - ref[i]), r += ref[i] * ref[i];
    return r > 0 ? e / r : e;
}
static void check(const char *what, double e, double tol, const char *label) {
    int ok = e <= tol; /* (NaN fails) */
    ok ? passed++ : failed++;
    printf("%s %-34s %-6s NMSE %.3g (bound %.3g)\n", ok ? "ok  " : "FAIL", label, what, e, tol);
}

/* H = 0: q, k, v [BH, T, D] apart; H > 0: the same values packed in qkv [BH / H, T, H*3*D] (pdde_attention_qkv),
 * y [BH / H, T, H*D] and the logsumexp after it, dqkv in qkv's layout; gathered back to compare alike. */
static void run_case(long long BH, long long T, int D, long long H) {
    long long n = BH * T * D, Dy = D + 1;
    float scale = 1.0f / sqrtf((float)D);
    uint16_t *q = new uint16_t[n], *k = new uint16_t[n], *v = new uint16_t[n];
    float *y = new float[BH * T * Dy], *dy = new float[BH * T * Dy], *out = new float[3 * n], *rowdot = new float[BH * T];
    for (long long i = 0; i < n; i++) q[i] = f_bf16(urand() * 2), k[i] = f_bf16(urand() * 2), v[i] = f_bf16(urand());
    for (long long i = 0; i < BH * T * Dy; i++) dy[i] = urand(), y[i] = NAN; /* (poisoned: every element must be written) */
    for (long long i = 0; i < 3 * n; i++) out[i] = NAN;
    L.q = q, L.k = k, L.v = v, L.y = y, L.out = out, L.dy = dy, L.rowdot = rowdot, L.BH = BH, L.T = T, L.D = D, L.scale = scale;
    L.H = H, L.ycp = L.cp = NULL;
    uint16_t *qkv = H ? new uint16_t[3 * n] : NULL;
    /* packed: the kernels that also write the outputs' bf16 copies (PDDE_ATT_LOWP), poisoned with NaN */
    uint16_t *ycp = H ? new uint16_t[n] : NULL, *cp = H ? new uint16_t[3 * n] : NULL;
    for (long long i = 0; H && i < 3 * n; i++) cp[i] = 0x7fc1, ycp[i % n] = 0x7fc1;
    float *py = H ? new float[n + BH * T] : NULL, *pdy = H ? new float[n] : NULL, *pout = H ? new float[3 * n] : NULL;
    if (H) { /* row r = bh T + t of head bh = b H + h: qkv row (b T + t), columns h 3D + [0, D) q, [D, 2D) k, [2D, 3D) v */
        for (long long r = 0; r < BH * T; r++)
            for (int d = 0; d < D; d++) {
                long long t = r % T, bh = r / T, pr = ((bh / H) * T + t) * 3 * H * D + (bh % H) * 3 * D, yr = ((bh / H) * T + t) * H * D + (bh % H) * D;
                qkv[pr + d] = q[r * D + d], qkv[pr + D + d] = k[r * D + d], qkv[pr + 2 * D + d] = v[r * D + d];
                pdy[yr + d] = dy[r * Dy + d];
            }
        for (long long i = 0; i < n + BH * T; i++) py[i] = NAN;
        for (long long i = 0; i < 3 * n; i++) pout[i] = NAN;
        L.q = qkv, L.k = qkv + D, L.v = qkv + 2 * D, L.y = py, L.dy = pdy, L.out = pout, L.ycp = ycp, L.cp = cp;
    }
    launch(body_fwd);
    for (long long r = 0; r < BH * T; r++) { /* k_flash_rowdot */
        float dot = 0.0f;
        for (int d = 0; d < D; d++) dot += L.dy[att_y(r, T, D, H) + d] * L.y[att_y(r, T, D, H) + d];
        rowdot[r] = dot;
    }
    launch(body_dq);
    launch(body_dkv);
    if (H) { /* each copy the cast's bits of the f32 value beside it (k_cast: round to nearest even) */
        long long bad = 0, bad_g = 0;
        for (long long i = 0; i < n; i++) bad += ycp[i] != f_bf16(py[i]);
        for (long long i = 0; i < 3 * n; i++) bad_g += cp[i] != f_bf16(pout[i]);
        char lc[64];
        snprintf(lc, sizeof lc, "BH %lld T %lld D %d packed", BH, T, D);
        check("y copy", (double)bad, 0, lc);
        check("dqkv copy", (double)bad_g, 0, lc);
        delete[] ycp, delete[] cp;
    }
    if (H) { /* back to the layout the reference is compared in */
        for (long long r = 0; r < BH * T; r++) {
            for (int d = 0; d < D; d++) {
                y[r * Dy + d] = py[att_y(r, T, D, H) + d];
                for (int w = 0; w < 3; w++) out[w * n + r * D + d] = pout[att_out(r, w, BH * T, T, D, H) + d];
            }
            y[r * Dy + D] = py[att_lse(r, BH * T, D, H)];
        }
    }
    /* float64 reference from the same bf16 inputs */
    double *ry = new double[BH * T * Dy], *rg = new double[3 * n], *p = new double[T];
    float *gy = new float[BH * T * D];
    double *ryo = new double[BH * T * D];
    for (long long i = 0; i < 3 * n; i++) rg[i] = 0;
    for (long long h = 0; h < BH; h++)
        for (long long i = 0; i < T; i++) {
            const uint16_t *qi = q + (h * T + i) * D;
            double m = -INFINITY, z = 0;
            for (long long j = 0; j <= i; j++) {
                double s = 0;
                for (int d = 0; d < D; d++) s += (double)bf16_f(qi[d]) * bf16_f(k[(h * T + j) * D + d]);
                p[j] = s * scale;
                m = fmax(m, p[j]);
            }
            for (long long j = 0; j <= i; j++) p[j] = exp(p[j] - m), z += p[j];
            double *yo = ry + (h * T + i) * Dy, dot = 0;
            for (int d = 0; d < D; d++) {
                double o = 0;
                for (long long j = 0; j <= i; j++) o += p[j] / z * bf16_f(v[(h * T + j) * D + d]);
                yo[d] = o;
                dot += o * dy[(h * T + i) * Dy + d];
            }
            yo[D] = m + log(z);
            for (long long j = 0; j <= i; j++) {
                double pj = p[j] / z, dp = 0;
                for (int d = 0; d < D; d++) dp += dy[(h * T + i) * Dy + d] * (double)bf16_f(v[(h * T + j) * D + d]);
                double ds = pj * (dp - dot) * scale;
                for (int d = 0; d < D; d++) {
                    rg[(h * T + i) * D + d] += ds * bf16_f(k[(h * T + j) * D + d]);
                    rg[n + (h * T + j) * D + d] += ds * bf16_f(qi[d]);
                    rg[2 * n + (h * T + j) * D + d] += pj * dy[(h * T + i) * Dy + d];
                }
            }
        }
    char label[64];
    snprintf(label, sizeof label, "BH %lld T %lld D %d%s", BH, T, D, H ? " packed" : "");
    for (long long r = 0; r < BH * T; r++)
        for (int d = 0; d < D; d++) gy[r * D + d] = y[r * Dy + d], ryo[r * D + d] = ry[r * Dy + d];
    float *lse = new float[BH * T];
    double *rlse = new double[BH * T];
    for (long long r = 0; r < BH * T; r++) lse[r] = y[r * Dy + D], rlse[r] = ry[r * Dy + D];
    /* bounds: the bf16 rounding of P and dS (and dO) for the tensor cores, u = 2^-8, as the conformance
     * suite's bf16 attention bounds: (2u)^2 for the output, (3u)^2 for the gradients */
    double u = 1.0 / 256;
    check("output", nmse(gy, ryo, BH * T * D), (2 * u) * (2 * u), label);
    check("lse", nmse(lse, rlse, BH * T), 1e-10, label);
    check("dq", nmse(out, rg, n), (3 * u) * (3 * u), label);
    check("dk", nmse(out + n, rg + n, n), (3 * u) * (3 * u), label);
    check("dv", nmse(out + 2 * n, rg + 2 * n, n), (3 * u) * (3 * u), label);
    /* flash2 from the same forward, with its copies done early and late: the backward, and at D 64 the
     * forward (flash2 runs flash_fwd at D 128); packed (H > 0): first on q, k, v apart, then packed, whose
     * outputs must equal those bit for bit (the same arithmetic, only the addresses differ). Each variant
     * (PDDE_FLASH2_VARIANT) the same: the backward's k128 (D 64) and dqsmem, the forward's q128 (D 64). */
    uint16_t *dob = new uint16_t[BH * T * D], *ycp2 = H ? new uint16_t[n] : NULL;
    float *stats = new float[2 * BH * T], *o2 = new float[3 * n], *o2_apart = new float[3 * n];
    float *y2 = new float[BH * T * Dy], *y2_apart = new float[BH * T * Dy], *py2 = H ? new float[n + BH * T] : NULL;
    L_dob = dob, L_stats = stats;
    for (int late = 0; late < 2; late++)
        for (int var = 0; var < V2_COUNT; var++)
            for (int pk = 0; pk < (H ? 2 : 1); pk++) {
                if (var == V2_K128 && D != 64) continue; /* (the dispatcher runs the default there) */
                if (pk) L.q = qkv, L.k = qkv + D, L.v = qkv + 2 * D, L.y = py, L.dy = pdy, L.out = pout, L.H = H;
                else L.q = q, L.k = k, L.v = v, L.y = y, L.dy = dy, L.out = o2, L.H = 0;
                for (long long i = 0; i < 3 * n; i++) L.out[i] = NAN; /* (dq too: k_flash2_prep must zero it) */
                emu_cp_late = late, emu_cp_overflow = 0, L2_var = var;
                launch2();
                emu_cp_late = 0, L2_var = V2_DEFAULT;
                for (long long r = 0; pk && r < BH * T; r++)
                    for (int w = 0; w < 3; w++)
                        for (int d = 0; d < D; d++) o2[w * n + r * D + d] = pout[att_out(r, w, BH * T, T, D, H) + d];
                char l2[128];
                snprintf(l2, sizeof l2, "flash2%s %s%s, copies %s", v2_names[var], label, pk ? "" : H ? " (apart)" : "", late ? "late" : "early");
                check("dq", nmse(o2, rg, n), (3 * u) * (3 * u), l2);
                check("dk", nmse(o2 + n, rg + n, n), (3 * u) * (3 * u), l2);
                check("dv", nmse(o2 + 2 * n, rg + 2 * n, n), (3 * u) * (3 * u), l2);
                if (pk) check("dqkv = apart", (double)memcmp(o2, o2_apart, 3 * n * sizeof *o2) != 0, 0, l2);
                else memcpy(o2_apart, o2, 3 * n * sizeof *o2);
                if (emu_cp_overflow) check("cp.async queue", 1, 0, l2); /* (the emulation's own limit: a failure) */
                if (D != 64 || var > 1) continue;
                snprintf(l2, sizeof l2, "flash2%s %s%s, copies %s", v2_fwd_names[var], label, pk ? "" : H ? " (apart)" : "",
                         late ? "late" : "early");
                float *yt = pk ? py2 : y2, *y1 = L.y;
                for (long long i = 0; i < (pk ? n + BH * T : BH * T * Dy); i++) yt[i] = NAN;
                for (long long i = 0; pk && i < n; i++) ycp2[i] = 0x7fc1;
                L.y = yt, L.ycp = pk ? ycp2 : NULL, emu_cp_late = late, L2_fwd_var = var;
                launch_fwd2();
                L.y = y1, L.ycp = NULL, emu_cp_late = 0, L2_fwd_var = 0;
                for (long long r = 0; pk && r < BH * T; r++) {
                    for (int d = 0; d < D; d++) y2[r * Dy + d] = py2[att_y(r, T, D, H) + d];
                    y2[r * Dy + D] = py2[att_lse(r, BH * T, D, H)];
                }
                for (long long r = 0; r < BH * T; r++) {
                    for (int d = 0; d < D; d++) gy[r * D + d] = y2[r * Dy + d];
                    lse[r] = y2[r * Dy + D];
                }
                check("output", nmse(gy, ryo, BH * T * D), (2 * u) * (2 * u), l2);
                check("lse", nmse(lse, rlse, BH * T), 1e-10, l2);
                if (!pk) { memcpy(y2_apart, y2, BH * T * Dy * sizeof *y2); continue; }
                check("y, lse = apart", (double)memcmp(y2, y2_apart, BH * T * Dy * sizeof *y2) != 0, 0, l2);
                long long bad = 0;
                for (long long i = 0; i < n; i++) bad += ycp2[i] != f_bf16(py2[i]);
                check("y copy", (double)bad, 0, l2);
            }
    delete[] ycp2, delete[] o2, delete[] o2_apart, delete[] y2, delete[] y2_apart, delete[] py2;
    delete[] qkv, delete[] py, delete[] pdy, delete[] pout;
    delete[] dob, delete[] stats;
    delete[] q, delete[] k, delete[] v, delete[] y, delete[] dy, delete[] out, delete[] rowdot;
    delete[] ry, delete[] rg, delete[] p, delete[] gy, delete[] ryo, delete[] lse, delete[] rlse;
}

/* The f32 kernels (k_flash_f32_*) on f32 q, k, v against float64 from the same values: y, lse, dq, dk, dv at
 * f32 round-off (the conformance suite's f32 bound, NMSE 1e-10); H > 0: then packed in qkv, whose outputs must
 * equal those of q, k, v apart bit for bit (the same arithmetic, only the addresses differ). Then flash2's
 * one-pass backward (k_flash_f32_back2, after dq is zeroed): dq against float64, dk and dv equal to the
 * two-kernel backward's bit for bit (the same products in the same order). */
static void run_case_f32(long long BH, long long T, int D, long long H) {
    long long n = BH * T * D, Dy = D + 1, rows = BH * T;
    float scale = 1.0f / sqrtf((float)D);
    float *q = new float[n], *k = new float[n], *v = new float[n], *dy = new float[rows * Dy], *rowdot = new float[rows];
    float *y[2], *out[2], *gy = new float[n], *glse = new float[rows], *gout = new float[3 * n];
    for (long long i = 0; i < n; i++) q[i] = urand() * 2, k[i] = urand() * 2, v[i] = urand();
    for (long long i = 0; i < rows * Dy; i++) dy[i] = urand();
    double *ry = new double[n], *rlse = new double[rows], *rg = new double[3 * n], *p = new double[T];
    for (long long i = 0; i < 3 * n; i++) rg[i] = 0;
    for (long long h = 0; h < BH; h++) /* float64 reference */
        for (long long i = 0; i < T; i++) {
            const float *qi = q + (h * T + i) * D, *di = dy + (h * T + i) * Dy;
            double m = -INFINITY, z = 0, dot = 0;
            for (long long j = 0; j <= i; j++) {
                double t = 0;
                for (int d = 0; d < D; d++) t += (double)qi[d] * k[(h * T + j) * D + d];
                p[j] = t * scale, m = fmax(m, p[j]);
            }
            for (long long j = 0; j <= i; j++) p[j] = exp(p[j] - m), z += p[j];
            for (int d = 0; d < D; d++) {
                double o = 0;
                for (long long j = 0; j <= i; j++) o += p[j] / z * v[(h * T + j) * D + d];
                ry[(h * T + i) * D + d] = o, dot += o * di[d];
            }
            rlse[h * T + i] = m + log(z);
            for (long long j = 0; j <= i; j++) {
                double pj = p[j] / z, dp = 0;
                for (int d = 0; d < D; d++) dp += (double)di[d] * v[(h * T + j) * D + d];
                double ds = pj * (dp - dot) * scale;
                for (int d = 0; d < D; d++) {
                    rg[(h * T + i) * D + d] += ds * k[(h * T + j) * D + d];
                    rg[n + (h * T + j) * D + d] += ds * qi[d];
                    rg[2 * n + (h * T + j) * D + d] += pj * di[d];
                }
            }
        }
    float *qkv = H ? new float[3 * n] : NULL, *pdy = H ? new float[n] : NULL;
    for (long long r = 0; H && r < rows; r++) /* (as run_case packs them) */
        for (int d = 0; d < D; d++) {
            long long t = r % T, bh = r / T, pr = ((bh / H) * T + t) * 3 * H * D + (bh % H) * 3 * D, yr = ((bh / H) * T + t) * H * D + (bh % H) * D;
            qkv[pr + d] = q[r * D + d], qkv[pr + D + d] = k[r * D + d], qkv[pr + 2 * D + d] = v[r * D + d];
            pdy[yr + d] = dy[r * Dy + d];
        }
    for (int pk = 0; pk < (H ? 2 : 1); pk++) {
        long long Hk = pk ? H : 0, ny = pk ? n + rows : rows * Dy;
        y[pk] = new float[ny], out[pk] = new float[3 * n];
        for (long long i = 0; i < ny; i++) y[pk][i] = NAN; /* (poisoned: every element must be written) */
        for (long long i = 0; i < 3 * n; i++) out[pk][i] = NAN;
        F_q = pk ? qkv : q, F_k = pk ? qkv + D : k, F_v = pk ? qkv + 2 * D : v;
        L.y = y[pk], L.dy = pk ? pdy : dy, L.out = out[pk], L.rowdot = rowdot, L.BH = BH, L.T = T, L.D = D, L.scale = scale, L.H = Hk;
        launch_f32(body_ffwd, PDDE_FF_FWD_ROWS(D));
        for (long long r = 0; r < rows; r++) { /* k_flash_rowdot */
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += L.dy[att_y(r, T, D, Hk) + d] * L.y[att_y(r, T, D, Hk) + d];
            rowdot[r] = dot;
        }
        launch_f32(body_fdq, PDDE_FF_BWD_ROWS(D));
        launch_f32(body_fdkv, PDDE_FF_BWD_ROWS(D));
        for (long long r = 0; r < rows; r++) { /* gathered to [rows, D] apart */
            for (int d = 0; d < D; d++) {
                gy[r * D + d] = L.y[att_y(r, T, D, Hk) + d];
                for (int w = 0; w < 3; w++) gout[w * n + r * D + d] = L.out[att_out(r, w, rows, T, D, Hk) + d];
            }
            glse[r] = L.y[att_lse(r, rows, D, Hk)];
        }
        char label[96];
        snprintf(label, sizeof label, "f32 BH %lld T %lld D %d%s", BH, T, D, pk ? " packed" : "");
        check("output", nmse(gy, ry, n), 1e-10, label);
        check("lse", nmse(glse, rlse, rows), 1e-10, label);
        check("dq", nmse(gout, rg, n), 1e-10, label);
        check("dk", nmse(gout + n, rg + n, n), 1e-10, label);
        check("dv", nmse(gout + 2 * n, rg + 2 * n, n), 1e-10, label);
        if (!pk) continue;
        long long bad = 0;
        for (long long r = 0; r < rows; r++) {
            for (int d = 0; d < D; d++) {
                bad += memcmp(&y[0][r * Dy + d], &y[1][att_y(r, T, D, H) + d], 4) != 0;
                for (int w = 0; w < 3; w++) bad += memcmp(&out[0][w * n + r * D + d], &out[1][att_out(r, w, rows, T, D, H) + d], 4) != 0;
            }
            bad += memcmp(&y[0][r * Dy + D], &y[1][att_lse(r, rows, D, H)], 4) != 0;
        }
        check("packed = apart", (double)bad, 0, label);
    }
    for (int pk = 0; pk < (H ? 2 : 1); pk++) { /* flash2's one pass, from the same forward */
        long long Hk = pk ? H : 0;
        float *o2 = new float[3 * n];
        for (long long i = 0; i < 3 * n; i++) o2[i] = NAN;
        for (long long r = 0; r < rows; r++) /* k_flash_f32_zero_dq */
            for (int d = 0; d < D; d++) o2[att_out(r, 0, rows, T, D, Hk) + d] = 0.0f;
        F_q = pk ? qkv : q, F_k = pk ? qkv + D : k, F_v = pk ? qkv + 2 * D : v;
        L.y = y[pk], L.dy = pk ? pdy : dy, L.out = o2, L.H = Hk;
        for (long long r = 0; r < rows; r++) { /* (rowdot of this layout's y, dy: the same values) */
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot += L.dy[att_y(r, T, D, Hk) + d] * L.y[att_y(r, T, D, Hk) + d];
            rowdot[r] = dot;
        }
        launch_f32(body_fback2, PDDE_FF_BWD_ROWS(D));
        long long same = 0;
        for (long long r = 0; r < rows; r++)
            for (int d = 0; d < D; d++) {
                gout[r * D + d] = o2[att_out(r, 0, rows, T, D, Hk) + d];
                for (int w = 1; w < 3; w++)
                    same += memcmp(&o2[att_out(r, w, rows, T, D, Hk) + d], &out[pk][att_out(r, w, rows, T, D, Hk) + d], 4) != 0;
            }
        char label[96];
        snprintf(label, sizeof label, "f32 flash2 BH %lld T %lld D %d%s", BH, T, D, pk ? " packed" : "");
        check("dq", nmse(gout, rg, n), 1e-10, label);
        check("dk, dv = flash's", (double)same, 0, label);
        delete[] o2;
    }
    for (int pk = 0; pk < (H ? 2 : 1); pk++) delete[] y[pk], delete[] out[pk];
    delete[] q, delete[] k, delete[] v, delete[] dy, delete[] rowdot, delete[] gy, delete[] glse, delete[] gout;
    delete[] ry, delete[] rlse, delete[] rg, delete[] p, delete[] qkv, delete[] pdy;
}

/* Document-masked attention (pdde_attention_docs) on flash and flash2: B batch rows of `heads` heads, q, k, v apart or
 * packed (the kernels' H), each query t seeing keys lo .. t, lo = starts[b, t] clamped to [0, t]: packed documents of
 * random lengths (some of one token; one row a single document from t = 0) or, window > 0, a sliding window
 * (t - window + 1). y, lse, dq, dk, dv against float64 from the same bf16 values, the bounds of run_case. */
static void run_case_docs(long long B, long long heads, long long T, int D, int packed, int window) {
    long long BH = B * heads, rows = BH * T, n = rows * D, H = packed ? heads : 0;
    float scale = 1.0f / sqrtf((float)D);
    int *starts = new int[B * T];
    for (long long b = 0; b < B; b++)
        for (long long t = 0, begin = 0, left = 0; t < T; t++) {
            if (window) {
                starts[b * T + t] = (int)(t - window + 1);
                continue;
            }
            if (b > 0 && !left) left = (rng >> 3) % 4 == 0 ? 1 : 1 + (long long)((urand() + 1) * 20), begin = t; /* (row 0: one document) */
            if (b > 0) left--;
            starts[b * T + t] = (int)begin;
        }
    float *lq = new float[n], *lk = new float[n], *lv = new float[n], *ldy = new float[n];
    for (long long i = 0; i < n; i++)
        lq[i] = bf16_f(f_bf16(urand() * 2)), lk[i] = bf16_f(f_bf16(urand() * 2)), lv[i] = bf16_f(f_bf16(urand())), ldy[i] = urand();
    long long nin = packed ? 3 * n : n, ny = packed ? n + rows : rows * (D + 1);
    uint16_t *bq = new uint16_t[nin], *bk = packed ? bq + D : new uint16_t[n], *bv = packed ? bq + 2 * D : new uint16_t[n];
    float *y = new float[ny], *dy = new float[ny], *out = new float[3 * n], *rowdot = new float[rows];
    for (long long i = 0; i < ny; i++) y[i] = NAN, dy[i] = 0.0f;
    for (long long i = 0; i < 3 * n; i++) out[i] = NAN;
    for (long long r = 0; r < rows; r++)
        for (int d = 0; d < D; d++) {
            long long o = att_in(r, T, D, H) + d;
            bq[o] = f_bf16(lq[r * D + d]), bk[o] = f_bf16(lk[r * D + d]), bv[o] = f_bf16(lv[r * D + d]);
            dy[att_y(r, T, D, H) + d] = ldy[r * D + d];
        }
    L.q = bq, L.k = bk, L.v = bv, L.y = y, L.dy = dy, L.out = out, L.rowdot = rowdot, L.BH = BH, L.T = T, L.D = D, L.scale = scale;
    L.H = H, L.ycp = L.cp = NULL, L.starts = starts, L.heads = heads;
    launch(body_fwd);
    for (long long r = 0; r < rows; r++) { /* k_flash_rowdot */
        float dot = 0.0f;
        for (int d = 0; d < D; d++) dot += dy[att_y(r, T, D, H) + d] * y[att_y(r, T, D, H) + d];
        rowdot[r] = dot;
    }
    launch(body_dq);
    launch(body_dkv);
    double *ry = new double[n], *rlse = new double[rows], *rg = new double[3 * n], *p = new double[T];
    float *gy = new float[n], *glse = new float[rows], *gg = new float[3 * n];
    for (long long i = 0; i < 3 * n; i++) rg[i] = 0;
    for (long long r = 0; r < rows; r++) {
        long long t = r % T, h0 = r - t, b = r / T / heads, lo = starts[b * T + t] < 0 ? 0 : starts[b * T + t] > t ? t : starts[b * T + t];
        double m = -INFINITY, z = 0, dot = 0;
        for (long long j = lo; j <= t; j++) {
            double sc = 0;
            for (int d = 0; d < D; d++) sc += (double)lq[r * D + d] * lk[(h0 + j) * D + d];
            p[j] = sc * scale, m = fmax(m, p[j]);
        }
        for (long long j = lo; j <= t; j++) p[j] = exp(p[j] - m), z += p[j];
        for (int d = 0; d < D; d++) {
            double o = 0;
            for (long long j = lo; j <= t; j++) o += p[j] / z * lv[(h0 + j) * D + d];
            ry[r * D + d] = o, dot += o * ldy[r * D + d];
        }
        rlse[r] = m + log(z);
        for (long long j = lo; j <= t; j++) {
            double pj = p[j] / z, dp = 0;
            for (int d = 0; d < D; d++) dp += ldy[r * D + d] * (double)lv[(h0 + j) * D + d];
            double ds = pj * (dp - dot) * scale;
            for (int d = 0; d < D; d++) {
                rg[r * D + d] += ds * lk[(h0 + j) * D + d];
                rg[n + (h0 + j) * D + d] += ds * lq[r * D + d];
                rg[2 * n + (h0 + j) * D + d] += pj * ldy[r * D + d];
            }
        }
    }
    for (long long r = 0; r < rows; r++) {
        glse[r] = y[att_lse(r, rows, D, H)];
        for (int d = 0; d < D; d++) {
            gy[r * D + d] = y[att_y(r, T, D, H) + d];
            for (int w = 0; w < 3; w++) gg[w * n + r * D + d] = out[att_out(r, w, rows, T, D, H) + d];
        }
    }
    char label[96];
    snprintf(label, sizeof label, "docs B %lld H %lld T %lld D %d%s%s", B, heads, T, D, packed ? " packed" : "", window ? " window" : "");
    double u = 1.0 / 256;
    check("output", nmse(gy, ry, n), (2 * u) * (2 * u), label);
    check("lse", nmse(glse, rlse, rows), 1e-10, label);
    check("dq", nmse(gg, rg, n), (3 * u) * (3 * u), label);
    check("dk", nmse(gg + n, rg + n, n), (3 * u) * (3 * u), label);
    check("dv", nmse(gg + 2 * n, rg + 2 * n, n), (3 * u) * (3 * u), label);
    /* flash2 with the starts (its *_docs kernels): the backward from flash's forward, each variant (k128 at D 64), and
     * at D 64 the forward and its q128 (flash2 runs flash_fwd at D 128); copies early and late for the defaults, late
     * for the variants (the stricter: the same starts code in each, and the emulation's time) */
    uint16_t *dob = new uint16_t[rows * D];
    float *stats = new float[2 * rows], *y2 = new float[ny];
    L_dob = dob, L_stats = stats;
    for (int late = 0; late < 2; late++)
        for (int var = 0; var < V2_COUNT; var++) {
            if ((var == V2_K128 && D != 64) || (var != V2_DEFAULT && !late)) continue;
            for (long long i = 0; i < 3 * n; i++) out[i] = NAN; /* (dq too: k_flash2_prep zeroes it) */
            emu_cp_late = late, emu_cp_overflow = 0, L2_var = var;
            launch2();
            emu_cp_late = 0, L2_var = V2_DEFAULT;
            for (long long r = 0; r < rows; r++)
                for (int d = 0; d < D; d++)
                    for (int w = 0; w < 3; w++) gg[w * n + r * D + d] = out[att_out(r, w, rows, T, D, H) + d];
            char l2[160];
            snprintf(l2, sizeof l2, "flash2%s %s, copies %s", v2_names[var], label, late ? "late" : "early");
            check("dq", nmse(gg, rg, n), (3 * u) * (3 * u), l2);
            check("dk", nmse(gg + n, rg + n, n), (3 * u) * (3 * u), l2);
            check("dv", nmse(gg + 2 * n, rg + 2 * n, n), (3 * u) * (3 * u), l2);
            if (emu_cp_overflow) check("cp.async queue", 1, 0, l2);
            if (D != 64 || var > 1) continue;
            for (long long i = 0; i < ny; i++) y2[i] = NAN;
            float *y1 = L.y;
            L.y = y2, emu_cp_late = late, L2_fwd_var = var;
            launch_fwd2();
            L.y = y1, emu_cp_late = 0, L2_fwd_var = 0;
            for (long long r = 0; r < rows; r++) {
                glse[r] = y2[att_lse(r, rows, D, H)];
                for (int d = 0; d < D; d++) gy[r * D + d] = y2[att_y(r, T, D, H) + d];
            }
            snprintf(l2, sizeof l2, "flash2%s %s, copies %s", v2_fwd_names[var], label, late ? "late" : "early");
            check("output", nmse(gy, ry, n), (2 * u) * (2 * u), l2);
            check("lse", nmse(glse, rlse, rows), 1e-10, l2);
        }
    L.starts = NULL, L.heads = 1, L_dob = NULL, L_stats = NULL;
    delete[] dob, delete[] stats, delete[] y2;
    if (!packed) delete[] bk, delete[] bv;
    delete[] bq, delete[] starts, delete[] lq, delete[] lk, delete[] lv, delete[] ldy, delete[] y, delete[] dy, delete[] out;
    delete[] rowdot, delete[] ry, delete[] rlse, delete[] rg, delete[] p, delete[] gy, delete[] glse, delete[] gg;
}

int main(int argc, char **argv) {
    (void)argv;
    run_case(1, 67, 64, 0);   /* one head, T not a multiple of the tiles */
    run_case(3, 130, 64, 0);  /* several heads, three query tiles, the last of 2 rows */
    run_case(2, 75, 128, 0);  /* D 128 */
    run_case(6, 70, 64, 3);   /* packed qkv (pdde_attention_qkv): 2 batch rows of 3 heads */
    run_case(2, 67, 128, 2);  /* packed, D 128 */
    run_case(2, 200, 64, 0);  /* flash2: several key tiles, query tiles ending mid-tile */
    run_case(1, 143, 128, 0); /* flash2 at D 128: three key tiles */
    run_case(4, 200, 64, 2);  /* flash2 packed: several key tiles of 2 batch rows of 2 heads */
    run_case_f32(1, 67, 64, 0);   /* f32: one head, T not a multiple of the tiles */
    run_case_f32(6, 150, 64, 3);  /* f32 packed (and apart): 2 batch rows of 3 heads, three forward tiles */
    run_case_f32(2, 75, 128, 2);  /* f32 D 128, packed (and apart) */
    run_case_docs(3, 1, 200, 64, 0, 0);  /* documents: one row a single one, two of random lengths (some 1) */
    run_case_docs(2, 2, 150, 64, 1, 0);  /* documents, packed qkv: 2 batch rows of 2 heads */
    run_case_docs(2, 1, 135, 128, 0, 0); /* documents at D 128 */
    run_case_docs(1, 2, 200, 64, 1, 40); /* a sliding window of 40 keys (whole key tiles skipped), packed */
    run_case_docs(1, 1, 75, 128, 0, 20); /* a window at D 128 */
    run_case_docs(2, 2, 140, 128, 1, 0); /* documents at D 128, packed */
    run_case_docs(1, 2, 260, 64, 0, 100); /* a window of 100 keys, 2 heads apart: three of flash2's 128-row groups */
    if (argc > 1) run_case(1, 300, 128, 0);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
