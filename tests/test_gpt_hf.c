/* test_gpt_hf — Hugging Face's model directories (examples/gpt_hf.h, safetensors.h, json_scan.h) against
 * PyTorch. tools/gen_hf_golden.py wrote tests/data/hf_gpt2 (GPT2LMHeadModel, F32, the hub's names and
 * mask buffers), tests/data/hf_llama (LlamaForCausalLM: grouped-query attention, theta 500000, eps
 * 1e-6, untied head, BF16 in two shards) and tests/data/hf_llama3 (LLaMA 3.1's rope_scaling, one kv
 * head, tied, F16), and PyTorch's logits and loss on each, computed the way Hugging Face's modeling
 * code does. Here: the config read into gpt.h's model, the weights loaded, the logits and
 * loss compared; the model saved and loaded again, bit for bit; bad JSON, bad files and models gpt.h
 * cannot compute refused naming the field. And tokenizer.json (examples/hf_tokenizer.h): text to ids
 * against transformers.js, ids to text, the tokenizers it cannot compute refused. */
#define _GNU_SOURCE /* (memmem) */
#include "tests/test_util.h"
#include "examples/gpt_hf.h"
#include "examples/hf_tokenizer.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double logits_tol = 2e-6, loss_tol = 1.5e-6; /* as test_gpt_golden's: f32 reassociation */

typedef struct {
    int B, T, V;
    int32_t *ids, *targets;
    float loss, *logits;
} hf_ref;

static int read_ref(FILE *f, hf_ref *r) {
    int32_t d[3];
    if (fread(d, 4, 3, f) != 3 || d[0] < 1 || d[1] < 1 || d[2] < 1 || d[0] * d[1] > 1 << 16 || d[2] > 1 << 16) return -1;
    r->B = d[0], r->T = d[1], r->V = d[2];
    size_t BT = (size_t)r->B * r->T;
    r->ids = malloc(BT * 4), r->targets = malloc(BT * 4), r->logits = malloc(BT * r->V * 4);
    return fread(r->ids, 4, BT, f) == BT && fread(r->targets, 4, BT, f) == BT && fread(&r->loss, 4, 1, f) == 1 &&
                   fread(r->logits, 4, BT * r->V, f) == BT * r->V ? 0 : -1;
}

/* A session of the model in dir (its config, context T, batch B) with its weights and the batch */
static pdde_status hf_session(pdde_context *ctx, const char *dir, const hf_ref *r, gpt_config *cfg, pdde_graph **g, gpt_model *m, pdde_session **s) {
    char why[400];
    int max_ctx = 0;
    *cfg = (gpt_config){.ctx = r->T, .batch = r->B};
    if (gpt_hf_config(dir, cfg, &max_ctx, why, sizeof why)) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "%s", why);
    pdde_status st = pdde_graph_init(ctx, g);
    if (!st) st = gpt_build(*g, cfg, m);
    if (!st) pdde_mark_output(m->logits), st = pdde_session_init(*g, NULL, s);
    if (!st) st = gpt_hf_load(*s, *g, cfg, dir);
    if (!st) st = pdde_session_write(*s, m->ids, r->ids, (size_t)r->B * r->T * 4);
    if (!st) st = pdde_session_write(*s, m->targets, r->targets, (size_t)r->B * r->T * 4);
    return st;
}

static void check_model(pdde_context *ctx, const char *dir, const hf_ref *r, const char *what) {
    pdde_graph *g = NULL;
    pdde_session *s = NULL;
    gpt_model m = {0};
    gpt_config cfg;
    size_t n = (size_t)r->B * r->T * r->V;
    float *logits = malloc(n * 4), *again = malloc(n * 4);
    pdde_status st = hf_session(ctx, dir, r, &cfg, &g, &m, &s);
    CHECK(!st, "%s: %s", dir, pdde_last_error(ctx));
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s, m.logits, logits, n * 4);
    CHECK(!st, "%s: forward: %s", dir, pdde_last_error(ctx));
    if (st) goto done;
    float loss = pdde_session_loss(s), largest = 0;
    for (size_t i = 0; i < n; i++) largest = fabsf(r->logits[i]) > largest ? fabsf(r->logits[i]) : largest;
    double e = test_close_all(what, &loss, &r->loss, 1, 0, loss_tol);
    double el = test_close_all(what, logits, r->logits, n, largest, logits_tol); /* (relative to the largest logit) */
    printf("%s: loss %.6f, PyTorch's %.6f (rel err %.2g); logits rel err %.2g\n", what, loss, r->loss, e, el);

    /* saved as Hugging Face's directory and read again: the same logits, bit for bit */
    char out[64];
    snprintf(out, sizeof out, "build/test_gpt_hf_%s", cfg.arch == GPT_ARCH_LLAMA ? "llama" : "gpt2");
    st = gpt_hf_save(s, g, &cfg, out, ST_F32);
    CHECK(!st, "save %s: %s", out, pdde_last_error(ctx));
    pdde_session_free(s), pdde_graph_free(g), s = NULL, g = NULL;
    gpt_config back;
    st = hf_session(ctx, out, r, &back, &g, &m, &s);
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s, m.logits, again, n * 4);
    CHECK(!st && !memcmp(logits, again, n * 4), "%s: the saved directory read back gives other logits (%s)", what, st ? pdde_last_error(ctx) : "");
    CHECK(!st && back.arch == cfg.arch && back.layers == cfg.layers && back.heads == cfg.heads && gpt_kv_heads(&back) == gpt_kv_heads(&cfg) &&
              gpt_ffn(&back) == gpt_ffn(&cfg) && back.norm_eps == cfg.norm_eps && gpt_rope_base(&back) == gpt_rope_base(&cfg) &&
              back.untied_head == cfg.untied_head && back.vocab == cfg.vocab && gpt_head_dim(&back) == gpt_head_dim(&cfg) &&
              back.qkv_bias == cfg.qkv_bias && back.qk_norm == cfg.qk_norm,
          "%s: the saved config.json describes the model (arch, layers, heads, kv heads, ffn, eps, rope base, untied head, vocab, head dim, "
          "qkv bias, q/k norms)", what);
