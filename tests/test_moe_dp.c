/* test_moe_dp — a Mixture-of-Experts GPT (an MoE feed-forward in every block, top-2 of 4 experts, the
 * balance loss) under data and expert parallelism from distributed attributes, against one process:
 * 2 ranks (each routes, dispatches and runs the experts on its half of every batch; the experts'
 * gradients averaged with the others), ZeRO-1, expert parallelism (each rank holds 2 of the 4
 * experts: completion sends the tokens' rows to them and back by all-to-all; on 4 ranks one expert a
 * rank, with ZeRO-2), and skewed routing (a balancing bias sends every token to expert 0:
 * three experts get none; on 4 ranks, three ranks hold only experts without tokens), a 2-D mesh of
 * dp 2 x tp 2 with the experts split over tp (attention tensor parallel, the tokens whole over tp: the
 * expert gradients pending over dp only) with and without ZeRO-1, the tokens over 4 ranks with the
 * experts over each group of 2 (mesh dp 2 x ep 2, pdde_strategy_data_parallel_groups: the exchange
 * inside a group, the expert gradients pending over dp; ZeRO-1 with clipping and ZeRO-2, the dense
 * state over dp x ep; ZeRO-3, every parameter and its state split too, each rank's part of the
 * sizes it should be; DeepSeek's bias moved each step by the counts read, which are of all the tokens
 * on every rank; with tp 2 on 8 ranks, each expert's hidden units over tp), and two pipeline
 * stages with each stage's experts over its 2 dp ranks (with and without ZeRO-1), or over the ep
 * groups of its 4 dp ranks (8 ranks: mesh dp 2 x ep 2 x pp 2; ZeRO-3 too; the bias moved by each
 * stage for its own blocks). `test_moe_dp NAME`
 * runs one configuration. The exchange is
 * dropless: only routed rows cross (pdde_session_exchanged_rows: exactly the skewed routing's, and
 * fewer than the padded buffers' otherwise). AdamW without clipping and with eps 1e-3, so a gradient scaled by the rank
 * count would show. Every step's loss within TOL_LOSS relative and every parameter and optimizer state
 * after the last step (gathered through a checkpoint) within TOL_PARAM; the loss must fall; each
 * rank's memory after the steps is what lowering predicts for it (pdde_predict_memory); the expert
 * exchange's buffer is registered (pdde_comm_buffer_alloc: one memfd of this process while the session
 * lives, none after). */
#define _GNU_SOURCE
#include "pdde.h"
#include "examples/gpt.h"
#include "tests/test_util.h"
#include "tests/comm_test_util.h"
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STEPS 12
/* test_dp's tolerances (printed: what was measured) */
#define TOL_LOSS 1e-6  /* measured 1.2e-7 */
#define TOL_PARAM 1e-3 /* measured 1.0e-5 */
#define FLOOR 1e-3
static const pdde_store_server *g_server;
static char tmp_prefix[128];

typedef struct { const char *name; int zero; float capacity; int skewed, ep, ranks, tp, groups, pp; float bias_rate; } moe_config;
typedef struct { float losses[STEPS]; int64_t dense_param, expert_param, expert_state, expert0_tokens, routed, local_experts, local_hidden, dense_state, allocated, predicted, transfer, predicted_transfer, exchanged, padded; int alltoalls, exchanges, registered, registered_after, grad_split, grad_partial, grad_scatters, ok; char error[256]; } run_result;

static gpt_config config_of(const moe_config *mc) {
    gpt_config c = {.vocab = 64, .ctx = 16, .layers = 2, .heads = 2, .width = 32, .batch = 8, .moe_experts = 4, .moe_topk = mc->skewed ? 1 : 2,
                    .moe_capacity = mc->capacity, .moe_aux = 0.01f, .moe_bias = mc->skewed || mc->bias_rate > 0, .moe_ep = mc->ep};
    return c;
}

static void global_batch(int step, int32_t *x, int32_t *y) {
    for (int i = 0; i < 8 * 16; i++) x[i] = (i * 7 + step * 13 + i / 5) % 64, y[i] = (i * 3 + step * 5 + 1) % 64;
}

