/* gpt_hf.h — Demonstrates how to start a pdde model from a model hub's weights and give a trained one
 * back: Hugging Face's GPT-2 (GPT2LMHeadModel), LLaMA (LlamaForCausalLM: LLaMA 2 and 3, TinyLlama,
 * SmolLM2, ...; Mistral's, whose window is at least the context, saved as LLaMA), Qwen2
 * (Qwen2ForCausalLM: LLaMA's layers with biases on q, k and v) and Qwen3 (Qwen3ForCausalLM: LLaMA's
 * layers with an RMSNorm on each head of q and k, heads of their own head_dim) directories,
 * config.json and safetensors, to and from gpt.h's model.
 *
 *   gpt_hf_config(dir, &cfg, &max_ctx, why, n)   the model config.json describes, in gpt.h's terms
 *   gpt_hf_load(session, graph, &cfg, path)      its weights into the session's parameters (every rank
 *                                                writes the blocks it holds)
 *   gpt_hf_save(session, graph, &cfg, dir, dtype)  config.json and model.safetensors (F32, BF16 or F16) of the model
 *   gpt_hf_save_peft(session, graph, &cfg, base, dir, dtype)   a LoRA run's adapters alone, as PEFT saves them
 *
 * The layouts (Hugging Face's names; gpt.h's weights are [in, out]):
 *   GPT-2 ("transformer." prefix or none): Conv1D weights are [in, out] as here; c_attn's columns are
 *     [3, H, D] (q of every head, then k, then v), gpt.h's fused columns head-major [H, 3, D].
 *   LLaMA ("model." prefix): nn.Linear weights are [out, in]; q_proj, k_proj and v_proj become gpt.h's
 *     one qkv weight, columns [Hkv, R + 2, D] (the R = H / Hkv query heads of a kv group, its k, its v),
 *     and Qwen2's q, k, v biases its one qkv bias in the same order; Qwen3's q_norm and k_norm [head_dim]
     gpt.h's attn.qn.g and attn.kn.g;
 *     gate_proj, up_proj, down_proj are fc, fc3, fcproj. Both rotate q and k by pairs (i, i + D/2).
 *   lm_head.weight: absent where the head is tied to the embedding (tie_word_embeddings), else gpt.h's
 *     untied "head".
 * LLaMA 3.1's and 3.2's rope_scaling ("llama3") is read too. What gpt.h cannot compute is refused naming
 * the field: other architectures, other rope_scaling types, biases in LLaMA's linears, an activation
 * other than GPT-2's tanh GELU or LLaMA's SiLU. A tensor of the file that the model would not use is
 * refused too (it would be lost). */
#ifndef PDDE_GPT_HF_H
#define PDDE_GPT_HF_H
#include "gpt.h"
#include "json_scan.h"
#include "safetensors.h"