done:
    pdde_session_free(s), pdde_graph_free(g);
    free(logits), free(again);
}

/* The config of tests/data/hf_llama with the JSON text `from` replaced by `to` (in build/test_gpt_hf_cfg):
 * refused saying `says` (NULL: whether it is refused); the model read in config_read */
static gpt_config config_read;
static int config_refused(const char *from, const char *to, const char *says) {
    char text[4096], why[400] = "", *at;
    FILE *f = fopen("tests/data/hf_llama/config.json", "rb");
    size_t n = f ? fread(text, 1, sizeof text - 1, f) : 0;
    if (f) fclose(f);
    text[n] = 0;
    CHECK((at = strstr(text, from)) != NULL, "config.json holds '%s'", from);
    if (!at) return 0;
    mkdir("build/test_gpt_hf_cfg", 0755);
    f = fopen("build/test_gpt_hf_cfg/config.json", "wb");
    if (!f) return 0;
    fprintf(f, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    fclose(f);
    gpt_config c = {.ctx = 16, .batch = 1};
    int max_ctx, refused = gpt_hf_config("build/test_gpt_hf_cfg", &c, &max_ctx, why, sizeof why) != 0;
    config_read = c;
    if (says) CHECK(refused && strstr(why, says), "config.json with %s refused saying '%s': %s", to, says, refused ? why : "accepted");
    return refused;
}

typedef struct { int n; char seen[8][64]; } scan_log;
static int log_value(void *user, const json_value *v) {
    scan_log *l = user;
    if (l->n < 8)
        snprintf(l->seen[l->n++], 64, "%s%s%s[%ld]=%s%g", v->key[0] ? v->key[0] : "-", v->depth > 1 ? "." : "", v->depth > 1 && v->key[1] ? v->key[1] : "",
                 v->depth > 1 ? v->index[1] : v->index[0], v->type == JSON_STRING ? v->string : "", v->type == JSON_NUMBER ? v->number : -1);
    return 0;
}

static void check_json(void) {
    scan_log l = {0};
    char why[200];
    const char *doc = "{\"a\\u00e9\\n\": [1, -2.5e1, \"x\\\"\"], \"b\": {\"c\": true, \"d\": null}}";
    CHECK(!json_scan(doc, strlen(doc), log_value, &l, why, sizeof why) && l.n == 5 && !strcmp(l.seen[0], "a\xc3\xa9\n.[0]=1") &&
              !strcmp(l.seen[1], "a\xc3\xa9\n.[1]=-25") && !strcmp(l.seen[2], "a\xc3\xa9\n.[2]=x\"-1") && !strcmp(l.seen[3], "b.c[0]=-1"),
          "json_scan walks keys, array positions, escapes and numbers (%d values: %s | %s | %s | %s) %s", l.n, l.seen[0], l.seen[1], l.seen[2],
          l.seen[3], why);
    static const struct { const char *doc, *says; } bad[] = {
        {"{\"a\": 1,}", "byte 8: a member name expected"}, {"{\"a\" 1}", "':' expected"}, {"[1 2]", "',' or ']' expected"},
        {"{\"a\": 01}", "byte 7: ',' or '}' expected"}, {"\"abc", "without its closing quote"}, {"[1] x", "text after the document"},
        {"{\"a\": \"\\ud800\"}", "unpaired surrogate"}, {"[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]", "nested too deep"}, {"", "ended where a value"},
        {"[-]", "a value expected"}, {"[1.e5]", "a digit expected after '.'"}, {"{\"a\": tru}", "a value expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        l.n = 0;
        int refused = json_scan(bad[i].doc, strlen(bad[i].doc), log_value, &l, why, sizeof why) != 0;
        CHECK(refused && strstr(why, bad[i].says), "JSON '%s' refused saying '%s': %s", bad[i].doc, bad[i].says, refused ? why : "accepted");
    }
}

/* A safetensors file of one header text and `data` bytes of zeros */
static int st_refused(const char *header, long data, const char *says) {
    const char *path = "build/test_gpt_hf_bad.safetensors";
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, f), fwrite(header, 1, n, f);
    for (long i = 0; i < data; i++) fputc(0, f);
    fclose(f);
    st_model m;
    char why[400] = "";
    int refused = st_open(path, &m, why, sizeof why) != 0;
    if (!refused) {
        float buf[64];
        refused = m.n > 0 && st_read_f32(&m, &m.t[0], buf, why, sizeof why) != 0;
        st_close(&m);
    }
    CHECK(refused && strstr(why, says), "safetensors header %s refused saying '%s': %s", header, says, refused ? why : "accepted");
    return refused;
}

static void check_safetensors(void) {
    st_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}", 24, "JSON syntax at byte 56: ',' or '}' expected");
    st_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 20, "data_offsets [0, 24] outside the file's 20 bytes");
    st_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 24, "tensor w: 20 bytes for 6 values of F32");
    st_refused("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24, "24 bytes for 6 values of BF16");
    st_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3]}}", 24, "tensor w lacks its data_offsets");
    st_refused("{\"w\":{\"dtype\":\"I64\",\"shape\":[3],\"data_offsets\":[0,24]}}", 24, "tensor w is I64: F32, BF16 or F16 expected");
    st_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
               "tensor w: named twice");
    st_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "tensor w: field shape");
    st_refused("{\"w\":[1,2]}", 8, "an object of dtype, shape and data_offsets expected");
    st_refused("[1]", 8, "the header is not a JSON object");
    st_refused("{\"w\":{\"dtype\":\"F32\",\"shape\":[4503599627370496,4503599627370496,2],\"data_offsets\":[0,8]}}", 8,
               "tensor w: 8 bytes for 1152921504606846976 values of F32"); /* (2^52 x 2^52 x 2: counted as 2^60, no overflow) */
    /* a header length past the file */
    FILE *f = fopen("build/test_gpt_hf_bad.safetensors", "wb");
    uint64_t huge = 1 << 20;
    if (f) fwrite(&huge, 8, 1, f), fwrite("{}", 1, 2, f), fclose(f);
    st_model m;
    char why[400] = "";
    CHECK(st_open("build/test_gpt_hf_bad.safetensors", &m, why, sizeof why) && strstr(why, "header length 1048576: not a safetensors file"),
          "a header length past the file refused: %s", why);
    CHECK(st_open("tests/data", &m, why, sizeof why) && strstr(why, "neither model.safetensors nor model.safetensors.index.json"),
          "a directory without weights refused: %s", why);
    /* F16 values widened */
    const char *h16 = "{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
    uint16_t v16[2] = {0x3c00, 0xc100}; /* 1, -2.5 */
    uint64_t n = strlen(h16);
    f = fopen("build/test_gpt_hf_f16.safetensors", "wb");
    if (f) fwrite(&n, 8, 1, f), fwrite(h16, 1, n, f), fwrite(v16, 2, 2, f), fclose(f);
    float got[2] = {0};
    int ok = !st_open("build/test_gpt_hf_f16.safetensors", &m, why, sizeof why) && !st_read_f32(&m, st_find(&m, "w"), got, why, sizeof why);
    if (ok) st_close(&m);
    CHECK(ok && got[0] == 1.0f && got[1] == -2.5f, "F16 values read: %g %g %s", got[0], got[1], ok ? "" : why);
}