/* This process's registered buffers (pdde_comm_buffer_alloc): its descriptors that are memfds named so. */
static int registered_buffers(void) {
    int k = 0;
    for (int fd = 0; fd < 1024; fd++) {
        char path[64], link[128];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        ssize_t len = readlink(path, link, sizeof link - 1);
        link[len > 0 ? len : 0] = 0;
        k += strstr(link, "memfd:pdde-buf-") != NULL;
    }
    return k;
}

#define FAIL_WITH(...) do { snprintf(out->error, sizeof out->error, __VA_ARGS__); goto done; } while (0)

static void train(pdde_context *ctx, pdde_comm *comm, const moe_config *mc, run_result *out) {
    gpt_config cfg = config_of(mc);
    pdde_graph *g;
    pdde_graph_init(ctx, &g);
    pdde_session *s = NULL;
    gpt_model m;
    pdde_optimizer_params op = PDDE_OPTIMIZER_PARAMS_INIT;
    op.lr = 3e-3f, op.weight_decay = 0.1f, op.eps = 1e-3f, op.clip_norm = 0;
    if (mc->groups > 1 && mc->zero) op.clip_norm = 0.5f; /* ep groups: the global norm sums every expert's shard once, not once a group */
    int tp = comm && mc->tp > 1 ? mc->tp : 1;
    int pp = comm && mc->pp > 1 ? mc->pp : 1;
    gpt_plan plan = {.dp = comm ? pdde_comm_size(comm) / (tp * pp) : 1, .tp = tp, .pp = pp, .micro = mc->pp > 1 ? 2 : 1, .zero = comm ? mc->zero : 0};
    if (comm && mc->groups > 1) plan.ep = plan.dp / mc->groups; /* experts over groups of ep dp ranks */
    pdde_session_params sp = PDDE_SESSION_PARAMS_INIT;
    sp.world = comm;
    if (gpt_build_plan(g, &cfg, &plan, &op, &m) || pdde_session_init(g, &sp, &s)) FAIL_WITH("setup: %s", pdde_last_error(ctx));
    float bias[2][4] = {{10, 0, 0, 0}, {10, 0, 0, 0}}; /* (scores are in (0, 1)) */
    for (int l = 0; l < cfg.layers && mc->skewed; l++) {
        char name[32];
        snprintf(name, sizeof name, "h%d.moe.bias", l);
        if (pdde_session_write_global(s, pdde_graph_find(g, name), bias[l], sizeof bias[l])) FAIL_WITH("bias: %s", pdde_last_error(ctx));
    }
    for (int i = 0; i < pdde_session_node_count(s); i++) out->alltoalls += pdde_session_node(s, i)->op == PDDE_OP_ALLTOALL;
    for (int i = 0; i < pdde_session_node_count(s); i++) out->exchanges += pdde_session_node(s, i)->op == PDDE_OP_ALLTOALL && pdde_session_node(s, i)->nsrc > 1;
    const pdde_tensor *w1 = pdde_session_tensor(s, pdde_graph_find(g, "h0.moe.w1"));
    out->local_experts = w1 ? w1->shape[0] : -1, out->local_hidden = w1 ? w1->shape[2] : -1;
    const pdde_tensor *state = pdde_session_tensor(s, pdde_graph_find(g, "h0.attn.w.adam_m")); /* (a dense weight's AdamW state) */
    out->dense_state = state ? pdde_tensor_numel(state) : -1;
    const pdde_tensor *dense = pdde_session_tensor(s, pdde_graph_find(g, "h0.attn.w")), *w1_state = pdde_session_tensor(s, pdde_graph_find(g, "h0.moe.w1.adam_m"));
    out->dense_param = dense ? pdde_tensor_numel(dense) : -1, out->expert_param = w1 ? pdde_tensor_numel(w1) : -1;
    out->expert_state = w1_state ? pdde_tensor_numel(w1_state) : -1;
    const pdde_tensor *dw1 = pdde_session_tensor(s, pdde_graph_find(g, "h0.moe.w1")->grad); /* before its reduction */
    out->grad_split = dw1 ? dw1->dist.dims_mapping[0] : -2, out->grad_partial = dw1 ? dw1->dist.partial : -1;
    for (int i = 0; w1 && i < pdde_session_node_count(s); i++) { /* an expert weight gradient reduce-scattered into its shard: reduced over the experts' axis */
        const pdde_tensor *t = pdde_session_node(s, i);
        out->grad_scatters += t->op == PDDE_OP_REDUCE_SCATTER && t->nsrc > 0 && t->src[0] && t->src[0]->op == PDDE_OP_MOE_GROUPED_MATMUL_BACK_W;
    }
    int32_t x[8 * 16], y[8 * 16], counts[4];
    float moving_bias[2 * 4] = {0}; /* (bias_rate: from zeros, by every step's counts) */
    for (int step = 0; step < STEPS; step++) {
        global_batch(step, x, y);
        if (gpt_write_batch(s, &m, &plan, comm ? pdde_comm_rank(comm) / (tp * pp) : 0, x, y) /* (mesh [dp, tp, pp]) */ || pdde_session_run(s, PDDE_RUN_STEP))
            FAIL_WITH("step %d: %s", step, pdde_last_error(ctx));
        out->losses[step] = pdde_session_loss(s);
        if (mc->bias_rate > 0 && gpt_moe_update_bias(s, g, &cfg, mc->bias_rate, moving_bias)) FAIL_WITH("bias step %d: %s", step, pdde_last_error(ctx));
        if (!pdde_session_tensor(s, pdde_graph_find(g, "h0.moe.counts"))) continue; /* (another pipeline stage's) */
        if (pdde_session_read(s, pdde_graph_find(g, "h0.moe.counts"), counts, sizeof counts)) FAIL_WITH("counts: %s", pdde_last_error(ctx));
        out->expert0_tokens += counts[0];
        for (int e = 0; e < 4; e++) out->routed += counts[e];
    }
    out->exchanged = pdde_session_exchanged_rows(s); /* (the last step's) */
    out->registered = registered_buffers();
    for (int i = 0; i < pdde_session_node_count(s); i++) { /* what the padded [E, S, C] exchanges would send to other ranks */
        const pdde_tensor *t = pdde_session_node(s, i);
        int ep = mc->ranks / (mc->groups > 1 ? mc->groups : 1) / (mc->pp > 1 ? mc->pp : 1) / mc->tp; /* (the ranks of an exchange) */
        if (t->op == PDDE_OP_ALLTOALL) out->padded += t->shape[0] * t->shape[1] / ep * (ep - 1) * plan.micro; /* (a step's micro-batches) */
    }
    if (comm) { /* what the session holds after the steps (skewed ones too): what lowering predicts for this rank */
        pdde_memory_stats ms, pm;
        pdde_session_params psp = sp;
        psp.world = NULL;
        if (pdde_session_memory(s, &ms) || pdde_predict_memory(g, &psp, pdde_comm_size(comm), pdde_comm_rank(comm), &pm))
            FAIL_WITH("memory: %s", pdde_last_error(ctx));
        out->allocated = (int64_t)ms.allocated_bytes, out->predicted = (int64_t)pm.allocated_bytes;
        out->transfer = (int64_t)ms.transfer_bytes, out->predicted_transfer = (int64_t)pm.transfer_bytes;
    }
    char path[256];
    snprintf(path, sizeof path, "%s.%s.ckpt", tmp_prefix, comm ? mc->name : "ref");
    if (pdde_checkpoint_save(s, path, NULL)) FAIL_WITH("save: %s", pdde_last_error(ctx));
    out->ok = 1;
done:
    pdde_session_free(s);
    pdde_graph_free(g);
    out->registered_after = registered_buffers();
}