/* config.json: the fields gpt.h needs, read by name at the top level (rope_scaling's one down) */
static const char *const gpt_hf_scaling_names[4] = {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"};
enum { HF_VOCAB, HF_LAYERS, HF_HEADS, HF_KV_HEADS, HF_WIDTH, HF_FFN, HF_MAX_POS, HF_HEAD_DIM, HF_EPS, HF_THETA, HF_TIED, HF_ATT_BIAS, HF_MLP_BIAS,
       HF_WINDOW, HF_USE_WINDOW, HF_WINDOW_LAYERS, HF_N };
typedef struct {
    char model_type[32], architecture[64], activation[32], rope_scaling[32];
    double num[HF_N], scaling[4];
    char bad[200];
} gpt_hf_fields;

/* each field under GPT-2's name and LLaMA's */
static const char *const gpt_hf_names[HF_N][2] = {
    {"vocab_size", "vocab_size"}, {"n_layer", "num_hidden_layers"}, {"n_head", "num_attention_heads"}, {"", "num_key_value_heads"},
    {"n_embd", "hidden_size"}, {"n_inner", "intermediate_size"}, {"n_positions", "max_position_embeddings"}, {"", "head_dim"},
    {"layer_norm_epsilon", "rms_norm_eps"}, {"", "rope_theta"}, {"tie_word_embeddings", "tie_word_embeddings"},
    {"", "attention_bias"}, {"", "mlp_bias"}, {"", "sliding_window"}, {"", "use_sliding_window"},
    {"", "max_window_layers"}};

static inline int gpt_hf_field(void *user, const json_value *v) {
    gpt_hf_fields *f = user;
    const char *k = v->key[0];
    if (!k) return 0;
    if (v->depth == 2 && !strcmp(k, "rope_scaling")) { /* (its type, under either name, and LLaMA 3's numbers) */
        const char *field = v->key[1] ? v->key[1] : "";
        if (v->type == JSON_STRING && (!strcmp(field, "rope_type") || !strcmp(field, "type"))) snprintf(f->rope_scaling, sizeof f->rope_scaling, "%s", v->string);
        else if (!f->rope_scaling[0]) snprintf(f->rope_scaling, sizeof f->rope_scaling, "(unnamed)");
        for (int i = 0; i < 4; i++)
            if (v->type == JSON_NUMBER && !strcmp(field, gpt_hf_scaling_names[i])) f->scaling[i] = v->number;
    }
    if (v->depth == 2 && !strcmp(k, "architectures") && v->type == JSON_STRING && v->index[1] == 0)
        snprintf(f->architecture, sizeof f->architecture, "%s", v->string);
    if (v->depth != 1) return 0;
    char *text = !strcmp(k, "model_type") ? f->model_type : !strcmp(k, "activation_function") || !strcmp(k, "hidden_act") ? f->activation : NULL;
    if (text && v->type == JSON_STRING) snprintf(text, sizeof f->model_type, "%s", v->string);
    for (int i = 0; i < HF_N; i++)
        for (int a = 0; a < 2; a++) {
            if (strcmp(k, gpt_hf_names[i][a])) continue;
            if (v->type == JSON_NUMBER || v->type == JSON_TRUE || v->type == JSON_FALSE) f->num[i] = v->type == JSON_NUMBER ? v->number : v->type == JSON_TRUE;
            else if (v->type != JSON_NULL) snprintf(f->bad, sizeof f->bad, "%s: a number expected", k);
        }
    return 0;
}

/* The model of dir/config.json as gpt.h's config (arch, layers, heads, kv heads, width, vocab, ffn, rope
 * base and scaling, norm eps, untied head, attention window; the run's fields of c untouched) and its positions (*max_ctx); 0, or -1
 * with why[] naming the field */
static inline int gpt_hf_config(const char *dir, gpt_config *c, int *max_ctx, char *why, size_t why_size) {
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    gpt_hf_fields f = {.num = {0}};
    for (int i = 0; i < HF_N; i++) f.num[i] = -1; /* (not given) */
    for (int i = 0; i < 4; i++) f.scaling[i] = -1;
    if (json_scan_file(path, 1 << 24, gpt_hf_field, &f, why, why_size)) return st_prefix(why, why_size, dir, "/config.json"), -1;
    /* (Mistral's: LLaMA's layers, attention in a window; Qwen2's: LLaMA's with biases on q, k and v, a window only if it says so,
     * on the layers from max_window_layers on; Qwen3's: Qwen2's window, no biases, q and k normed per head) */
    int qwen2 = !strcmp(f.model_type, "qwen2"), qwen3 = !strcmp(f.model_type, "qwen3"), mistral = !strcmp(f.model_type, "mistral");
    int llama = !strcmp(f.model_type, "llama") || mistral || qwen2 || qwen3;
    if (!llama && strcmp(f.model_type, "gpt2"))
        return snprintf(why, why_size, "%s/config.json: model_type \"%s\" (%s): gpt builds \"gpt2\" (GPT2LMHeadModel), \"llama\" (LlamaForCausalLM), "
                        "\"mistral\", \"qwen2\" and \"qwen3\"", dir, f.model_type, f.architecture[0] ? f.architecture : "no architectures"), -1;
    double window = (mistral || ((qwen2 || qwen3) && f.num[HF_USE_WINDOW] > 0)) && f.num[HF_WINDOW] >= 0 ? f.num[HF_WINDOW] : 0;
    if (window && !(window >= 1 && window <= INT32_MAX && window == (int)window))
        return snprintf(why, why_size, "%s/config.json: sliding_window %g: an integer >= 1 expected", dir, window), -1;
    double window_from = f.num[HF_WINDOW_LAYERS] >= 0 ? f.num[HF_WINDOW_LAYERS] : 28; /* (Qwen's first windowed layer; 28 its classes' default) */
    if (window && (qwen2 || qwen3) && window_from > 0 && window_from < f.num[HF_LAYERS])
        return snprintf(why, why_size, "%s/config.json: max_window_layers %g: the layers before it attend to the whole context, the rest in a "
                        "window: gpt windows every layer or none", dir, window_from), -1;
    if ((qwen2 || qwen3) && window_from >= f.num[HF_LAYERS]) window = 0; /* (no layer is past it) */
    if (f.bad[0]) return snprintf(why, why_size, "%s/config.json: %s", dir, f.bad), -1;
    const char *act = llama ? "silu" : "gelu_new";
    if (f.activation[0] && strcmp(f.activation, act) && !(!llama && !strcmp(f.activation, "gelu_pytorch_tanh")))
        return snprintf(why, why_size, "%s/config.json: %s \"%s\": gpt's %s MLP computes %s", dir, llama ? "hidden_act" : "activation_function", f.activation,
                        llama ? "LLaMA" : "GPT-2", act), -1;
    int llama3 = !strcmp(f.rope_scaling, "llama3");
    if (f.rope_scaling[0] && strcmp(f.rope_scaling, "default") && !llama3)
        return snprintf(why, why_size, "%s/config.json: rope_scaling \"%s\": gpt's RoPE scales as LLaMA 3.1's (\"llama3\") only", dir, f.rope_scaling), -1;
    const double *r = f.scaling;
    if (llama3 && !(r[0] >= 1 && r[1] > 0 && r[2] > r[1] && r[3] > 0 && r[0] < 1e6 && r[2] < 1e6 && r[3] < 1e9))
        return snprintf(why, why_size, "%s/config.json: rope_scaling llama3: factor %g (>= 1), low_freq_factor %g and high_freq_factor %g "
                        "(0 < low < high), original_max_position_embeddings %g (> 0) expected", dir, r[0], r[1], r[2], r[3]), -1;
    for (int i = HF_ATT_BIAS; i <= HF_MLP_BIAS; i++)
        if (llama && f.num[i] > 0) return snprintf(why, why_size, "%s/config.json: %s true: gpt's LLaMA linears have no biases", dir, gpt_hf_names[i][1]), -1;
    static const int ints[] = {HF_VOCAB, HF_LAYERS, HF_HEADS, HF_WIDTH, HF_MAX_POS, HF_KV_HEADS, HF_FFN}; /* (the last two may be left out) */
    static const double most[] = {1 << 24, 4096, 1 << 16, 1 << 16, 1 << 24, 1 << 16, 1 << 24};
    for (int i = 0; i < 7; i++) {
        double v = f.num[ints[i]];
        if (!(v >= 1 && v <= most[i] && v == (int)v) && !(i >= 5 && v == -1))
            return snprintf(why, why_size, "%s/config.json: %s = %g: an integer 1 .. %g expected", dir, gpt_hf_names[ints[i]][llama], v, most[i]), -1;
    }
    gpt_config m = *c;
    m.arch = llama ? GPT_ARCH_LLAMA : GPT_ARCH_GPT;
    m.vocab = (int)f.num[HF_VOCAB], m.layers = (int)f.num[HF_LAYERS], m.heads = (int)f.num[HF_HEADS], m.width = (int)f.num[HF_WIDTH];
    m.kv_heads = llama && f.num[HF_KV_HEADS] > 0 ? (int)f.num[HF_KV_HEADS] : 0;
    m.ffn = f.num[HF_FFN] > 0 ? (int)f.num[HF_FFN] : llama ? -1 : 4 * m.width;
    m.rope_base = llama ? (float)(f.num[HF_THETA] > 0 ? f.num[HF_THETA] : 10000) : 0;
    for (int i = 0; i < 4; i++) m.rope_scaling[i] = llama3 ? (float)r[i] : 0;
    m.norm_eps = (float)(f.num[HF_EPS] > 0 ? f.num[HF_EPS] : llama ? 1e-6 : 1e-5); /* (each class's default) */
    m.untied_head = f.num[HF_TIED] >= 0 ? f.num[HF_TIED] == 0 : llama && !qwen2; /* (LlamaConfig and Qwen3Config untie by default, GPT2Config and Qwen2Config tie) */
    m.qkv_bias = qwen2, m.qk_norm = qwen3, m.window = (int)window;
    double head_dim = f.num[HF_HEAD_DIM] > 0 ? f.num[HF_HEAD_DIM] : qwen3 ? 128 : 0; /* (Qwen3Config's default; LLaMA's: width / heads) */
    m.head_dim = llama && head_dim > 0 && head_dim != (double)m.width / m.heads ? (int)head_dim : 0;
    if (m.ffn < 1) return snprintf(why, why_size, "%s/config.json: no intermediate_size", dir), -1;
    int bad_head = llama ? head_dim > 4096 || head_dim != (int)head_dim || (!head_dim && m.width % m.heads)
                         : m.width % m.heads || (head_dim > 0 && head_dim != m.width / m.heads);
    if (bad_head)
        return snprintf(why, why_size, "%s/config.json: a head dim of %g with %d heads of width %d: %s", dir, head_dim > 0 ? head_dim : (double)m.width / m.heads,
                        m.heads, m.width, llama ? "an integer up to 4096 expected (head_dim, or width / heads)" : "GPT-2's heads split the width"), -1;
    if (llama && (m.heads % (m.kv_heads ? m.kv_heads : m.heads) || gpt_head_dim(&m) % 2))
        return snprintf(why, why_size, "%s/config.json: num_key_value_heads %d must divide num_attention_heads %d, and the head dim %d be even", dir,
                        m.kv_heads, m.heads, gpt_head_dim(&m)), -1;
    *c = m, *max_ctx = (int)f.num[HF_MAX_POS];
    return 0;
}

/* Whether model c (gpt_hf_config's, with this run's context and flags) can take the weights: 0, or -1 with
 * why[] naming the flag */
static inline int gpt_hf_fits(const gpt_config *c, int max_ctx, char *why, size_t why_size) {
    if (c->moe_experts > 1) return snprintf(why, why_size, "Hugging Face's GPT-2 and LLaMA have no experts (--moe-experts)"), -1;
    if (c->arch == GPT_ARCH_GPT && c->ctx > max_ctx) return snprintf(why, why_size, "--ctx %d, but the model's positions stop at %d", c->ctx, max_ctx), -1;
    return 0;
}

/* The Hugging Face tensors of model c, in the order gpt_hf_save writes them: each is (a part of) gpt.h's
 * parameter `mine` laid out as `how` */
enum { HF_SAME, HF_TRANSPOSE, HF_GPT2_QKV_W, HF_GPT2_QKV_B, HF_LLAMA_Q, HF_LLAMA_K, HF_LLAMA_V };
typedef struct {
    char hf[112], mine[32];
    int how, ndim;
    int64_t shape[2]; /* the Hugging Face tensor's */
    char adapter;     /* 0: the weight; 'A' or 'B': PEFT's lora_A [r, in] or lora_B [out, r] of it (gpt_hf_adapters) */
} gpt_hf_tensor;

static inline int gpt_hf_tensors(const gpt_config *c, const char *prefix, gpt_hf_tensor *t) {
    int n = 0, llama = c->arch == GPT_ARCH_LLAMA;
    int64_t C = c->width, F = gpt_ffn(c), V = c->vocab, H = c->heads, Hkv = gpt_kv_heads(c), D = gpt_head_dim(c);
#define HF_ADD(MINE, HOW, ROWS, COLS, ...)                                                                                               \
    do {                                                                                                                                 \
        if (t) {                                                                                                                         \
            snprintf(t[n].mine, sizeof t[n].mine, "%s", MINE), snprintf(t[n].hf, sizeof t[n].hf, __VA_ARGS__);                          \
            t[n].how = HOW, t[n].ndim = (COLS) > 0 ? 2 : 1, t[n].shape[0] = ROWS, t[n].shape[1] = COLS, t[n].adapter = 0;                   \
        }                                                                                                                                \
        n++;                                                                                                                             \
    } while (0)
    char m[32];
    HF_ADD("wte", HF_SAME, V, C, "%s%s", prefix, llama ? "embed_tokens.weight" : "wte.weight");
    if (!llama) HF_ADD("wpe", HF_SAME, c->ctx, C, "%swpe.weight", prefix);
    for (int l = 0; l < c->layers; l++) {
        const char *hl = llama ? "layers" : "h";
#define HF_MINE(NAME) (snprintf(m, sizeof m, "h%d.%s", l, NAME), m)
        HF_ADD(HF_MINE("ln1.g"), HF_SAME, C, 0, "%s%s.%d.%s", prefix, hl, l, llama ? "input_layernorm.weight" : "ln_1.weight");
        if (llama) {
            HF_ADD(HF_MINE("attn.w"), HF_LLAMA_Q, H * D, C, "%slayers.%d.self_attn.q_proj.weight", prefix, l);
            HF_ADD(HF_MINE("attn.w"), HF_LLAMA_K, Hkv * D, C, "%slayers.%d.self_attn.k_proj.weight", prefix, l);
            HF_ADD(HF_MINE("attn.w"), HF_LLAMA_V, Hkv * D, C, "%slayers.%d.self_attn.v_proj.weight", prefix, l);
            for (int k = 0; k < 3 && c->qkv_bias; k++) /* (Qwen2's) */
                HF_ADD(HF_MINE("attn.b"), HF_LLAMA_Q + k, k ? Hkv * D : H * D, 0, "%slayers.%d.self_attn.%c_proj.bias", prefix, l, "qkv"[k]);
            HF_ADD(HF_MINE("proj.w"), HF_TRANSPOSE, C, H * D, "%slayers.%d.self_attn.o_proj.weight", prefix, l);
            if (c->qk_norm) { /* (Qwen3's) */
                HF_ADD(HF_MINE("attn.qn.g"), HF_SAME, D, 0, "%slayers.%d.self_attn.q_norm.weight", prefix, l);
                HF_ADD(HF_MINE("attn.kn.g"), HF_SAME, D, 0, "%slayers.%d.self_attn.k_norm.weight", prefix, l);
            }
            HF_ADD(HF_MINE("ln2.g"), HF_SAME, C, 0, "%slayers.%d.post_attention_layernorm.weight", prefix, l);
            HF_ADD(HF_MINE("fc.w"), HF_TRANSPOSE, F, C, "%slayers.%d.mlp.gate_proj.weight", prefix, l);
            HF_ADD(HF_MINE("fc3.w"), HF_TRANSPOSE, F, C, "%slayers.%d.mlp.up_proj.weight", prefix, l);
            HF_ADD(HF_MINE("fcproj.w"), HF_TRANSPOSE, C, F, "%slayers.%d.mlp.down_proj.weight", prefix, l);
            continue;
        }
        HF_ADD(HF_MINE("ln1.b"), HF_SAME, C, 0, "%sh.%d.ln_1.bias", prefix, l);
        HF_ADD(HF_MINE("attn.w"), HF_GPT2_QKV_W, C, 3 * C, "%sh.%d.attn.c_attn.weight", prefix, l);
        HF_ADD(HF_MINE("attn.b"), HF_GPT2_QKV_B, 3 * C, 0, "%sh.%d.attn.c_attn.bias", prefix, l);
        HF_ADD(HF_MINE("proj.w"), HF_SAME, C, C, "%sh.%d.attn.c_proj.weight", prefix, l);
        HF_ADD(HF_MINE("proj.b"), HF_SAME, C, 0, "%sh.%d.attn.c_proj.bias", prefix, l);
        HF_ADD(HF_MINE("ln2.g"), HF_SAME, C, 0, "%sh.%d.ln_2.weight", prefix, l);
        HF_ADD(HF_MINE("ln2.b"), HF_SAME, C, 0, "%sh.%d.ln_2.bias", prefix, l);
        HF_ADD(HF_MINE("fc.w"), HF_SAME, C, F, "%sh.%d.mlp.c_fc.weight", prefix, l);
        HF_ADD(HF_MINE("fc.b"), HF_SAME, F, 0, "%sh.%d.mlp.c_fc.bias", prefix, l);
        HF_ADD(HF_MINE("fcproj.w"), HF_SAME, F, C, "%sh.%d.mlp.c_proj.weight", prefix, l);
        HF_ADD(HF_MINE("fcproj.b"), HF_SAME, C, 0, "%sh.%d.mlp.c_proj.bias", prefix, l);
#undef HF_MINE
    }
    HF_ADD("lnf.g", HF_SAME, C, 0, "%s%s", prefix, llama ? "norm.weight" : "ln_f.weight");
    if (!llama) HF_ADD("lnf.b", HF_SAME, C, 0, "%sln_f.bias", prefix);
    if (c->untied_head) HF_ADD("head", HF_SAME, V, C, "lm_head.weight");
#undef HF_ADD
    return n;
}

/* Where element (r, k) of Hugging Face tensor t goes in gpt.h's parameter of model c (its flat index),
 * or -1 where it has no place there (the rows of GPT-2's positions past the model's context) */
static inline int64_t gpt_hf_index(const gpt_hf_tensor *t, const gpt_config *c, int64_t r, int64_t k) {
    int64_t rows = t->shape[0], cols = t->ndim > 1 ? t->shape[1] : 1, C = c->width, D = gpt_head_dim(c);
    int64_t R = c->heads / gpt_kv_heads(c), QKV = (c->heads + 2 * (int64_t)gpt_kv_heads(c)) * D;
    switch (t->how) {
    case HF_TRANSPOSE: return k * rows + r; /* [out, in] there, [in, out] here */
    case HF_GPT2_QKV_W: case HF_GPT2_QKV_B: { /* there column j = (part, h, d), here (h, part, d) */
        int64_t j = t->how == HF_GPT2_QKV_W ? k : r, part = j / C, h = j % C / D, col = (h * 3 + part) * D + j % D;
        return t->how == HF_GPT2_QKV_W ? r * 3 * C + col : col;
    }
    case HF_LLAMA_Q: case HF_LLAMA_K: case HF_LLAMA_V: { /* there row r = (head, d) of [out, in]; here column (group, slot, d) */
        int64_t head = r / D, group = t->how == HF_LLAMA_Q ? head / R : head;
        int64_t slot = t->how == HF_LLAMA_Q ? head % R : t->how == HF_LLAMA_K ? R : R + 1;
        return k * QKV + (group * (R + 2) + slot) * D + r % D;
    }
    default: return !strcmp(t->mine, "wpe") && r >= c->ctx ? -1 : r * cols + k;
    }
}

/* Buffers known to Hugging Face's checkpoints that hold no weight (GPT-2's causal masks, old LLaMA's
 * rotary frequencies): left out */
static inline int gpt_hf_buffer(const char *name) {
    static const char *const ends[] = {".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq"};
    size_t n = strlen(name);
    for (int i = 0; i < 3; i++)
        if (n >= strlen(ends[i]) && !strcmp(name + n - strlen(ends[i]), ends[i])) return 1;
    return 0;
}

/* Writes the weights of path (a directory of config.json and safetensors, or one .safetensors file)
 * into the parameters of model m (gpt_build with c, as gpt_hf_config describes the directory) in
 * session s: every rank writes the blocks it holds. */
static inline pdde_status gpt_hf_load(pdde_session *s, pdde_graph *g, const gpt_config *c, const char *path) {
    pdde_context *ctx = pdde_graph_context(g);
    st_model file;
    char why[600];
    if (st_open(path, &file, why, sizeof why)) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s", why);
    const char *prefix = c->arch == GPT_ARCH_LLAMA ? "model." : st_find(&file, "transformer.wte.weight") ? "transformer." : "";
    int n = gpt_hf_tensors(c, prefix, NULL);
    gpt_hf_tensor *t = malloc((size_t)n * sizeof *t);
    pdde_status st = t ? PDDE_OK : PDDE_ERR_OOM;
    if (t) gpt_hf_tensors(c, prefix, t);
    const st_tensor **found = calloc((size_t)n + 1, sizeof *found);
    int64_t big = 0;
    for (int i = 0; i < n && !st; i++) { /* every tensor there, of its shape, before anything is written */
        const st_tensor *f = found[i] = st_find(&file, t[i].hf);
        int64_t want_rows = strcmp(t[i].mine, "wpe") ? t[i].shape[0] : -1; /* (GPT-2's positions: at least the context's) */
        if (!f) { st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: no tensor %s (the model's %s)", path, t[i].hf, t[i].mine); break; }
        if (f->ndim != t[i].ndim || (want_rows >= 0 ? f->shape[0] != want_rows : f->shape[0] < c->ctx) || (f->ndim > 1 && f->shape[1] != t[i].shape[1])) {
            char there[64] = "", here[64] = "";
            for (int d = 0; d < f->ndim; d++) snprintf(there + strlen(there), sizeof there - strlen(there), "%s%lld", d ? ", " : "", (long long)f->shape[d]);
            for (int d = 0; d < t[i].ndim; d++) snprintf(here + strlen(here), sizeof here - strlen(here), "%s%lld", d ? ", " : "", (long long)t[i].shape[d]);
            st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: tensor %s is [%s], the model's %s needs [%s]", path, t[i].hf, there, t[i].mine, here);
        }
        big = st_numel(f) > big ? st_numel(f) : big;
    }
    for (int k = 0; k < file.n && !st; k++) { /* and nothing there that the model would lose */
        int known = gpt_hf_buffer(file.t[k].name) || (!c->untied_head && !strcmp(file.t[k].name, "lm_head.weight"));
        for (int i = 0; i < n && !known; i++) known = found[i] == &file.t[k];
        if (!known)
            st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: tensor %s has no place in gpt's %s model (%d layers): another architecture, or "
                            "more layers than config.json says", path, file.t[k].name, gpt_arch_name(c->arch), c->layers);
    }
    float *there = st ? NULL : malloc((size_t)big * sizeof *there), *mine = NULL;
    if (!st && !there) st = PDDE_ERR_OOM;
    for (int i = 0; i < n && !st; i++) {
        pdde_tensor *p = pdde_graph_find(g, t[i].mine);
        if (!p) { st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: the model has no parameter %s", path, t[i].mine); break; }
        int64_t count = pdde_tensor_numel(p), rows = found[i]->shape[0], cols = found[i]->ndim > 1 ? found[i]->shape[1] : 1;
        if (i == 0 || strcmp(t[i].mine, t[i - 1].mine)) { /* (LLaMA's q, k and v fill one parameter) */
            free(mine);
            if (!(mine = malloc((size_t)count * sizeof *mine))) { st = PDDE_ERR_OOM; break; }
        }
        if (st_read_f32(&file, found[i], there, why, sizeof why)) { st = pdde_error(ctx, PDDE_ERR_IO, "%s", why); break; }
        for (int64_t r = 0; r < rows; r++)
            for (int64_t k = 0; k < cols; k++) {
                int64_t at = gpt_hf_index(&t[i], c, r, k);
                if (at >= 0) mine[at] = there[r * cols + k];
            }
        if (i + 1 == n || strcmp(t[i].mine, t[i + 1].mine)) st = pdde_session_write_global(s, p, mine, (size_t)count * sizeof *mine);
    }
    free(there), free(mine), free(found), free(t);
    st_close(&file);
    return st;
}

/* v in the fewest digits that read back as v (1e-06, not 9.99999997e-07) */
static inline void gpt_hf_float(char buf[32], float v) {
    for (int digits = 6; digits <= 9; digits++)
        if (snprintf(buf, 32, "%.*g", digits, v), (float)strtod(buf, NULL) == v) return;
}

/* PEFT's LoRA tensors of model c (lora_rank > 0): for each linear of the blocks in gpt_hf_tensors,
 * base_model.model.<its name>.lora_A.weight [r, in] and .lora_B.weight [out, r]; their count */
static inline int gpt_hf_adapters(const gpt_config *c, gpt_hf_tensor *out) {
    int llama = c->arch == GPT_ARCH_LLAMA, n = gpt_hf_tensors(c, llama ? "model." : "transformer.", NULL), k = 0;
    gpt_hf_tensor *t = malloc((size_t)n * sizeof *t);
    if (!t) return -1;
    gpt_hf_tensors(c, llama ? "model." : "transformer.", t);
    for (int i = 0; i < n; i++) {
        size_t len = strlen(t[i].mine), hl = strlen(t[i].hf);
        if (t[i].mine[0] != 'h' || len < 2 || strcmp(t[i].mine + len - 2, ".w") || hl < 7) continue; /* (the blocks' weights) */
        int linear = t[i].how != HF_SAME && t[i].how != HF_GPT2_QKV_W; /* ([out, in]; GPT-2's Conv1D is [in, out]) */
        int64_t in = linear ? t[i].shape[1] : t[i].shape[0], outs = linear ? t[i].shape[0] : t[i].shape[1];
        for (int part = 0; part < 2 && out; part++, k++) {
            out[k] = t[i], out[k].adapter = part ? 'B' : 'A', out[k].ndim = 2;
            out[k].shape[0] = part ? outs : c->lora_rank, out[k].shape[1] = part ? c->lora_rank : in;
            snprintf(out[k].hf, sizeof out[k].hf, "base_model.model.%.*s.lora_%c.weight", (int)(hl - 7), t[i].hf, part ? 'B' : 'A');
        }
        if (!out) k += 2;
    }
    free(t);
    return k;
}

/* Value (r, k) of Hugging Face tensor t from `mine`, the values of gpt.h's parameter t->mine (merged under
 * LoRA), or for an adapter those of its lora_a [in, rank] or lora_b [rank, outs] */
static inline float gpt_hf_value(const gpt_hf_tensor *t, const gpt_config *c, const float *mine, int64_t outs, int64_t r, int64_t k) {
    int64_t rank = c->lora_rank;
    if (t->adapter == 'A') return mine[k * rank + r]; /* lora_A [rank, in] is A transposed: the inputs are in the same order */
    if (t->adapter != 'B') return mine[gpt_hf_index(t, c, r, k)];
    int linear = t->how != HF_SAME && t->how != HF_GPT2_QKV_W; /* lora_B [out, rank]: output r where the weight puts it */
    return mine[k * outs + (linear ? gpt_hf_index(t, c, r, 0) % outs : gpt_hf_index(t, c, 0, r))];
}

/* Writes tensors t[0 .. n) from session s as dtype (F32, or the f32 values rounded to the nearest BF16 or F16) into
 * dir/file (through a temporary and a rename) */
static inline pdde_status gpt_hf_write(pdde_session *s, pdde_graph *g, const gpt_config *c, const gpt_hf_tensor *t, int n, const char *dir,
                                       const char *file, st_dtype dtype) {
    pdde_context *ctx = pdde_graph_context(g);
    const char **names = malloc((size_t)n * sizeof *names);
    int *ndims = malloc((size_t)n * sizeof *ndims);
    int64_t (*shapes)[ST_MAX_DIMS] = calloc((size_t)n, sizeof *shapes), big = 0;
    pdde_status st = !names || !ndims || !shapes ? PDDE_ERR_OOM : PDDE_OK;
    for (int i = 0; i < n && !st; i++) {
        names[i] = t[i].hf, ndims[i] = t[i].ndim, shapes[i][0] = t[i].shape[0], shapes[i][1] = t[i].shape[1];
        int64_t numel = t[i].shape[0] * (t[i].ndim > 1 ? t[i].shape[1] : 1);
        big = numel > big ? numel : big;
    }
    char path[4200], tmp[4210], name[80];
    snprintf(path, sizeof path, "%s/%s", dir, file), snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = st ? NULL : fopen(tmp, "wb");
    if (!st && !f) st = pdde_error(ctx, PDDE_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (!st && st_write_header(f, n, names, ndims, (const int64_t(*)[ST_MAX_DIMS])shapes, dtype)) st = pdde_error(ctx, PDDE_ERR_IO, "%s: %s", tmp, strerror(errno));
    float *there = st ? NULL : malloc((size_t)big * sizeof *there), *mine = NULL;
    uint16_t *half = st || dtype == ST_F32 ? NULL : malloc((size_t)big * sizeof *half);
    if (!st && (!there || (dtype != ST_F32 && !half))) st = PDDE_ERR_OOM;
    int64_t outs = 0;
    for (int i = 0; i < n && !st; i++) {
        if (i == 0 || strcmp(t[i].mine, t[i - 1].mine) || t[i].adapter != t[i - 1].adapter) { /* (LLaMA's q, k and v come from one parameter) */
            snprintf(name, sizeof name, "%.*s.lora_%c", (int)strlen(t[i].mine) - 2, t[i].mine, t[i].adapter == 'A' ? 'a' : 'b');
            pdde_tensor *p = pdde_graph_find(g, t[i].adapter ? name : t[i].mine);
            free(mine);
            mine = p ? malloc((size_t)pdde_tensor_numel(p) * sizeof *mine) : NULL;
            st = !p ? pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: the model has no %s", path, t[i].adapter ? name : t[i].mine)
               : !mine ? PDDE_ERR_OOM : t[i].adapter ? pdde_session_read(s, p, mine, pdde_tensor_nbytes(p)) : gpt_read_weight(s, g, c, p, mine);
            outs = p && p->ndim == 2 ? p->shape[1] : 0;
            if (st) break;
        }
        int64_t rows = t[i].shape[0], cols = t[i].ndim > 1 ? t[i].shape[1] : 1;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t k = 0; k < cols; k++) there[r * cols + k] = gpt_hf_value(&t[i], c, mine, outs, r, k);
        for (int64_t e = 0; half && e < rows * cols; e++) half[e] = dtype == ST_BF16 ? pdde_f32_to_bf16(there[e]) : pdde_f32_to_f16(there[e]);
        if (half ? fwrite(half, sizeof *half, (size_t)(rows * cols), f) != (size_t)(rows * cols)
                 : fwrite(there, sizeof *there, (size_t)(rows * cols), f) != (size_t)(rows * cols))
            st = pdde_error(ctx, PDDE_ERR_IO, "%s: writing %s: %s", tmp, t[i].hf, strerror(errno));
    }
    if (f && fclose(f) && !st) st = pdde_error(ctx, PDDE_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path)) st = pdde_error(ctx, PDDE_ERR_IO, "%s: %s", path, strerror(errno));
    if (st && f) remove(tmp);
    free(there), free(half), free(mine), free(names), free(ndims), free(shapes);
    return st;
}

/* torch_dtype in config.json for a safetensors dtype */
static inline const char *gpt_hf_torch_dtype(st_dtype d) { return d == ST_BF16 ? "bfloat16" : d == ST_F16 ? "float16" : "float32"; }

/* Writes model m (gpt_build with c) from session s into directory dir (made if missing): config.json
 * and model.safetensors of dtype (F32, BF16 or F16), as Hugging Face's save_pretrained lays them out (GPT-2 under
 * "transformer.", LLaMA under "model."; lm_head.weight only when untied); max positions = c->ctx. The
 * calling rank must hold every parameter whole (gpt_partial). Each file goes through a temporary
 * and a rename. */
static inline pdde_status gpt_hf_save(pdde_session *s, pdde_graph *g, const gpt_config *c, const char *dir, st_dtype dtype) {
    pdde_context *ctx = pdde_graph_context(g);
    int llama = c->arch == GPT_ARCH_LLAMA;
    if (c->moe_experts > 1) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: Hugging Face's GPT-2 and LLaMA have no experts (--moe-experts)", dir);
    if (c->qkv_bias && c->qk_norm)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: biases on q, k and v (Qwen2's) with q and k norms (Qwen3's): no Hugging Face class has both", dir);
    int window = gpt_window(c); /* (Mistral's sliding_window; Qwen's on every layer) */
    if (window && !llama) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: an attention window of %d: GPT-2's class has none", dir, window);
    char name[64];
    if (gpt_partial(s, g, name, sizeof name))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: this rank holds a part of parameter %s, or none: save from a rank that holds every "
                          "parameter whole (one process: a checkpoint loads under any plan)", dir, name);
    if (mkdir(dir, 0755) && errno != EEXIST) return pdde_error(ctx, PDDE_ERR_IO, "%s: %s", dir, strerror(errno));
    char path[4200], tmp[4210];
    snprintf(path, sizeof path, "%s/config.json", dir), snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return pdde_error(ctx, PDDE_ERR_IO, "%s: %s", tmp, strerror(errno));
    char eps[32], theta[32], scaling[320] = "null", v[4][32];
    gpt_hf_float(eps, gpt_norm_eps(c)), gpt_hf_float(theta, gpt_rope_base(c));
    for (int i = 0; i < 4; i++) gpt_hf_float(v[i], c->rope_scaling[i]);
    if (c->rope_scaling[0] > 0)
        snprintf(scaling, sizeof scaling, "{\"rope_type\": \"llama3\", \"%s\": %s, \"%s\": %s, \"%s\": %s, \"%s\": %s}", gpt_hf_scaling_names[0], v[0],
                 gpt_hf_scaling_names[1], v[1], gpt_hf_scaling_names[2], v[2], gpt_hf_scaling_names[3], v[3]);
    char layers[200];
    if (c->qkv_bias || c->qk_norm) /* (Qwen's window: on the layers from max_window_layers on) */
        snprintf(layers, sizeof layers, "%s\"use_sliding_window\": %s,\n  \"sliding_window\": %d,\n  \"max_window_layers\": 0",
                 c->qk_norm ? "\"attention_bias\": false,\n  " : "", window ? "true" : "false", window ? window : c->ctx);
    else if (window)
        snprintf(layers, sizeof layers, "\"sliding_window\": %d", window);
    else
        snprintf(layers, sizeof layers, "\"attention_bias\": false,\n  \"mlp_bias\": false");
    if (llama) /* (LLaMA's, Mistral's, Qwen2's or Qwen3's class: the layers differ by a window, the q, k, v biases or the q and k norms) */
        fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n"
                "  \"intermediate_size\": %lld,\n  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n"
                "  \"head_dim\": %d,\n  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %s,\n  \"rope_theta\": %s,\n  \"rope_scaling\": %s,\n"
                "  \"hidden_act\": \"silu\",\n  %s,\n  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\"\n}\n",
                c->qk_norm ? "Qwen3ForCausalLM" : c->qkv_bias ? "Qwen2ForCausalLM" : window ? "MistralForCausalLM" : "LlamaForCausalLM",
                c->qk_norm ? "qwen3" : c->qkv_bias ? "qwen2" : window ? "mistral" : "llama",
                c->vocab, c->width, (long long)gpt_ffn(c), c->layers, c->heads, gpt_kv_heads(c), gpt_head_dim(c), c->ctx, eps, theta, scaling,
                layers, c->untied_head ? "false" : "true", gpt_hf_torch_dtype(dtype));
    else
        fprintf(f, "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n  \"vocab_size\": %d,\n  \"n_positions\": %d,\n"
                "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": %lld,\n  \"activation_function\": \"gelu_new\",\n"
                "  \"layer_norm_epsilon\": %s,\n  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": \"%s\"\n}\n",
                c->vocab, c->ctx, c->width, c->layers, c->heads, (long long)gpt_ffn(c), eps, c->untied_head ? "false" : "true", gpt_hf_torch_dtype(dtype));
    pdde_status st = fclose(f) || rename(tmp, path) ? pdde_error(ctx, PDDE_ERR_IO, "%s: %s", path, strerror(errno)) : PDDE_OK;
    int n = gpt_hf_tensors(c, llama ? "model." : "transformer.", NULL);
    gpt_hf_tensor *t = malloc((size_t)n * sizeof *t);
    if (!st && !t) st = PDDE_ERR_OOM;
    if (!st) gpt_hf_tensors(c, llama ? "model." : "transformer.", t), st = gpt_hf_write(s, g, c, t, n, dir, "model.safetensors", dtype);
    free(t);
    return st;
}