/* LoRA on hf_llama (examples/gpt.h): with B = 0 the logits are the plain model's bit for bit; a step
 * of AdamW moves the adapters and leaves every pretrained weight as loaded; gpt_read_weight gives W +
 * A B alpha / r, as computed here in double; the session trains only the adapters' bytes */
static void check_lora(pdde_context *ctx, const hf_ref *r) {
    gpt_config plain, lora;
    pdde_graph *g = NULL, *lg = NULL;
    pdde_session *s = NULL, *ls = NULL;
    gpt_model m, lm;
    size_t n = (size_t)r->B * r->T * r->V;
    float *logits = malloc(n * 4), *llogits = malloc(n * 4);
    pdde_status st = hf_session(ctx, "tests/data/hf_llama", r, &plain, &g, &m, &s);
    if (!st) st = pdde_session_run(s, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(s, m.logits, logits, n * 4);
    CHECK(!st, "plain hf_llama: %s", pdde_last_error(ctx));
    char why[400];
    int max_ctx;
    lora = (gpt_config){.ctx = r->T, .batch = r->B, .lora_rank = 3, .lora_alpha = 6};
    if (!st && gpt_hf_config("tests/data/hf_llama", &lora, &max_ctx, why, sizeof why)) st = PDDE_ERR_INVALID_ARG;
    lora.lora_rank = 3, lora.lora_alpha = 6;
    pdde_optimizer_params op = {.lr = 1e-2f};
    pdde_memory_stats ms = {0};
    if (!st) st = pdde_graph_init(ctx, &lg);
    if (!st) st = gpt_build(lg, &lora, &lm);
    if (!st) pdde_mark_output(lm.logits), st = pdde_backward(lg, lm.loss);
    if (!st) st = pdde_optimizer_adamw(lg, &op);
    if (!st) st = pdde_session_init(lg, NULL, &ls);
    if (!st) st = gpt_hf_load(ls, lg, &lora, "tests/data/hf_llama");
    if (!st) st = pdde_session_write(ls, lm.ids, r->ids, (size_t)r->B * r->T * 4);
    if (!st) st = pdde_session_write(ls, lm.targets, r->targets, (size_t)r->B * r->T * 4);
    if (!st) st = pdde_session_run(ls, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(ls, lm.logits, llogits, n * 4);
    CHECK(!st && !memcmp(logits, llogits, n * 4), "LoRA with B = 0 gives the plain model's logits bit for bit (%s)", st ? pdde_last_error(ctx) : "");
    if (!st) pdde_session_memory(ls, &ms);
    CHECK(!st && ms.param_bytes == (size_t)gpt_n_lora_params(&lora) * 4 && ms.grad_bytes == ms.param_bytes,
          "LoRA trains its adapters only: %zu bytes of parameters, %zu of gradients, gpt_n_lora_params %lld", ms.param_bytes, ms.grad_bytes,
          (long long)gpt_n_lora_params(&lora));
    pdde_tensor *w = pdde_graph_find(lg, "h1.fc3.w"), *a = pdde_graph_find(lg, "h1.fc3.lora_a"), *b = pdde_graph_find(lg, "h1.fc3.lora_b");
    int64_t in = 32, rank = 3, out = gpt_ffn(&lora), nw = in * out;
    float *before = malloc((size_t)nw * 4), *after = malloc((size_t)nw * 4), *merged = malloc((size_t)nw * 4);
    float *av = malloc((size_t)(in * rank) * 4), *bv = malloc((size_t)(rank * out) * 4);
    if (!st && w && a && b) st = pdde_session_read(ls, w, before, (size_t)nw * 4);
    for (int step = 0; step < 3 && !st; step++) st = pdde_session_run(ls, PDDE_RUN_STEP);
    float loss0 = pdde_session_loss(ls);
    if (!st) st = pdde_session_run(ls, PDDE_RUN_FORWARD);
    if (!st) st = pdde_session_read(ls, w, after, (size_t)nw * 4);
    if (!st) st = pdde_session_read(ls, a, av, (size_t)(in * rank) * 4);
    if (!st) st = pdde_session_read(ls, b, bv, (size_t)(rank * out) * 4);
    if (!st) st = gpt_read_weight(ls, lg, &lora, w, merged);
    int bmoved = 0;
    for (int64_t i = 0; i < rank * out; i++) bmoved |= bv[i] != 0;
    CHECK(!st && w && a && b && !memcmp(before, after, (size_t)nw * 4) && bmoved && pdde_session_loss(ls) < loss0,
          "3 AdamW steps move the adapters (loss %g then %g) and leave h1.fc3.w as loaded (%s)", loss0, pdde_session_loss(ls),
          st ? pdde_last_error(ctx) : "");
    double worst = 0;
    for (int64_t i = 0; !st && i < in; i++)
        for (int64_t j = 0; j < out; j++) {
            double want = before[i * out + j];
            for (int64_t k = 0; k < rank; k++) want += (double)av[i * rank + k] * bv[k * out + j] * 2.0; /* (alpha 6 / r 3) */
            double e = fabs(merged[i * out + j] - want);
            worst = e > worst ? e : worst;
        }
    CHECK(!st && worst < 1e-6, "gpt_read_weight gives W + A B alpha / r: worst difference %g", worst);
    pdde_session_free(s), pdde_graph_free(g), pdde_session_free(ls), pdde_graph_free(lg);
    free(logits), free(llogits), free(before), free(after), free(merged), free(av), free(bv);
}

/* tokenizer.json's tokens as bytes: byte-level BPE (hf_gpt2's) and SentencePiece's (hf_llama's) */
static void check_vocab(void) {
    static const struct { const char *path; int n, ids[5]; const char *text; } cases[] = {
        {"tests/data/hf_gpt2/tokenizer.json", 301, {256, 257, 258, 259, 300}, " the cat caf\xc3\xa9\n\n<|endoftext|>"},
        {"tests/data/hf_llama/tokenizer.json", 256, {99, 100, 101, 3, 2}, " the cat caf\xc3\xa9\n</s>"},
    };
    for (int c = 0; c < 2; c++) {
        hf_tokenizer *t = NULL;
        char why[200] = "", text[256] = "";
        int rc = hf_tokenizer_open(cases[c].path, &t, why, sizeof why);
        for (int i = 0; !rc && i < 5 && cases[c].ids[i] < t->n && t->bytes[cases[c].ids[i]]; i++) strcat(text, t->bytes[cases[c].ids[i]]);
        CHECK(!rc && t->n == cases[c].n && !strcmp(text, cases[c].text), "%s: %d tokens (want %d), ids decode to '%s' (want '%s') %s", cases[c].path,
              t ? t->n : 0, cases[c].n, text, cases[c].text, why);
        hf_tokenizer_close(t);
    }
}

/* Text to ids against transformers.js (tests/data/tokenize/golden.txt, tools/gen_tokenizer_golden.mjs):
 * six tokenizers in the layouts of GPT-2, LLaMA 3.1, Qwen2 (NFC), SmolLM2, LLaMA 2 and its Metaspace conversion,
 * on a text of every kind of character their patterns tell apart, with and without the start token */
static void check_encode(void) {
    FILE *g = fopen("tests/data/tokenize/golden.txt", "r");
    char line[200000], name[64], path[128];
    int lines = 0;
    CHECK(g != NULL, "tests/data/tokenize/golden.txt: run from the repository root");
    while (g && fgets(line, sizeof line, g)) {
        int start, want, at = 0, used;
        if (sscanf(line, "%63s %d %d%n", name, &start, &want, &at) != 3) continue;
        char *colon = strchr(name, ':');
        if (colon) *colon = 0;
        snprintf(path, sizeof path, "tests/data/tokenize/%s.json", name);
        hf_tokenizer *t = NULL;
        char why[300] = "";
        size_t length = 0, n = 0, first_wrong = 0;
        char *text = NULL;
        int32_t *ids = NULL;
        snprintf(why, sizeof why, "tests/data/tokenize/%s.txt", colon ? colon + 1 : "text");
        FILE *f = fopen(why, "rb");
        if (f && (text = malloc(1 << 20))) length = fread(text, 1, 1 << 20, f);
        if (f) fclose(f);
        int rc = !text || hf_tokenizer_open(path, &t, why, sizeof why) || hf_tokenizer_encode(t, text, length, start, &ids, &n);
        for (const char *p = line + at; !rc && first_wrong < n && sscanf(p, "%d%n", &want, &used) == 1; p += used, first_wrong++)
            if (ids[first_wrong] != want) break;
        sscanf(line, "%*s %*d %d", &want);
        CHECK(!rc && (int)n == want && first_wrong == n, "%s (%s, start token %d): %zu ids, transformers.js %d; the first different: id %zu %s", path,
              colon ? colon + 1 : "text", start, n, want, first_wrong, rc ? why : "");
        lines++;
        free(text), free(ids), hf_tokenizer_close(t);
    }
    if (g) fclose(g);
    CHECK(lines >= 24, "golden.txt: %d cases (6 tokenizers, 2 texts, with and without the start token)", lines);
}

/* tokenizer.json files pdde cannot encode with, refused naming the field */
static void check_tokenizer_refusals(void) {
    static const struct { const char *json, *says; } cases[] = {
        {"{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"<unk>\", 0.0], [\"a\", -1.5]]}}", "a Unigram model"},
        {"{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}", "model.type is 'WordPiece': BPE expected"},
        {"{\"normalizer\": {\"type\": \"NFKC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", "normalizer: a step of another type (NFKC)"},
        {"{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\d+\"}, \"behavior\": \"Isolated\"}, \"model\": {\"type\": "
         "\"BPE\", \"vocab\": {\"a\": 0}}}", "pre_tokenizer: a Split by another pattern"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}", "model.merges[0]: 'a' + 'b': the merged token is not in"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"ab\"]}}", "'left right') expected"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"continuing_subword_prefix\": \"##\"}}", "model.continuing_subword_prefix is set"},
        {"{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\"}}]}, \"model\": {\"type\": "
         "\"BPE\", \"vocab\": {\"a\": 0}}}", "post_processor: its template's special token '<s>' is not"},
        {"{\"model\": {\"type\": \"BPE\", \"vocab\": {}}}", "no model.vocab"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        FILE *f = fopen("build/test_gpt_hf_tokenizer.json", "w");
        if (f) fputs(cases[c].json, f), fclose(f);
        hf_tokenizer *t = NULL;
        char why[300] = "";
        int rc = hf_tokenizer_open("build/test_gpt_hf_tokenizer.json", &t, why, sizeof why);
        CHECK(rc && !t && strstr(why, cases[c].says), "tokenizer %zu refused saying '%s': %s", c, cases[c].says, rc ? why : "taken");
        hf_tokenizer_close(t);
    }
    hf_tokenizer *t = NULL;
    char why[300] = "";
    CHECK(hf_tokenizer_open("tests/data/hf_llama/config.json", &t, why, sizeof why) && strstr(why, "no model.vocab") && !t,
          "a config.json as tokenizer refused: %s", why);
}

/* Added tokens that take the white space before them (lstrip), after them (rstrip) or both (its flags read
 * before its id), put in GPT-2's and LLaMA 2's fixtures: the ids of transformers.js (4.3.2,
 * encode(text, {add_special_tokens: false})) for texts with tabs, line breaks, no-break, em and
 * ideographic spaces and a line separator around them, tokens side by side, at the start and at the end */
static void check_added_token_strip(void) {
    static const char list[] = "\"added_tokens\": [\n", added[] =
        "    {\"id\":60000,\"content\":\"<mask>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":false,\"normalized\":false,\"special\":true},\n"
        "    {\"id\":60001,\"content\":\"<|end|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":true,\"normalized\":false,\"special\":true},\n"
        "    {\"rstrip\":true,\"lstrip\":true,\"id\":60002,\"content\":\"<both>\",\"single_word\":false,\"normalized\":false,\"special\":true},\n";
    static const char *texts[3] = {"a <mask>b\t \n<mask> c<|end|>  \u00a0d<|end|>\n\ne <both>  f<mask><|end|> <both>\u3000<mask>",
                                   "  <mask> x <|end|>", "<|end|> \u2003 y\u2028<mask>z <both>"};
    static const struct { const char *path; int n[3]; int32_t ids[3][16]; } cases[] = {
        {"tests/data/tokenize/gpt2.json", {15, 5, 5},
         {{64, 60000, 65, 60000, 269, 60001, 67, 60001, 68, 60002, 69, 60000, 60001, 60002, 60000}, {60000, 220, 87, 220, 60001}, {60001, 88, 60000, 89, 60002}}},
        {"tests/data/tokenize/llama2.json", {16, 6, 5},
         {{264, 60000, 287, 60000, 28705, 277, 60001, 281, 60001, 317, 60002, 285, 60000, 60001, 60002, 60000},
          {60000, 28705, 28705, 28744, 28705, 60001}, {60001, 337, 60000, 686, 60002}}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char why[300] = "", *json = NULL, *at = NULL;
        size_t length = 0;
        if (!json_read_file(cases[c].path, 1 << 20, &json, &length, why, sizeof why) && (at = strstr(json, list))) at += strlen(list);
        FILE *f = at ? fopen("build/test_gpt_hf_strip.json", "w") : NULL;
        if (f) fwrite(json, 1, (size_t)(at - json), f), fputs(added, f), fputs(at, f), fclose(f);
        hf_tokenizer *t = NULL;
        CHECK(f && !hf_tokenizer_open("build/test_gpt_hf_strip.json", &t, why, sizeof why), "%s with stripping added tokens: %s", cases[c].path, why);
        for (int k = 0; t && k < 3; k++) {
            int32_t *ids = NULL;
            size_t n = 0;
            int same = !hf_tokenizer_encode(t, texts[k], strlen(texts[k]), 0, &ids, &n) && n == (size_t)cases[c].n[k] &&
                       !memcmp(ids, cases[c].ids[k], n * sizeof *ids);
            CHECK(same, "%s with stripping added tokens, text %d: %zu ids (transformers.js %d), the second %d", cases[c].path, k, n, cases[c].n[k],
                  n > 1 ? ids[1] : -1);
            free(ids);
        }
        hf_tokenizer_close(t), free(json);
    }
}

/* The hf_gpt2 weights with one tensor renamed or a stranger added: refused by gpt_hf_load naming it */
static void check_load_refusals(pdde_context *ctx, const hf_ref *r) {
    static const struct { const char *from, *to, *says; } cases[] = {
        {"\"h.1.mlp.c_fc.bias\"", "\"h.1.mlp.c_fc.biaz\"", "no tensor h.1.mlp.c_fc.bias (the model's h1.fc.b)"},
        {"\"h.1.attn.bias\"", "\"h.1.attn.biaz\"", "tensor h.1.attn.biaz has no place in gpt's gpt model (2 layers)"},
        {"\"shape\": [32, 32]", "\"shape\": [16, 64]", "tensor wpe.weight is [16, 64], the model's wpe needs [16, 32]"},
    };
    char *text = NULL;
    FILE *f = fopen("tests/data/hf_gpt2/model.safetensors", "rb");
    long size = f && !fseek(f, 0, SEEK_END) ? ftell(f) : -1;
    if (size > 0 && (text = malloc((size_t)size)) && (fseek(f, 0, SEEK_SET) || fread(text, 1, (size_t)size, f) != (size_t)size)) size = -1;
    if (f) fclose(f);
    CHECK(size > 0, "read tests/data/hf_gpt2/model.safetensors");
    mkdir("build/test_gpt_hf_bad", 0755);
    for (size_t i = 0; i < sizeof cases / sizeof *cases && size > 0; i++) {
        char *at = memmem(text, 8 + 4096, cases[i].from, strlen(cases[i].from));
        CHECK(at != NULL, "the fixture names %s", cases[i].from);
        if (!at) continue;
        char *copy = malloc((size_t)size);
        memcpy(copy, text, (size_t)size), memcpy(copy + (at - text), cases[i].to, strlen(cases[i].to)); /* (same length) */
        FILE *o = fopen("build/test_gpt_hf_bad/model.safetensors", "wb");
        if (o) fwrite(copy, 1, (size_t)size, o), fclose(o);
        free(copy);
        system("cp tests/data/hf_gpt2/config.json build/test_gpt_hf_bad/");
        gpt_config cfg;
        pdde_graph *g = NULL;
        pdde_session *s = NULL;
        gpt_model m;
        pdde_status st = hf_session(ctx, "build/test_gpt_hf_bad", r, &cfg, &g, &m, &s);
        CHECK(st && strstr(pdde_last_error(ctx), cases[i].says), "a file with %s refused saying '%s': %s", cases[i].to, cases[i].says,
              st ? pdde_last_error(ctx) : "loaded");
        pdde_session_free(s), pdde_graph_free(g);
    }
    free(text);
}

int main(void) {
    FILE *f = fopen("tests/data/hf_ref.bin", "rb");
    char magic[8] = "";
    hf_ref ref[5] = {{0}};
    int ok = f && fread(magic, 8, 1, f) == 1 && !memcmp(magic, "HFREF001", 8);
    for (int i = 0; i < 5 && ok; i++) ok = !read_ref(f, &ref[i]);
    if (f) fclose(f);
    CHECK(ok, "fixture tests/data/hf_ref.bin: missing or cut");
    pdde_context *ctx;
    CHECK(pdde_context_init(NULL, &ctx) == PDDE_OK, "context");
    if (ok) {
        check_model(ctx, "tests/data/hf_gpt2", &ref[0], "GPT-2 (F32, the hub's names)");
        check_model(ctx, "tests/data/hf_llama", &ref[1], "LLaMA (GQA, BF16 shards, untied)");
        check_model(ctx, "tests/data/hf_llama3", &ref[2], "LLaMA 3 (rope_scaling llama3, one kv head, F16, tied)");
        check_model(ctx, "tests/data/hf_qwen2", &ref[3], "Qwen2 (q, k, v biases, GQA, BF16, tied)");
        check_model(ctx, "tests/data/hf_qwen3", &ref[4], "Qwen3 (q, k norms, heads of 16 for width 32, GQA, BF16, untied)");
        check_load_refusals(ctx, &ref[0]);
        check_lora(ctx, &ref[1]);
    }
    gpt_config c = {.ctx = 16, .batch = 1};
    int max_ctx = 0;
    char why[400] = "";
    CHECK(!gpt_hf_config("tests/data/hf_llama", &c, &max_ctx, why, sizeof why) && c.arch == GPT_ARCH_LLAMA && c.kv_heads == 2 && c.ffn == 80 &&
              c.rope_base == 500000.0f && c.norm_eps == 1e-6f && c.untied_head && max_ctx == 128 && c.ctx == 16 && c.rope_scaling[0] == 0,
          "hf_llama's config: llama, 2 kv heads, ffn 80, theta 500000, eps 1e-6, untied, 128 positions, no rope scaling (%s)", why);
    c = (gpt_config){.ctx = 16, .batch = 1};
    CHECK(!gpt_hf_config("tests/data/hf_llama3", &c, &max_ctx, why, sizeof why) && c.kv_heads == 1 && !c.untied_head && c.rope_scaling[0] == 8 &&
              c.rope_scaling[1] == 1 && c.rope_scaling[2] == 4 && c.rope_scaling[3] == 64,
          "hf_llama3's config: one kv head, tied, rope scaling 8, 1, 4, 64 (%s)", why);
    /* Mistral's config (LLaMA's layers) whose window holds the context reads as LLaMA's */
    CHECK(!config_refused("\"model_type\": \"llama\"", "\"model_type\": \"mistral\", \"sliding_window\": 4096", NULL), "Mistral with a window of 4096 read");
    config_refused("\"model_type\": \"llama\"", "\"model_type\": \"gemma\"", "model_type \"gemma\" (LlamaForCausalLM)");
    c = (gpt_config){.ctx = 16, .batch = 1};
    CHECK(!gpt_hf_config("tests/data/hf_qwen2", &c, &max_ctx, why, sizeof why) && c.arch == GPT_ARCH_LLAMA && c.qkv_bias && !c.untied_head &&
              c.kv_heads == 2 && c.rope_base == 1e6f,
          "hf_qwen2's config: llama with a qkv bias, tied, 2 kv heads, theta 1e6; its window of 8 unused (%s)", why);
    /* sliding windows: Mistral's on every layer; Qwen's on the layers from max_window_layers (default 28) on: every layer (0) or
     * none (2 of these 2 layers before it) read, some refused */
    CHECK(!config_refused("\"model_type\": \"llama\"", "\"model_type\": \"mistral\", \"sliding_window\": 8", NULL) && config_read.window == 8,
          "Mistral with a window of 8: window %d", config_read.window);
    CHECK(!config_refused("\"model_type\": \"llama\"", "\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 8, "
                          "\"max_window_layers\": 0", NULL) && config_read.window == 8,
          "Qwen2 windowed from layer 0: window %d", config_read.window);
    CHECK(!config_refused("\"model_type\": \"llama\"", "\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 8", NULL) &&
              config_read.window == 0 && !config_refused("\"model_type\": \"llama\"", "\"model_type\": \"qwen2\", \"sliding_window\": 8, "
                                                         "\"max_window_layers\": 0", NULL) && config_read.window == 0,
          "Qwen2 windowed from layer 28 (its default) of 2, or not using its window: no window (%d)", config_read.window);
    config_refused("\"model_type\": \"llama\"", "\"model_type\": \"qwen2\", \"use_sliding_window\": true, \"sliding_window\": 8, \"max_window_layers\": 1",
                   "max_window_layers 1: the layers before it attend to the whole context, the rest in a window");
    config_refused("\"model_type\": \"llama\"", "\"model_type\": \"mistral\", \"sliding_window\": 8.5", "sliding_window 8.5: an integer >= 1 expected");
    config_refused("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8.0}", "rope_scaling \"yarn\": gpt's RoPE scales as LLaMA 3.1's");
    config_refused("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}",
                   "rope_scaling llama3: factor 8 (>= 1), low_freq_factor -1");
    config_refused("\"attention_bias\": false", "\"attention_bias\": true", "attention_bias true: gpt's LLaMA linears have no biases");
    config_refused("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act \"gelu\"");
    config_refused("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", "num_key_value_heads 3 must divide num_attention_heads 4");
    config_refused("\"hidden_size\": 32", "\"hidden_size\": 32.5", "hidden_size = 32.5: an integer");
    c = (gpt_config){.ctx = 16, .batch = 1};
    CHECK(!gpt_hf_config("tests/data/hf_qwen3", &c, &max_ctx, why, sizeof why) && c.arch == GPT_ARCH_LLAMA && c.qk_norm && !c.qkv_bias && c.untied_head &&
              c.head_dim == 16 && gpt_head_dim(&c) == 16 && c.width == 32 && c.kv_heads == 2,
          "hf_qwen3's config: llama with q/k norms, heads of 16 for width 32 and 4 heads, untied, 2 kv heads (%s)", why);
    /* LLaMA's head_dim: its own width where it says (LlamaConfig's head_dim), width / heads where it repeats that */
    CHECK(!config_refused("\"hidden_size\": 32", "\"head_dim\": 8, \"hidden_size\": 32", NULL), "LLaMA's head_dim 8 = 32 / 4 read");
    c = (gpt_config){.ctx = 16, .batch = 1};
    CHECK(!config_refused("\"hidden_size\": 32", "\"head_dim\": 12, \"hidden_size\": 32", NULL) &&
              !gpt_hf_config("build/test_gpt_hf_cfg", &c, &max_ctx, why, sizeof why) && c.head_dim == 12 && !c.qk_norm,
          "LLaMA's head_dim 12 for width 32 read as heads of 12 (%s)", why);
    config_refused("\"hidden_size\": 32", "\"head_dim\": 7, \"hidden_size\": 32", "and the head dim 7 be even");
    config_refused("\"hidden_size\": 32", "\"head_dim\": 8.5, \"hidden_size\": 32", "a head dim of 8.5 with 4 heads of width 32: an integer");
    /* Qwen3Config's head_dim defaults to 128, not width / heads */
    c = (gpt_config){.ctx = 16, .batch = 1};
    CHECK(!config_refused("\"model_type\": \"llama\"", "\"model_type\": \"qwen3\"", NULL) &&
              !gpt_hf_config("build/test_gpt_hf_cfg", &c, &max_ctx, why, sizeof why) && c.head_dim == 128 && c.qk_norm,
          "a qwen3 config.json without head_dim: heads of 128 (%s)", why);
    config_refused("\"vocab_size\": 256", "\"vocab_size\": \"256\"", "vocab_size: a number expected");
    config_refused("\"intermediate_size\": 80", "\"intermediate_size\": 1e30", "intermediate_size = 1e+30: an integer 1 ..");
    config_refused("\"vocab_size\": 256,", "", "vocab_size = -1: an integer 1 ..");
    check_json();
    check_vocab();
    check_encode();
    check_tokenizer_refusals();
    check_added_token_strip();
    check_safetensors();
    gpt_config untied = {.vocab = 50, .ctx = 8, .layers = 1, .heads = 2, .width = 16, .batch = 1, .untied_head = 1};
    pdde_graph *g = NULL;
    gpt_model m;
    pdde_status st = pdde_graph_init(ctx, &g);
    if (!st) st = gpt_build(g, &untied, &m);
    pdde_tensor *head = pdde_graph_find(g, "head");
    CHECK(!st && head && head->shape[0] == 50 && head->shape[1] == 16 && gpt_n_params(&untied) == 50 * 16 * 2 + 8 * 16 + 16 * 4 + 16 * 48 + 48 + 16 * 16 + 16 + 16 * 64 + 64 + 64 * 16 + 16 + 2 * 16,
          "an untied head is a parameter [V, C] of its own, counted by gpt_n_params (%lld)", (long long)gpt_n_params(&untied));
    pdde_graph_free(g);
    gpt_config moe_lora = untied;
    moe_lora.lora_rank = 2, moe_lora.moe_experts = 4;
    st = pdde_graph_init(ctx, &g);
    if (!st) st = gpt_build(g, &moe_lora, &m);
    CHECK(st && strstr(pdde_last_error(ctx), "no experts (4) with it"), "LoRA with experts refused: %s", pdde_last_error(ctx));
    pdde_graph_free(g);
    for (int k = 0; k < 5; k++) free(ref[k].ids), free(ref[k].targets), free(ref[k].logits);
    pdde_context_free(ctx);
    return test_finish();
}