static void train_rank(pdde_context *ctx, pdde_comm *comm, void *arg) { train(ctx, comm, arg, test_rank_result); }

/* The attention key biases' exact gradient is zero: rounding noise, which AdamW turns into steps. */
static int key_bias(const char *name, int len, size_t i) {
    return len >= 9 && name[0] == 'h' && !memcmp(name + 2, ".attn.b", 7) && (len == 9 || name[9] == '.') && i / 16 % 3 == 1;
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL; /* (a config's name: that one alone) */
    pdde_context_params cp = PDDE_CONTEXT_PARAMS_INIT;
    cp.n_threads = 1, cp.backends = "cpu"; /* the ranks' thread count: the same arithmetic */
    pdde_context *ctx;
    pdde_context_init(&cp, &ctx);
    char addr[64];
    pdde_store_server *srv = test_store_serve(ctx, addr, sizeof addr);
    CHECK(srv != NULL, "store server: %s", pdde_last_error(ctx));
    if (test_failed) return test_finish();
    g_server = srv;
    snprintf(tmp_prefix, sizeof tmp_prefix, "/tmp/pdde_test_moe_dp.%d", (int)getpid());
    static const moe_config configs[] = {
        {"moe_dp2", 0, 0, 0, 0, 2, 1, 0, 0, 0},
        {"moe_zero1", 1, 0, 0, 0, 2, 1, 0, 0, 0},
        {"moe_skewed", 0, 0, 1, 0, 2, 1, 0, 0, 0},
        {"moe_ep2", 0, 0, 0, 1, 2, 1, 0, 0, 0},
        {"moe_ep2_skewed", 0, 0, 1, 1, 2, 1, 0, 0, 0},
        {"moe_ep2_zero1", 1, 0, 0, 1, 2, 1, 0, 0, 0},
        {"moe_ep4_zero2", 2, 0, 0, 1, 4, 1, 0, 0, 0}, /* one expert a rank; ZeRO-2 over the same 4 ranks */
        {"moe_ep4_skewed", 0, 0, 1, 1, 4, 1, 0, 0, 0}, /* ranks 1..3: experts without tokens, nothing sent back */
        /* the 4 ranks as 2 hosts of 2: the exchange across hosts in its hierarchical form (PDDE_COMM_A2A_HIER=1) */
        {"moe_ep4_2hosts", 0, 0, 0, 1, 4, 1, 0, 0, 0},
        {"moe_tp2", 0, 0, 0, 0, 2, 2, 0, 0, 0},
        {"moe_tp2_ep2", 0, 0, 0, 1, 2, 2, 0, 0, 0},
        {"moe_dp2_tp2", 0, 0, 0, 0, 4, 2, 0, 0, 0},
        {"moe_dp2_ep2", 0, 0, 0, 1, 4, 2, 0, 0, 0}, /* a 2-D mesh: dp 2 x tp 2, the experts split over tp */
        {"moe_dp2_ep2_zero1", 1, 0, 0, 1, 4, 2, 0, 0, 0},
        /* tokens over all 4 ranks, the experts over each group of 2 (mesh dp 2 x ep 2): the exchange
         * inside a group, the expert gradients reduced over dp, the others over dp x ep */
        {"moe_dp2xep2", 0, 0, 0, 1, 4, 1, 2, 0, 0},
        {"moe_dp2xep2_zero1", 1, 0, 0, 1, 4, 1, 2, 0, 0}, /* and clipping by the global norm */
        {"moe_dp2xep2_zero2", 2, 0, 0, 1, 4, 1, 2, 0, 0}, /* ZeRO over dp x ep: the dense state in quarters */
        /* ZeRO-3: the parameters over dp x ep too (the experts over ep, then dp), gathered where used */
        {"moe_dp2xep2_zero3", 3, 0, 0, 1, 4, 1, 2, 0, 0},
        /* DeepSeek's bias moved by every step's counts: those of all the tokens on every rank (each
         * group's part summed over the groups), so every rank moves the same bias as one process */
        {"moe_dp2xep2_bias", 0, 0, 0, 1, 4, 1, 2, 0, 0.02f},
        /* two pipeline stages (a block each), each stage's experts over its 2 dp ranks; 2 micro-batches */
        {"moe_pp2_ep2", 0, 0, 0, 1, 4, 1, 0, 2, 0},
        {"moe_pp2_ep2_zero1", 1, 0, 0, 1, 4, 1, 0, 2, 0},
        /* two stages, each with its tokens over 4 ranks and its experts over each group of 2 of them */
        /* and tensor parallel over 2 (8 ranks, mesh dp 2 x ep 2 x tp 2): attention as Megatron's, each
         * expert's hidden units split over tp (w1 by columns, w2 by rows) */
        {"moe_dp2xep2_tp2", 0, 0, 0, 1, 8, 2, 2, 0, 0},
        {"moe_dp2xep2_tp2_zero1", 1, 0, 0, 1, 8, 2, 2, 0, 0},
        {"moe_dp2xep2_tp2_zero3", 3, 0, 0, 1, 8, 2, 2, 0, 0},
        {"moe_pp2_dp2xep2", 0, 0, 0, 1, 8, 1, 2, 2, 0},
        {"moe_pp2_dp2xep2_zero1", 1, 0, 0, 1, 8, 1, 2, 2, 0},
        {"moe_pp2_dp2xep2_zero3", 3, 0, 0, 1, 8, 1, 2, 2, 0},
        /* the bias under pipeline stages: each stage moves its own blocks' */
        {"moe_pp2_dp2xep2_bias", 0, 0, 0, 1, 8, 1, 2, 2, 0.02f},
        {"moe_pp2_ep2_bias", 0, 0, 0, 1, 4, 1, 0, 2, 0.02f},
    };
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++) {
        const moe_config *mc = &configs[i];
        if (only && strcmp(only, mc->name)) continue;
        run_result ref = {0}, res[8];
        memset(res, 0, sizeof res);
        test_ranks_params tp = {.addr = addr, .prefix = mc->name, .timeout_s = 60, .n_threads = 1, .server = g_server, .results = res,
                                .result_size = sizeof *res, .hosts = strstr(mc->name, "_2hosts") ? 2 : 0};
        if (tp.hosts) setenv("PDDE_COMM_A2A_HIER", "1", 1);
        test_run_ranks(mc->ranks, &tp, train_rank, (void *)mc, 240);
        unsetenv("PDDE_COMM_A2A_HIER");
        for (int r = 0; r < mc->ranks; r++) {
            CHECK(res[r].ok, "%s rank %d failed: %s", mc->name, r, res[r].error);
            /* the expert exchange's buffer is registered (its peers here copy their rows straight out of
             * it), and returned with the session */
            CHECK((res[r].exchanges == 0 || res[r].registered == 1) && res[r].registered_after == 0,
                  "%s rank %d: %d expert exchanges, %d registered buffers during the steps (want 1), %d after the session", mc->name, r,
                  res[r].exchanges, res[r].registered, res[r].registered_after);
            CHECK(res[r].allocated == res[r].predicted && res[r].allocated > 0, "%s rank %d: %lld bytes allocated, lowering predicts %lld", mc->name, r,
                  (long long)res[r].allocated, (long long)res[r].predicted);
            /* (host buffers too: the expert exchange's, whatever the routing, where it has one) */
            CHECK(res[r].transfer == res[r].predicted_transfer && (res[r].alltoalls == 0 || res[r].transfer > 0),
                  "%s rank %d: %lld host transfer bytes, lowering predicts %lld", mc->name, r, (long long)res[r].transfer,
                  (long long)res[r].predicted_transfer);
        }
        train(ctx, NULL, mc, &ref);
        CHECK(ref.ok, "%s reference: %s", mc->name, ref.error);
        if (!ref.ok || !res[0].ok) continue;
        char what[96], path[256], ref_path[256];
        snprintf(what, sizeof what, "%s: losses", mc->name);
        double worst = test_close_all(what, res[0].losses, ref.losses, STEPS, 0, TOL_LOSS);
        snprintf(what, sizeof what, "%s: after step %d", mc->name, STEPS);
        snprintf(path, sizeof path, "%s.%s.ckpt", tmp_prefix, mc->name), snprintf(ref_path, sizeof ref_path, "%s.ref.ckpt", tmp_prefix);
        double worst_param = test_ckpt_compare_noise(what, path, ref_path, FLOOR, TOL_PARAM, key_bias, 2 * 3e-3 * STEPS);
        double fall = mc->groups > 1 && mc->zero ? 0.01 : 0.05; /* (clipped: slower) */
        CHECK(ref.losses[STEPS - 1] < ref.losses[0] - fall, "%s: the loss falls: %.4f -> %.4f", mc->name, ref.losses[0], ref.losses[STEPS - 1]);
        if (mc->skewed) /* every token to expert 0 (the counts are of all the tokens, on every rank) */
            CHECK(ref.expert0_tokens == (int64_t)STEPS * 8 * 16 && res[0].expert0_tokens == ref.expert0_tokens && res[mc->ranks - 1].expert0_tokens == ref.expert0_tokens,
                  "%s: expert 0 got %lld tokens in one process, %lld + %lld on the ranks, want all %d", mc->name, (long long)ref.expert0_tokens,
                  (long long)res[0].expert0_tokens, (long long)res[1].expert0_tokens, STEPS * 8 * 16);
        for (int r = 0; r < mc->ranks && !mc->pp; r++) /* the counts read: of all the tokens, on every rank */
            CHECK(res[r].routed == ref.routed && ref.routed == (int64_t)STEPS * 8 * 16 * config_of(mc).moe_topk, "%s rank %d: the counts read sum to %lld tokens "
                  "over the steps, one process's to %lld, want %lld", mc->name, r, (long long)res[r].routed, (long long)ref.routed,
                  (long long)STEPS * 8 * 16 * config_of(mc).moe_topk);
        /* expert parallelism: each rank holds half the experts, and the tokens' rows go to them and back
         * by all-to-all, forward and backward, in both blocks: 4 a block at least (data parallelism: none) */
        /* dropless: only routed rows cross. Skewed (every token to expert 0, on rank 0): the tokens of
         * the other ranks go there in 2 exchanges a block (forward and backward) and come back in 4
         * (outputs, and the two weight gradients' rows); rank 0 sends none to the experts, the others
         * none back */
        if (mc->tp > 1 && mc->groups < 2) { /* experts on the tp axis (mesh axis 1 under dp, else 0): the tokens are whole there, so
                             * the experts' rows are a local slice and gathered back (no all-to-all), and each
                             * rank's expert gradient is reduced over dp only */
            int tp_axis = mc->ranks > mc->tp ? 1 : 0, dp_bits = mc->ranks > mc->tp ? 1 : 0;
            CHECK(res[0].local_experts == (mc->ep ? 4 / mc->tp : 4) && res[0].alltoalls == 0 && res[0].exchanged == 0,
                  "%s: %lld experts on rank 0 (want %d), %d all-to-alls, %lld rows exchanged (want none)", mc->name, (long long)res[0].local_experts,
                  mc->ep ? 4 / mc->tp : 4, res[0].alltoalls, (long long)res[0].exchanged);
            if (mc->ep)
                CHECK(res[0].grad_split == tp_axis && res[0].grad_partial == dp_bits && res[0].grad_scatters == 0,
                      "%s: the expert gradient is split over mesh axis %d (want %d), pending over axes 0x%x (want 0x%x: dp only), %d reduce-scatters "
                      "into expert weight shards (want 0)", mc->name, res[0].grad_split, tp_axis, res[0].grad_partial, dp_bits, res[0].grad_scatters);
        } else if (mc->ep && mc->skewed)
            for (int r = 0; r < mc->ranks; r++) {
                int64_t want = (r == 0 ? 4 * (mc->ranks - 1) : 2) * 2 * (8 * 16 / mc->ranks);
                CHECK(res[r].exchanged == want, "%s rank %d: %lld token rows sent in a step, want %lld (padded: %lld)", mc->name, r,
                      (long long)res[r].exchanged, (long long)want, (long long)res[r].padded);
            }
        else if (mc->ep)
            for (int r = 0; r < mc->ranks; r++)
                CHECK(res[r].exchanged > 0 && res[r].exchanged < res[r].padded, "%s rank %d: %lld token rows sent in a step, the padded exchange %lld",
                      mc->name, r, (long long)res[r].exchanged, (long long)res[r].padded);
        if (mc->tp > 1 && mc->groups < 2) ;
        else if (mc->ep) {
            int ep = mc->ranks / (mc->groups > 1 ? mc->groups : 1) / (mc->pp > 1 ? mc->pp : 1) / mc->tp, blocks = mc->pp > 1 ? 1 : 2; /* (rank 0's) */
            CHECK(res[0].local_experts == 4 / ep && res[0].alltoalls >= 4 * blocks, "%s: %lld experts on rank 0 (want %d), %d all-to-alls (want >= %d)",
                  mc->name, (long long)res[0].local_experts, 4 / ep, res[0].alltoalls, 4 * blocks);
            if (mc->groups > 1) /* mesh [dp, ep]: the expert gradient pending over dp (axis 0) and reduce-scattered over ep into its shards */
                CHECK((mc->zero >= 2 || (res[0].grad_partial & 1)) && res[0].grad_scatters >= 1, /* (ZeRO-2: the accumulator split over dp) */ "%s: the expert gradient pending over axes 0x%x (want dp, 0x1, among "
                      "them), %d reduce-scatters into expert shards (want >= 1)", mc->name, res[0].grad_partial, res[0].grad_scatters);
            if (mc->groups > 1 && mc->zero && mc->tp < 2) /* ZeRO: a dense weight's AdamW state split over dp and ep (every rank a part) */
                CHECK(res[0].dense_state == 32 * 96 / (mc->ranks / (mc->pp > 1 ? mc->pp : 1)), "%s: %lld elements of h0.attn.w's AdamW state on rank 0, "
                      "want %d (split over dp x ep)", mc->name, (long long)res[0].dense_state, 32 * 96 / (mc->ranks / (mc->pp > 1 ? mc->pp : 1)));
            if (mc->groups > 1 && mc->zero == 3) { /* ZeRO-3: every rank of a stage holds its own part of each parameter and of its state */
                int stage_ranks = mc->ranks / (mc->pp > 1 ? mc->pp : 1);
                int dense = 32 * 96 / (mc->tp > 1 ? mc->tp * mc->groups : stage_ranks); /* (tp: its two dims over tp and dp, it stays whole over ep) */
                printf("%s: rank 0 holds %lld of h0.attn.w's %d elements, %lld of h0.moe.w1's %d (AdamW state %lld)\n", mc->name,
                       (long long)res[0].dense_param, 32 * 96, (long long)res[0].expert_param, 4 * 32 * 128, (long long)res[0].expert_state);
                CHECK(res[0].dense_param == dense && res[0].dense_state == res[0].dense_param, "%s: %lld elements of h0.attn.w on rank 0 "
                      "(state %lld), want %d (split over %s)", mc->name, (long long)res[0].dense_param, (long long)res[0].dense_state,
                      dense, mc->tp > 1 ? "dp x tp" : "dp x ep");
                CHECK(res[0].expert_param == 4 * 32 * 128 / stage_ranks && res[0].expert_state == res[0].expert_param, "%s: %lld elements of h0.moe.w1 on "
                      "rank 0 (state %lld), want %d (the experts over ep, each over dp%s)", mc->name, (long long)res[0].expert_param,
                      (long long)res[0].expert_state, 4 * 32 * 128 / stage_ranks, mc->tp > 1 ? " and tp" : "");
            }
            if (mc->groups > 1 && mc->tp > 1) /* mesh [dp, ep, tp] (width 32, ffn 4 x 32): each expert's hidden units split over tp, its gradient whole there */
                CHECK(res[0].local_hidden == (4 * 32) / mc->tp && !(res[0].grad_partial & 4), "%s: %lld hidden units of an expert "
                      "on rank 0 (want %lld), the expert gradient pending over axes 0x%x (want not tp, 0x4)", mc->name, (long long)res[0].local_hidden,
                      (long long)(4 * 32) / mc->tp, res[0].grad_partial);
        }
        else CHECK(res[0].local_experts == 4 && res[0].alltoalls == 0, "%s: %lld experts on rank 0 (want 4), %d all-to-alls (want 0)", mc->name,
                   (long long)res[0].local_experts, res[0].alltoalls);
        if (mc->ep && (mc->tp < 2 || mc->groups > 1)) printf("%-14s token rows sent by rank 0 in a step: %lld (the padded exchange: %lld)\n", mc->name, (long long)res[0].exchanged, (long long)res[0].padded);
        printf("%-14s %lld experts a rank, %d all-to-alls; losses %.5f -> %.5f, worst relative difference: losses %.2g (tolerance %.2g), parameters and state %.2g (tolerance %.2g)\n",
               mc->name, (long long)res[0].local_experts, res[0].alltoalls, res[0].losses[0], res[0].losses[STEPS - 1], worst, TOL_LOSS, worst_param, TOL_PARAM);
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -f %s.*", tmp_prefix);
    if (system(cmd)) fprintf(stderr, "could not remove %s.*\n", tmp_prefix);
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