/* Writes the LoRA adapters of model c (lora_rank > 0) from session s into directory dir as PEFT saves
 * them: adapter_config.json (r, lora_alpha, the target modules, base_model) and adapter_model.safetensors
 * (of dtype). LLaMA's q, k and v, which share one adapter pair on gpt.h's fused weight, get each its own
 * lora_B (its columns of the fused one) and the same lora_A: together the same update. */
static inline pdde_status gpt_hf_save_peft(pdde_session *s, pdde_graph *g, const gpt_config *c, const char *base_model, const char *dir,
                                           st_dtype dtype) {
    pdde_context *ctx = pdde_graph_context(g);
    int llama = c->arch == GPT_ARCH_LLAMA;
    char name[64], path[4200], tmp[4210], alpha[32];
    if (c->lora_rank <= 0) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: the model has no LoRA adapters (--lora-rank)", dir);
    if (gpt_partial(s, g, name, sizeof name))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s: this rank holds a part of parameter %s, or none: save from a rank that holds every "
                          "parameter whole", dir, name);
    if (mkdir(dir, 0755) && errno != EEXIST) return pdde_error(ctx, PDDE_ERR_IO, "%s: %s", dir, strerror(errno));
    snprintf(path, sizeof path, "%s/adapter_config.json", dir), snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return pdde_error(ctx, PDDE_ERR_IO, "%s: %s", tmp, strerror(errno));
    gpt_hf_float(alpha, gpt_lora_alpha(c));
    fputs("{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": \"", f);
    for (const char *p = base_model ? base_model : ""; *p; p++) fprintf(f, *p == '"' || *p == '\\' ? "\\%c" : (unsigned char)*p < 32 ? "\\u%04x" : "%c", *p);
    fprintf(f, "\",\n  \"r\": %d,\n  \"lora_alpha\": %s,\n  \"lora_dropout\": 0.0,\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": %s,\n"
            "  \"target_modules\": %s,\n  \"use_rslora\": false,\n  \"inference_mode\": true\n}\n", c->lora_rank, alpha, llama ? "false" : "true",
            llama ? "[\"q_proj\", \"k_proj\", \"v_proj\", \"o_proj\", \"gate_proj\", \"up_proj\", \"down_proj\"]" : "[\"c_attn\", \"c_proj\", \"c_fc\"]");
    pdde_status st = fclose(f) || rename(tmp, path) ? pdde_error(ctx, PDDE_ERR_IO, "%s: %s", path, strerror(errno)) : PDDE_OK;
    int n = st ? 0 : gpt_hf_adapters(c, NULL);
    gpt_hf_tensor *t = n > 0 ? malloc((size_t)n * sizeof *t) : NULL;
    if (!st && (!t || gpt_hf_adapters(c, t) != n)) st = PDDE_ERR_OOM;
    if (!st) st = gpt_hf_write(s, g, c, t, n, dir, "adapter_model.safetensors", dtype);
    free(t);
    return st;
}

#endif
