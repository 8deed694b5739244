/* hf_tokenizer.h — Demonstrates how to turn text into a model's token ids, and ids back into text, with
 * Hugging Face's tokenizer.json: byte-level BPE (GPT-2, LLaMA 3, SmolLM2, Qwen2) and SentencePiece's BPE
 * with byte fallback (LLaMA 2, TinyLlama, Mistral).
 *
 *   hf_tokenizer_open(path, &t, why, sizeof why)         reads tokenizer.json; -1 with why[] naming the field
 *   hf_tokenizer_encode(t, text, length, 1, &ids, &n)    text -> ids, the template's start token (<s>) first
 *   t->bytes[id]                                          an id's bytes, to print ids as text
 *   hf_tokenizer_write_tokens(t, paths, n, start, end, out, ...)   text files (or JSON Lines) -> a pdde token file
 *   hf_tokenizer_close(t)
 *
 * Encoding follows the `tokenizers` library step by step: added tokens ("<|endoftext|>") are cut out of
 * the text first (the leftmost, then the longest); each piece between them is normalized (NFC, Prepend,
 * Replace), pre-tokenized (ByteLevel, Split by GPT-2's, LLaMA 3's or Qwen2's pattern, Digits, Metaspace) and each
 * word merged by BPE, the pair of lowest rank first. What it does not compute (another model or
 * pattern, NFKC, a WordPiece or Unigram model) is refused when the file is read, naming the field. An
 * added token with lstrip (rstrip) takes the white space before (after) it into its match, as `tokenizers`
 * does (Unicode's White_Space, what its \s matches); single_word is not applied. */
#ifndef PDDE_HF_TOKENIZER_H
#define PDDE_HF_TOKENIZER_H
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_scan.h"
#include "unicode_classes.h"
#include "unicode_nfc.h"

enum { HF_TOK_STEPS = 8 }; /* steps of a Sequence normalizer, pre-tokenizer or post-processor */
enum { HF_ADDED = 1, HF_LSTRIP = 2, HF_RSTRIP = 4 }; /* an id's hf_tokenizer.literal */

/* One normalizer or pre-tokenizer step as the file gives it; a flag the file leaves out is -1 */
typedef struct {
    char type[24];
    char *text, *content; /* Prepend's prepend, Replace's and Split's pattern; Replace's content */
    char *replacement, *scheme, *behavior; /* Metaspace's replacement and prepend_scheme; Split's behavior */
    int regex;            /* the pattern is {"Regex": ...} (not {"String": ...}) */
    int add_prefix_space, use_regex, individual_digits, split, invert;
} hf_step;

typedef struct { uint32_t key_hash; int32_t id; char *key; } hf_vocab_slot;
typedef struct { uint64_t pair; int32_t rank, merged; } hf_merge_slot;

typedef struct {
    int n;        /* ids 0 .. n-1 */
    char **bytes; /* [n]: each id's bytes, NUL-terminated, at most 255; NULL for an id the file lacks */
    int32_t bos;  /* the token the post-processor's template puts before a text (LLaMA's <s>), or -1 */
    /* what encoding needs */
    char **spelled;                      /* [n]: each token as the file spells it (Ġthe, ▁the) */
    char *literal;                       /* [n]: HF_ADDED for an added token (matched in the text as it is),
                                            with HF_LSTRIP, HF_RSTRIP where it takes the white space before, after it */
    int byte_level, byte_fallback, ignore_merges, fuse_unk;
    int32_t unk, byte_ids[256];          /* <unk>; "<0xNN>" for byte fallback (-1: none) */
    hf_step normalizer[HF_TOK_STEPS], pre[HF_TOK_STEPS];
    int n_normalizer, n_pre;
    hf_vocab_slot *vocab;  size_t vocab_cap; /* spelling -> id */
    hf_merge_slot *merges; size_t merges_cap; /* (left id, right id) -> rank, merged id */
    int32_t *added;  int n_added;         /* added tokens, by first byte then longest first */
    int added_first[257];                /* added[added_first[b] ..] start with byte b */
    uint32_t byte_cp[256];               /* ByteLevel's spelling of each byte (GPT-2's bytes_to_unicode) */
} hf_tokenizer;

/* ---- tables: a token's spelling -> id, a pair of ids -> its merge ---- */

static inline uint32_t hf_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The id spelled s[0 .. n), or -1 */
static inline int32_t hf_vocab_find(const hf_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_cap) return -1;
    uint32_t h = hf_hash(s, n);
    for (size_t k = h & (t->vocab_cap - 1);; k = (k + 1) & (t->vocab_cap - 1)) {
        const hf_vocab_slot *e = &t->vocab[k];
        if (!e->key) return -1;
        if (e->key_hash == h && !strncmp(e->key, s, n) && !e->key[n]) return e->id;
    }
}

static inline const hf_merge_slot *hf_merge_find(const hf_tokenizer *t, int32_t a, int32_t b) {
    uint64_t pair = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    if (!t->merges_cap) return NULL;
    for (size_t k = (size_t)((pair * 0x9E3779B97F4A7C15ull) >> 32) & (t->merges_cap - 1);; k = (k + 1) & (t->merges_cap - 1)) {
        if (t->merges[k].rank < 0) return NULL;
        if (t->merges[k].pair == pair) return &t->merges[k];
    }
}

/* ---- reading tokenizer.json ---- */

typedef struct {
    hf_tokenizer *t;
    char *model_type, *unk_name, *bos_name, *other_model_field, *added_content;
    long added_at;
    int32_t added_id, added_set; /* (of added_tokens[added_at]; added_set: the id it was given, once it was) */
    int added_strip;             /* (its HF_LSTRIP, HF_RSTRIP, read so far) */
    char **merge_text; /* [n_merges][2]: each merge's left and right as the file spells them */
    long n_merges, merges_cap;
    int vocab_array, bad_step;
} hf_tokenizer_walk;

static inline int hf_set_token(hf_tokenizer *t, double id, const char *spelled, int literal) {
    if (!(id >= 0 && id < 1 << 24 && id == (int)id)) return 1;
    if ((int)id >= t->n) {
        int n = (int)id + 1 > 2 * t->n ? (int)id + 1 : 2 * t->n;
        char **sp = realloc(t->spelled, (size_t)n * sizeof *sp), *lit = sp ? realloc(t->literal, (size_t)n) : NULL;
        if (sp) t->spelled = sp;
        if (!sp || !lit) return 1;
        t->literal = lit;
        for (int i = t->n; i < n; i++) t->spelled[i] = NULL, t->literal[i] = 0;
        t->n = n;
    }
    if (t->literal[(int)id] && !literal) return 0; /* (model.vocab's entry of an added token read before) */
    free(t->spelled[(int)id]);
    t->spelled[(int)id] = json_strdup(spelled), t->literal[(int)id] = (char)literal;
    return !t->spelled[(int)id];
}

static inline int hf_keep(char **to, const char *s) { return free(*to), !(*to = json_strdup(s)); }

static inline int hf_merge_add(hf_tokenizer_walk *w, long rank, int part, const char *s) {
    if (rank >= w->merges_cap) {
        long cap = rank + 1 > 2 * w->merges_cap ? rank + 1 : 2 * w->merges_cap;
        char **m = realloc(w->merge_text, (size_t)cap * 2 * sizeof *m);
        if (!m) return 1;
        memset(m + 2 * w->merges_cap, 0, (size_t)(cap - w->merges_cap) * 2 * sizeof *m);
        w->merge_text = m, w->merges_cap = cap;
    }
    if (rank >= w->n_merges) w->n_merges = rank + 1;
    if (part < 0) { /* "left right" in one string */
        const char *space = strchr(s, ' ');
        if (!space || space == s || !space[1] || strchr(space + 1, ' ')) return 2;
        char *left = malloc((size_t)(space - s) + 1);
        if (!left) return 1;
        memcpy(left, s, (size_t)(space - s)), left[space - s] = 0;
        free(w->merge_text[2 * rank]), w->merge_text[2 * rank] = left;
        return hf_keep(&w->merge_text[2 * rank + 1], space + 1);
    }
    return part > 1 ? 2 : hf_keep(&w->merge_text[2 * rank + part], s);
}

/* A field of one normalizer or pre-tokenizer step (keys k[0 .. n) below the step's object) */
static inline int hf_step_field(hf_step *s, const char **k, int n, const json_value *v) {
    const char *f = n > 0 && k[0] ? k[0] : "";
    int *flag = !strcmp(f, "add_prefix_space") ? &s->add_prefix_space : !strcmp(f, "use_regex") ? &s->use_regex
              : !strcmp(f, "individual_digits") ? &s->individual_digits : !strcmp(f, "split") ? &s->split
              : !strcmp(f, "invert") ? &s->invert : NULL;
    if (n == 1 && flag && (v->type == JSON_TRUE || v->type == JSON_FALSE)) *flag = v->type == JSON_TRUE;
    if (v->type != JSON_STRING) return 0;
    if (n == 1 && !strcmp(f, "type")) snprintf(s->type, sizeof s->type, "%s", v->string);
    else if (n == 1 && !strcmp(f, "prepend")) return hf_keep(&s->text, v->string);
    else if (n == 1 && !strcmp(f, "content")) return hf_keep(&s->content, v->string);
    else if (n == 1 && !strcmp(f, "replacement")) return hf_keep(&s->replacement, v->string);
    else if (n == 1 && !strcmp(f, "prepend_scheme")) return hf_keep(&s->scheme, v->string);
    else if (n == 1 && !strcmp(f, "behavior")) return hf_keep(&s->behavior, v->string);
    else if (n == 2 && !strcmp(f, "pattern") && k[1]) return s->regex = !strcmp(k[1], "Regex"), hf_keep(&s->text, v->string);
    return 0;
}

static inline const char *hf_key(const json_value *v, int level) { /* "" for an array's element or past the depth */
    return level >= 0 && level < v->depth && v->key[level] ? v->key[level] : "";
}

static inline int hf_tokenizer_value(void *user, const json_value *v) {
    hf_tokenizer_walk *w = user;
    hf_tokenizer *t = w->t;
    const char *k0 = hf_key(v, 0), *k1 = hf_key(v, 1);
    if (!strcmp(k0, "decoder") && !strcmp(hf_key(v, v->depth - 1), "type") && v->type == JSON_STRING &&
        !strcmp(v->string, "ByteLevel"))
        t->byte_level = 1;
    if (!strcmp(k0, "normalizer") || !strcmp(k0, "pre_tokenizer")) {
        int pre = k0[0] == 'p', list = v->depth > 2 && !v->key[2] && !strcmp(k1, pre ? "pretokenizers" : "normalizers");
        long at = list ? 1 + v->index[2] : 0;
        hf_step *steps = pre ? t->pre : t->normalizer;
        int *n = pre ? &t->n_pre : &t->n_normalizer;
        if (v->depth < 2) return 0; /* ("normalizer": null) */
        if (at >= HF_TOK_STEPS) return w->bad_step = 1;
        if (at >= *n) *n = (int)at + 1;
        return hf_step_field(&steps[at], (const char **)v->key + (list ? 3 : 1), v->depth - (list ? 3 : 1), v);
    }
    if (!strcmp(k0, "post_processor") && v->type == JSON_STRING && v->depth >= 4 && !strcmp(hf_key(v, v->depth - 1), "id") &&
        !strcmp(hf_key(v, v->depth - 2), "SpecialToken") && !v->key[v->depth - 3] && v->index[v->depth - 3] == 0 &&
        !strcmp(hf_key(v, v->depth - 4), "single"))
        return hf_keep(&w->bos_name, v->string); /* ("single": [{"SpecialToken": {"id": "<s>"}}, ...]) */
    if (!strcmp(k0, "model")) {
        if (!strcmp(k1, "vocab") && v->depth >= 3) {
            if (!v->key[2]) return w->vocab_array = 1; /* (a Unigram model's [piece, score] pairs) */
            return v->type == JSON_NUMBER ? hf_set_token(t, v->number, v->key[2], 0) : 1;
        }
        if (!strcmp(k1, "merges") && v->depth >= 3 && !v->key[2] && v->type == JSON_STRING && v->index[2] < 1 << 26)
            return hf_merge_add(w, v->index[2], v->depth == 3 ? -1 : v->depth == 4 && !v->key[3] ? (int)v->index[3] : 2, v->string);
        if (v->depth == 2 && !strcmp(k1, "type") && v->type == JSON_STRING) return hf_keep(&w->model_type, v->string);
        if (v->depth == 2 && !strcmp(k1, "unk_token") && v->type == JSON_STRING) return hf_keep(&w->unk_name, v->string);
        if (v->depth == 2 && !strcmp(k1, "byte_fallback")) t->byte_fallback = v->type == JSON_TRUE;
        if (v->depth == 2 && !strcmp(k1, "ignore_merges")) t->ignore_merges = v->type == JSON_TRUE;
        if (v->depth == 2 && !strcmp(k1, "fuse_unk")) t->fuse_unk = v->type == JSON_TRUE;
        if (v->depth == 2 && (!strcmp(k1, "continuing_subword_prefix") || !strcmp(k1, "end_of_word_suffix") || !strcmp(k1, "dropout")) &&
            v->type != JSON_NULL && !(v->type == JSON_STRING && !v->string[0]))
            return hf_keep(&w->other_model_field, k1);
        return 0;
    }
    if (strcmp(k0, "added_tokens") || v->depth != 3 || !v->key[2]) return 0;
    if (v->index[1] != w->added_at)
        free(w->added_content), w->added_content = NULL, w->added_id = w->added_set = -1, w->added_strip = 0, w->added_at = v->index[1];
    if ((!strcmp(v->key[2], "lstrip") || !strcmp(v->key[2], "rstrip")) && v->type == JSON_TRUE) {
        int strip = v->key[2][0] == 'l' ? HF_LSTRIP : HF_RSTRIP;
        w->added_strip |= strip;
        if (w->added_set >= 0) t->literal[w->added_set] |= (char)strip; /* (read after the token's id and content) */
    }
    if (!strcmp(v->key[2], "id") && v->type == JSON_NUMBER) w->added_id = v->number >= 0 && v->number < 1 << 24 ? (int)v->number : -2;
    if (!strcmp(v->key[2], "content") && v->type == JSON_STRING && !w->added_content && !(w->added_content = json_strdup(v->string))) return 1;
    if (w->added_id == -1 || !w->added_content) return 0;
    int bad = hf_set_token(t, w->added_id, w->added_content, HF_ADDED | w->added_strip);
    free(w->added_content), w->added_content = NULL, w->added_set = w->added_id, w->added_id = -1;
    return bad;
}

/* GPT-2's bytes_to_unicode: a byte-level BPE spells a printable byte as itself and each of the other 68
 * as code point 256 + k, in byte order */
static inline int hf_byte_printable(int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; }

/* The byte a byte-level BPE spells as code point cp, or -1 */
static inline int hf_unicode_byte(unsigned cp) {
    int k = (int)cp - 256;
    if (cp < 256) return (int)cp;
    for (int b = 0; b < 256; b++)
        if (!hf_byte_printable(b) && k-- == 0) return b;
    return -1;
}

/* The code point at s (a UTF-8 sequence of *len bytes); a byte that starts no valid sequence is one
 * code point of its own above Unicode's (0x110000 + the byte), so that no byte is lost */
static inline uint32_t hf_utf8_next(const unsigned char *s, size_t left, size_t *len) {
    unsigned char c = s[0];
    size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    uint32_t cp = n == 1 ? c : c & (0xFFu >> (n + 1));
    if (n == 0 || n > left) return *len = 1, 0x110000u + c;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return *len = 1, 0x110000u + c;
        cp = cp << 6 | (s[i] & 63u);
    }
    static const uint32_t least[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < least[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return *len = 1, 0x110000u + c; /* (overlong, surrogate) */
    return *len = n, cp;
}

/* cp as UTF-8 into out (at most 4 bytes): its length */
static inline size_t hf_utf8_put(uint32_t cp, char *out) { /* (a stand-in: its byte) */
    return cp >= 0x110000 ? (out[0] = (char)(cp - 0x110000), 1) : json_utf8_put(cp, out);
}

/* How many bytes hf_utf8_put writes for cp */
static inline size_t hf_utf8_size(uint32_t cp) { return cp < 0x80 || cp >= 0x110000 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

/* Where the white space that starts at s[at] ends (at most at length) */
static inline size_t hf_space_end(const char *s, size_t at, size_t length) {
    size_t len;
    while (at < length && unicode_is_space(hf_utf8_next((const unsigned char *)s + at, length - at, &len))) at += len;
    return at;
}

/* Where the white space that ends at s[end] starts (not before from) */
static inline size_t hf_space_start(const char *s, size_t from, size_t end) {
    while (end > from) {
        size_t lead = end - 1, len;
        while (lead > from && end - lead < 4 && ((unsigned char)s[lead] & 0xC0) == 0x80) lead--; /* (its first byte) */
        if (!unicode_is_space(hf_utf8_next((const unsigned char *)s + lead, end - lead, &len)) || lead + len != end) break;
        end = lead;
    }
    return end;
}

/* One token's bytes (at most 255 of them) into out[256] */
static inline void hf_token_bytes(const char *s, int byte_level, int literal, char *out) {
    int n = 0;
    while (*s && n < 255) {
        size_t len;
        unsigned hex = 0;
        uint32_t cp = hf_utf8_next((const unsigned char *)s, strlen(s), &len);
        int b = byte_level && !literal ? hf_unicode_byte(cp) : -1;
        if (b >= 0) out[n++] = (char)b;
        else if (!byte_level && !literal && cp == 0x2581) out[n++] = ' ';
        else if (!byte_level && !literal && !strncmp(s, "<0x", 3) && strlen(s) == 6 && s[5] == '>' && sscanf(s + 3, "%2x", &hex) == 1) {
            out[n++] = (char)hex, len = 6;
        } else {
            if (n + (int)len > 255) break;
            memcpy(out + n, s, len), n += (int)len;
        }
        s += len;
    }
    out[n] = 0;
}

/* The pre-tokenizing patterns hf_match computes: GPT-2's (also ByteLevel's own), LLaMA 3's, and Qwen2's
 * (LLaMA 3's with one digit a word) */
enum { HF_PATTERN_GPT2, HF_PATTERN_LLAMA3, HF_PATTERN_QWEN2, HF_PATTERNS };
static const char *const hf_patterns[HF_PATTERNS] = {
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};

/* Which of hf_patterns a Split's pattern is, or -1 */
static inline int hf_pattern(const char *text) {
    for (int k = 0; text && k < HF_PATTERNS; k++)
        if (!strcmp(text, hf_patterns[k])) return k;
    return -1;
}

/* What the steps of one section ask that hf_tokenizer_encode does not compute: its description, or NULL */
static inline const char *hf_steps_unsupported(const hf_step *s, int n, int pre, int *at) {
    for (*at = 0; *at < n; (*at)++, s++) {
        if (!strcmp(s->type, "Sequence") && *at == 0) continue;
        if (!pre && !strcmp(s->type, "Prepend") && s->text) continue;
        if (!pre && !strcmp(s->type, "NFC")) continue;
        if (!pre && !strcmp(s->type, "Replace") && s->text && s->content && !s->regex && s->text[0]) continue;
        if (pre && !strcmp(s->type, "ByteLevel")) continue;
        if (pre && !strcmp(s->type, "Digits")) continue;
        if (pre && !strcmp(s->type, "Metaspace") && (!s->scheme || !strcmp(s->scheme, "always") || !strcmp(s->scheme, "first") || !strcmp(s->scheme, "never"))) {
            size_t len;
            if (!s->replacement || (s->replacement[0] && hf_utf8_next((const unsigned char *)s->replacement, strlen(s->replacement), &len) < 0x110000 &&
                                    !s->replacement[len]))
                continue;
        }
        if (pre && !strcmp(s->type, "Split") && s->regex && hf_pattern(s->text) >= 0 && s->invert != 1 && (!s->behavior || !strcmp(s->behavior, "Isolated")))
            continue;
        if (!strcmp(s->type, "Split")) return "a Split by another pattern or behavior than GPT-2's, LLaMA 3's or Qwen2's, Isolated";
        return !s->type[0] ? "a step without its type" : "a step of another type";
    }
    return NULL;
}

static inline void hf_step_free(hf_step *s) { free(s->text), free(s->content), free(s->replacement), free(s->scheme), free(s->behavior); }

static inline void hf_tokenizer_close(hf_tokenizer *t) {
    if (!t) return;
    for (int i = 0; i < t->n; i++) free(t->spelled ? t->spelled[i] : NULL), free(t->bytes ? t->bytes[i] : NULL);
    for (int i = 0; i < HF_TOK_STEPS; i++) hf_step_free(&t->normalizer[i]), hf_step_free(&t->pre[i]);
    free(t->spelled), free(t->literal), free(t->bytes), free(t->vocab), free(t->merges), free(t->added), free(t);
}

/* The order encoding tries the added tokens in: by first byte, then the longest first */
typedef struct { unsigned char first; size_t length; int32_t id; } hf_added_key;
static inline int hf_added_order(const void *a, const void *b) {
    const hf_added_key *x = a, *y = b;
    if (x->first != y->first) return x->first - y->first;
    return x->length != y->length ? (x->length < y->length) - (x->length > y->length) : x->id - y->id;
}

/* Builds the tables from what the walk read: 0, or -1 with why[] */
static inline int hf_tokenizer_tables(hf_tokenizer *t, hf_tokenizer_walk *w, char *why, size_t why_size) {
    for (t->vocab_cap = 16; t->vocab_cap < 2 * (size_t)t->n; t->vocab_cap *= 2) {}
    for (t->merges_cap = 16; t->merges_cap < 2 * (size_t)w->n_merges; t->merges_cap *= 2) {}
    t->vocab = calloc(t->vocab_cap, sizeof *t->vocab), t->merges = malloc(t->merges_cap * sizeof *t->merges);
    t->bytes = calloc((size_t)t->n, sizeof *t->bytes), t->added = malloc((size_t)t->n * sizeof *t->added);
    if (!t->vocab || !t->merges || !t->bytes || !t->added) return snprintf(why, why_size, "out of memory"), -1;
    for (size_t k = 0; k < t->merges_cap; k++) t->merges[k].rank = -1;
    for (int i = 0; i < t->n; i++) {
        char out[256];
        if (!t->spelled[i]) continue;
        hf_token_bytes(t->spelled[i], t->byte_level, t->literal[i], out);
        if (!(t->bytes[i] = json_strdup(out))) return snprintf(why, why_size, "out of memory"), -1;
        if (t->literal[i] && t->spelled[i][0]) t->added[t->n_added++] = i;
        uint32_t h = hf_hash(t->spelled[i], strlen(t->spelled[i]));
        size_t k = h & (t->vocab_cap - 1);
        while (t->vocab[k].key && strcmp(t->vocab[k].key, t->spelled[i])) k = (k + 1) & (t->vocab_cap - 1);
        if (!t->vocab[k].key || t->literal[i]) t->vocab[k] = (hf_vocab_slot){h, i, t->spelled[i]}; /* (an added token over the model's) */
    }
    hf_added_key *keys = malloc((size_t)(t->n_added ? t->n_added : 1) * sizeof *keys);
    if (!keys) return snprintf(why, why_size, "out of memory"), -1;
    for (int k = 0; k < t->n_added; k++) keys[k] = (hf_added_key){(unsigned char)t->spelled[t->added[k]][0], strlen(t->spelled[t->added[k]]), t->added[k]};
    qsort(keys, (size_t)t->n_added, sizeof *keys, hf_added_order);
    for (int k = 0; k < t->n_added; k++) t->added[k] = keys[k].id;
    free(keys);
    for (int k = 0, b = 0; b <= 256; b++)
        for (t->added_first[b] = k; k < t->n_added && b < 256 && (unsigned char)t->spelled[t->added[k]][0] == b;) k++;
    for (int b = 0, k = 0; b < 256; b++) {
        char hex[8];
        t->byte_cp[b] = hf_byte_printable(b) ? (uint32_t)b : 256u + (uint32_t)k++;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        t->byte_ids[b] = hf_vocab_find(t, hex, 6);
    }
    t->unk = w->unk_name ? hf_vocab_find(t, w->unk_name, strlen(w->unk_name)) : -1;
    t->bos = w->bos_name ? hf_vocab_find(t, w->bos_name, strlen(w->bos_name)) : -1;
    if (w->bos_name && t->bos < 0)
        return snprintf(why, why_size, "post_processor: its template's special token '%.60s' is not a token of the vocabulary", w->bos_name), -1;
    for (long r = 0; r < w->n_merges; r++) {
        const char *a = w->merge_text[2 * r], *b = w->merge_text[2 * r + 1];
        if (!a || !b) return snprintf(why, why_size, "model.merges[%ld]: a pair of tokens expected", r), -1;
        size_t na = strlen(a), nb = strlen(b);
        char *ab = malloc(na + nb + 1);
        if (!ab) return snprintf(why, why_size, "out of memory"), -1;
        memcpy(ab, a, na), memcpy(ab + na, b, nb + 1);
        int32_t ia = hf_vocab_find(t, a, na), ib = hf_vocab_find(t, b, nb), merged = hf_vocab_find(t, ab, na + nb);
        free(ab);
        if (ia < 0 || ib < 0 || merged < 0)
            return snprintf(why, why_size, "model.merges[%ld]: '%.40s' + '%.40s': %s is not in model.vocab", r, a, b,
                            ia < 0 ? "the left token" : ib < 0 ? "the right token" : "the merged token"), -1;
        uint64_t pair = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        size_t k = (size_t)((pair * 0x9E3779B97F4A7C15ull) >> 32) & (t->merges_cap - 1);
        while (t->merges[k].rank >= 0 && t->merges[k].pair != pair) k = (k + 1) & (t->merges_cap - 1);
        if (t->merges[k].rank < 0) t->merges[k] = (hf_merge_slot){pair, (int32_t)r, merged}; /* (a repeated pair: its first rank) */
    }
    return 0;
}

/* Reads tokenizer.json at path into *out (hf_tokenizer_close frees it): 0, or -1 with why[] */
static inline int hf_tokenizer_open(const char *path, hf_tokenizer **out, char *why, size_t why_size) {
    hf_tokenizer *t = calloc(1, sizeof *t);
    hf_tokenizer_walk w = {.t = t, .added_at = -1, .added_id = -1, .added_set = -1};
    int bad = 0, at;
    const char *what;
    why[0] = 0, *out = NULL;
    if (!t) return snprintf(why, why_size, "out of memory"), -1;
    for (int i = 0; i < HF_TOK_STEPS; i++)
        t->normalizer[i] = t->pre[i] = (hf_step){.add_prefix_space = -1, .use_regex = -1, .individual_digits = -1, .split = -1, .invert = -1};
    if (json_scan_file(path, 1L << 30, hf_tokenizer_value, &w, why, why_size)) {
        bad = 1;
        if (!why[0]) /* (the walk stopped it) */
            snprintf(why, why_size, "%s", w.vocab_array ? "model.vocab is a list (a Unigram model): a BPE tokenizer's map of tokens to ids expected"
                                          : w.bad_step ? "normalizer or pre_tokenizer: a Sequence of more than 7 steps"
                                                       : "model.vocab, model.merges or added_tokens: ids 0 .. 2^24 and strings ('left right') expected");
    } else if (!t->n) bad = 1, snprintf(why, why_size, "no model.vocab: a Hugging Face tokenizer.json expected");
    else if (w.model_type && strcmp(w.model_type, "BPE")) bad = 1, snprintf(why, why_size, "model.type is '%.40s': BPE expected", w.model_type);
    else if (w.other_model_field) bad = 1, snprintf(why, why_size, "model.%s is set: BPE without it expected", w.other_model_field);
    else if ((what = hf_steps_unsupported(t->normalizer, t->n_normalizer, 0, &at)))
        bad = 1, snprintf(why, why_size, "normalizer%s: %s (%.40s): NFC, Prepend and Replace of a string are computed", at ? " step" : "", what,
                          t->normalizer[at].type);
    else if ((what = hf_steps_unsupported(t->pre, t->n_pre, 1, &at)))
        bad = 1, snprintf(why, why_size, "pre_tokenizer%s: %s (%.40s): ByteLevel, Split, Digits and Metaspace are computed", at ? " step" : "", what, t->pre[at].type);
    else bad = hf_tokenizer_tables(t, &w, why, why_size) != 0;
    for (long r = 0; r < 2 * w.n_merges; r++) free(w.merge_text[r]);
    free(w.merge_text), free(w.model_type), free(w.unk_name), free(w.bos_name), free(w.other_model_field), free(w.added_content);
    if (bad) return hf_tokenizer_close(t), -1;
    return *out = t, 0;
}

/* ---- encoding ---- */

/* A text being pre-tokenized: its code points and where each piece ends */
typedef struct { uint32_t *cp; size_t n, cap; size_t *end; size_t pieces, end_cap; } hf_pieces;

/* items (a growing array of *cap elements of `size` bytes, n used) with room for one more: doubled when
 * full (first: the first size); NULL when out of memory (items kept) */
static inline void *hf_grow(void *items, size_t *cap, size_t n, size_t size, size_t first) {
    if (n < *cap) return items;
    size_t grown = *cap ? 2 * *cap : first;
    void *more = realloc(items, grown * size);
    if (more) *cap = grown;
    return more;
}

static inline int hf_push_cp(hf_pieces *p, uint32_t cp) {
    uint32_t *c = hf_grow(p->cp, &p->cap, p->n, sizeof *c, 64);
    if (!c) return -1;
    return p->cp = c, p->cp[p->n++] = cp, 0;
}

static inline int hf_push_text(hf_pieces *p, const char *s) {
    for (size_t len, left = strlen(s); left; s += len, left -= len)
        if (hf_push_cp(p, hf_utf8_next((const unsigned char *)s, left, &len))) return -1;
    return 0;
}

static inline int hf_end(hf_pieces *p, size_t at) { /* a piece ends at code point `at` */
    size_t *e = hf_grow(p->end, &p->end_cap, p->pieces, sizeof *e, 16);
    if (!e) return -1;
    return p->end = e, p->end[p->pieces++] = at, 0;
}

static inline int hf_cut(hf_pieces *p) { /* ends the piece being built (an empty one is none) */
    return p->n == (p->pieces ? p->end[p->pieces - 1] : 0) ? 0 : hf_end(p, p->n);
}

enum { HF_LETTER, HF_NUMBER, HF_SPACE, HF_OTHER };
static inline int hf_class(uint32_t cp) {
    return unicode_is_letter(cp) ? HF_LETTER : unicode_is_number(cp) ? HF_NUMBER : unicode_is_space(cp) ? HF_SPACE : HF_OTHER;
}

static inline size_t hf_run(const uint32_t *c, size_t i, size_t n, int cls) {
    size_t j = i;
    while (j < n && hf_class(c[j]) == cls) j++;
    return j - i;
}

/* The length of the match at c[i] (i < n) of hf_patterns[pattern], trying the alternatives in the
 * pattern's order */
static inline size_t hf_match(const uint32_t *c, size_t i, size_t n, int pattern) {
    int llama3 = pattern != HF_PATTERN_GPT2; /* (and Qwen2's) */
    if (c[i] == '\'' && i + 1 < n) { /* 's 't 're 've 'm 'll 'd (in any case in LLaMA 3's) */
        uint32_t a = c[i + 1], b = i + 2 < n ? c[i + 2] : 0;
        if (llama3) a |= a >= 'A' && a <= 'Z' ? 32 : 0, b |= b >= 'A' && b <= 'Z' ? 32 : 0;
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    }
    int cls = hf_class(c[i]);
    if (llama3) {
        if (cls != HF_LETTER && cls != HF_NUMBER && c[i] != '\r' && c[i] != '\n' && i + 1 < n && hf_class(c[i + 1]) == HF_LETTER)
            return 1 + hf_run(c, i + 1, n, HF_LETTER); /* [^\r\n\p{L}\p{N}]?\p{L}+ */
        if (cls == HF_LETTER) return hf_run(c, i, n, HF_LETTER);
        size_t most = pattern == HF_PATTERN_QWEN2 ? 1 : 3; /* \p{N}{1,3}, or \p{N} */
        if (cls == HF_NUMBER) return hf_run(c, i, n, HF_NUMBER) < most ? hf_run(c, i, n, HF_NUMBER) : most;
        size_t s = c[i] == ' ' && i + 1 < n && hf_class(c[i + 1]) == HF_OTHER;
        if (s || cls == HF_OTHER) { /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
            size_t j = i + s + hf_run(c, i + s, n, HF_OTHER);
            while (j < n && (c[j] == '\r' || c[j] == '\n')) j++;
            return j - i;
        }
    } else {
        size_t s = c[i] == ' ' && i + 1 < n && hf_class(c[i + 1]) != HF_SPACE; /*  ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+ */
        if (s || cls != HF_SPACE) return s + hf_run(c, i + s, n, hf_class(c[i + s]));
    }
    size_t r = hf_run(c, i, n, HF_SPACE); /* c[i] is white space */
    if (llama3) { /* \s*[\r\n]+: up to the run's last line break */
        size_t last = 0;
        for (size_t j = i; j < i + r; j++)
            if (c[j] == '\r' || c[j] == '\n') last = j + 1;
        if (last) return last - i;
    }
    return i + r == n || r == 1 ? r : r - 1; /* \s+(?!\S), else \s+ */
}

/* Pre-tokenizer step s on every piece of in, into out (emptied first); text_start: in begins the text
 * (Metaspace's "first" prepends there only) */
static inline int hf_pre_step(const hf_step *s, const hf_pieces *in, hf_pieces *out, int text_start) {
    int bad = 0, byte_level = !strcmp(s->type, "ByteLevel"), pattern = byte_level ? HF_PATTERN_GPT2 : hf_pattern(s->text);
    size_t len;
    uint32_t meta = s->replacement ? hf_utf8_next((const unsigned char *)s->replacement, strlen(s->replacement), &len) : 0x2581;
    out->n = out->pieces = 0;
    for (size_t k = 0, b = 0; k < in->pieces && !bad; b = in->end[k++]) {
        const uint32_t *c = in->cp + b;
        size_t n = in->end[k] - b, start = out->n;
        if (byte_level || !strcmp(s->type, "Split")) { /* words by the pattern (ByteLevel's own: GPT-2's) */
            if (byte_level && s->add_prefix_space != 0 && c[0] != ' ') bad |= hf_push_cp(out, ' ');
            for (size_t i = 0; i < n; i++) bad |= hf_push_cp(out, c[i]);
            for (size_t i = start; !bad && i < out->n && !(byte_level && s->use_regex == 0);)
                i += hf_match(out->cp + start, i - start, out->n - start, pattern), bad |= hf_end(out, i);
            bad |= hf_cut(out);
        } else if (!strcmp(s->type, "Digits")) { /* digits apart from the rest, each alone if individual */
            for (size_t i = 0; i < n; i++) {
                int digit = unicode_is_number(c[i]);
                if (i && (digit != unicode_is_number(c[i - 1]) || (digit && s->individual_digits == 1))) bad |= hf_cut(out);
                bad |= hf_push_cp(out, c[i]);
            }
            bad |= hf_cut(out);
        } else { /* Metaspace: a space is U+2581 (or the replacement), one put first, a word cut before each */
            int first = s->scheme && !strcmp(s->scheme, "first"), never = s->scheme && !strcmp(s->scheme, "never");
            if (!never && c[0] != ' ' && c[0] != meta && (!first || (text_start && b == 0))) bad |= hf_push_cp(out, meta);
            for (size_t i = 0; i < n; i++) {
                uint32_t cp = c[i] == ' ' ? meta : c[i];
                if (cp == meta && s->split != 0) bad |= hf_cut(out);
                bad |= hf_push_cp(out, cp);
            }
            bad |= hf_cut(out);
        }
    }
    return bad ? -1 : 0;
}

/* ByteLevel's spelling: each piece's bytes, each byte as the code point GPT-2's table gives it */
static inline int hf_spell_bytes(const hf_tokenizer *t, const hf_pieces *in, hf_pieces *out) {
    int bad = 0;
    out->n = out->pieces = 0;
    for (size_t k = 0, b = 0; k < in->pieces && !bad; b = in->end[k++]) {
        for (size_t i = b; i < in->end[k]; i++) {
            char u[4];
            size_t len = hf_utf8_put(in->cp[i], u);
            for (size_t j = 0; j < len; j++) bad |= hf_push_cp(out, t->byte_cp[(unsigned char)u[j]]);
        }
        bad |= hf_cut(out);
    }
    return bad ? -1 : 0;
}

/* Normalizer step s on the code points of in (one piece), into out */
static inline int hf_normalize_step(const hf_step *s, const hf_pieces *in, hf_pieces *out) {
    int bad = 0;
    out->n = out->pieces = 0;
    if (!strcmp(s->type, "NFC")) { /* (Qwen2's) */
        uint32_t *nfc;
        size_t n;
        if (unicode_nfc(in->cp, in->n, &nfc, &n)) return -1;
        for (size_t i = 0; i < n && !bad; i++) bad |= hf_push_cp(out, nfc[i]);
        free(nfc);
        return bad || hf_cut(out) ? -1 : 0;
    }
    if (!strcmp(s->type, "Prepend") && in->n) bad |= hf_push_text(out, s->text);
    hf_pieces from = {0}, to = {0};
    int replace = !strcmp(s->type, "Replace");
    if (replace) bad |= hf_push_text(&from, s->text) | hf_push_text(&to, s->content);
    for (size_t i = 0; i < in->n && !bad;) {
        if (replace && from.n && i + from.n <= in->n && !memcmp(in->cp + i, from.cp, from.n * sizeof *from.cp)) {
            for (size_t j = 0; j < to.n; j++) bad |= hf_push_cp(out, to.cp[j]);
            i += from.n;
        } else bad |= hf_push_cp(out, in->cp[i++]);
    }
    free(from.cp), free(to.cp);
    return bad || hf_cut(out) ? -1 : 0;
}

/* ---- BPE ---- */

typedef struct { int32_t *v; size_t n, cap; } hf_ids;

static inline int hf_ids_push(hf_ids *o, int32_t id) {
    int32_t *v = hf_grow(o->v, &o->cap, o->n, sizeof *v, 256);
    if (!v) return -1;
    return o->v = v, o->v[o->n++] = id, 0;
}

typedef struct { int32_t id, prev, next; } hf_symbol;
typedef struct { int32_t rank, pos, merged; } hf_candidate;
typedef struct { hf_symbol *sym; size_t sym_cap; hf_candidate *heap; size_t heap_n, heap_cap; char *spell; size_t spell_cap; } hf_bpe_scratch;

static inline int hf_before(hf_candidate a, hf_candidate b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static inline int hf_heap_push(hf_bpe_scratch *w, hf_candidate c) {
    hf_candidate *h = hf_grow(w->heap, &w->heap_cap, w->heap_n, sizeof *h, 64);
    if (!h) return -1;
    w->heap = h;
    size_t i = w->heap_n++;
    for (; i && hf_before(c, w->heap[(i - 1) / 2]); i = (i - 1) / 2) w->heap[i] = w->heap[(i - 1) / 2];
    return w->heap[i] = c, 0;
}

static inline hf_candidate hf_heap_pop(hf_bpe_scratch *w) {
    hf_candidate top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0;
    for (size_t child; (child = 2 * i + 1) < w->heap_n; i = child) {
        if (child + 1 < w->heap_n && hf_before(w->heap[child + 1], w->heap[child])) child++;
        if (!hf_before(w->heap[child], last)) break;
        w->heap[i] = w->heap[child];
    }
    if (w->heap_n) w->heap[i] = last;
    return top;
}

/* The pair of symbols at pos and the one after, as a candidate if the pair merges */
static inline int hf_offer(const hf_tokenizer *t, hf_bpe_scratch *w, int32_t pos) {
    if (pos < 0 || w->sym[pos].next < 0) return 0;
    const hf_merge_slot *m = hf_merge_find(t, w->sym[pos].id, w->sym[w->sym[pos].next].id);
    return m ? hf_heap_push(w, (hf_candidate){m->rank, pos, m->merged}) : 0;
}

/* One word's ids: its characters as tokens (a character without one as its bytes' "<0xNN>", else
 * <unk>), then merged pair by pair, the lowest rank first and the leftmost of equals */
static inline int hf_bpe(const hf_tokenizer *t, const uint32_t *c, size_t n, hf_bpe_scratch *w, hf_ids *out) {
    if (w->spell_cap < 4 * n + 1) {
        char *s = realloc(w->spell, 4 * n + 1);
        if (!s) return -1;
        w->spell = s, w->spell_cap = 4 * n + 1;
    }
    if (w->sym_cap < 4 * n) {
        hf_symbol *s = realloc(w->sym, 4 * n * sizeof *s);
        if (!s) return -1;
        w->sym = s, w->sym_cap = 4 * n;
    }
    size_t len = 0, ns = 0;
    for (size_t i = 0; i < n; i++) len += hf_utf8_put(c[i], w->spell + len);
    int32_t whole = t->ignore_merges ? hf_vocab_find(t, w->spell, len) : -1;
    if (whole >= 0) return hf_ids_push(out, whole);
    for (size_t i = 0, at = 0; i < n; i++) { /* (each character's spelling within the word's) */
        size_t cl = hf_utf8_size(c[i]);
        int32_t id = hf_vocab_find(t, w->spell + at, cl), bytes = t->byte_fallback;
        for (size_t j = 0; j < cl && bytes && id < 0; j++) bytes = t->byte_ids[(unsigned char)w->spell[at + j]] >= 0;
        if (id >= 0) w->sym[ns++].id = id;
        else if (bytes) for (size_t j = 0; j < cl; j++) w->sym[ns++].id = t->byte_ids[(unsigned char)w->spell[at + j]];
        else if (t->unk >= 0 && !(t->fuse_unk && ns && w->sym[ns - 1].id == t->unk)) w->sym[ns++].id = t->unk;
        at += cl; /* (a character without a token, bytes or <unk> is dropped, as `tokenizers` does) */
    }
    w->heap_n = 0;
    for (size_t i = 0; i < ns; i++) w->sym[i].prev = (int32_t)i - 1, w->sym[i].next = i + 1 < ns ? (int32_t)i + 1 : -1;
    for (size_t i = 0; i + 1 < ns; i++)
        if (hf_offer(t, w, (int32_t)i)) return -1;
    while (w->heap_n) {
        hf_candidate m = hf_heap_pop(w);
        hf_symbol *a = &w->sym[m.pos];
        if (a->id < 0 || a->next < 0) continue; /* (merged away since) */
        const hf_merge_slot *now = hf_merge_find(t, a->id, w->sym[a->next].id);
        if (!now || now->merged != m.merged) continue; /* (the pair changed since) */
        hf_symbol *b = &w->sym[a->next];
        a->id = m.merged, a->next = b->next, b->id = -1;
        if (b->next >= 0) w->sym[b->next].prev = m.pos;
        if (hf_offer(t, w, a->prev) || hf_offer(t, w, m.pos)) return -1;
    }
    for (int32_t i = ns ? 0 : -1; i >= 0; i = w->sym[i].next)
        if (hf_ids_push(out, w->sym[i].id)) return -1;
    return 0;
}

/* The ids of one piece of text between added tokens */
static inline int hf_encode_plain(const hf_tokenizer *t, const char *s, size_t length, int text_start, hf_pieces p[2], hf_bpe_scratch *w, hf_ids *out) {
    p[0].n = p[0].pieces = 0;
    for (size_t len, i = 0; i < length; i += len)
        if (hf_push_cp(&p[0], hf_utf8_next((const unsigned char *)s + i, length - i, &len))) return -1;
    if (hf_cut(&p[0])) return -1;
    for (int k = t->n_normalizer > 1; k < t->n_normalizer; k++) { /* (step 0 of several is the Sequence) */
        hf_pieces swap;
        if (hf_normalize_step(&t->normalizer[k], &p[0], &p[1])) return -1;
        swap = p[0], p[0] = p[1], p[1] = swap;
    }
    for (int k = t->n_pre > 1; k < t->n_pre; k++) {
        hf_pieces swap;
        if (hf_pre_step(&t->pre[k], &p[0], &p[1], text_start)) return -1;
        swap = p[0], p[0] = p[1], p[1] = swap;
        if (strcmp(t->pre[k].type, "ByteLevel")) continue;
        if (hf_spell_bytes(t, &p[0], &p[1])) return -1;
        swap = p[0], p[0] = p[1], p[1] = swap;
    }
    for (size_t k = 0, b = 0; k < p[0].pieces; b = p[0].end[k++])
        if (hf_bpe(t, p[0].cp + b, p[0].end[k] - b, w, out)) return -1;
    return 0;
}

/* The ids of text[0 .. length) into *ids (malloc'd, *n of them), the template's start token first if
 * add_start (t->bos); 0, or -1 when out of memory */
static inline int hf_tokenizer_encode(const hf_tokenizer *t, const char *text, size_t length, int add_start, int32_t **ids, size_t *n) {
    hf_ids out = {0};
    hf_pieces p[2] = {{0}, {0}};
    hf_bpe_scratch w = {0};
    int bad = add_start && t->bos >= 0 ? hf_ids_push(&out, t->bos) : 0;
    size_t plain = 0; /* where the text since the last added token starts */
    for (size_t i = 0; i <= length && !bad; i++) {
        int32_t found = -1;
        size_t flen = 0;
        if (i < length)
            for (int k = t->added_first[(unsigned char)text[i]]; k < t->added_first[(unsigned char)text[i] + 1] && found < 0; k++) {
                const char *a = t->spelled[t->added[k]];
                size_t alen = strlen(a);
                if (alen <= length - i && !memcmp(text + i, a, alen)) found = t->added[k], flen = alen;
            }
        if (found < 0 && i < length) continue;
        size_t plain_end = found >= 0 && t->literal[found] & HF_LSTRIP ? hf_space_start(text, plain, i) : i;
        if (plain_end > plain) bad |= hf_encode_plain(t, text + plain, plain_end - plain, plain == 0, p, &w, &out);
        if (found < 0) continue;
        bad |= hf_ids_push(&out, found), plain = i + flen;
        if (t->literal[found] & HF_RSTRIP) plain = hf_space_end(text, plain, length);
        i = plain - 1; /* (the loop's i++ goes on at plain) */
    }
    free(p[0].cp), free(p[0].end), free(p[1].cp), free(p[1].end), free(w.sym), free(w.heap), free(w.spell);
    if (bad) return free(out.v), *ids = NULL, *n = 0, -1;
    return *ids = out.v, *n = out.n, 0;
}

/* ---- documents into a token file ---- */

enum { HF_DOCUMENT_MOST = 1 << 28 }; /* bytes of one document: encoding holds about 16 bytes for each */

/* The token each document starts with: the template's start token, else "<|endoftext|>" where the
 * vocabulary has it (GPT-2's and SmolLM2's documents, as llm.c's shards part them), else -1 */
static inline int32_t hf_tokenizer_doc_start(const hf_tokenizer *t) { return t->bos >= 0 ? t->bos : hf_vocab_find(t, "<|endoftext|>", 13); }

static inline int hf_eos_field(void *user, const json_value *v) { /* tokenizer_config.json's "eos_token" (or its "content") */
    char **eos = user;
    int here = v->type == JSON_STRING && !strcmp(hf_key(v, 0), "eos_token") && (v->depth == 1 || !strcmp(hf_key(v, 1), "content"));
    return here && !*eos ? !(*eos = json_strdup(v->string)) : 0;
}

/* The token a completion ends with (a prompt's answer: the model learns to stop there): the eos_token of the
 * tokenizer_config.json beside tokenizer.json at path, else "<|endoftext|>" or "</s>" where the vocabulary
 * has it, else -1 */
static inline int32_t hf_tokenizer_doc_end(const hf_tokenizer *t, const char *path) {
    const char *slash = strrchr(path, '/');
    char config[4200], why[200], *eos = NULL;
    snprintf(config, sizeof config, "%.*s%stokenizer_config.json", slash ? (int)(slash - path) : 0, path, slash ? "/" : "");
    int32_t id = -1;
    if (!json_scan_file(config, 1 << 24, hf_eos_field, &eos, why, sizeof why) && eos) id = hf_vocab_find(t, eos, strlen(eos)); /* (none: the names) */
    free(eos);
    if (id < 0) id = hf_vocab_find(t, "<|endoftext|>", 13);
    return id >= 0 ? id : hf_vocab_find(t, "</s>", 4);
}

/* A whole file, a document, into *text (malloc'd); 0, or -1 with why[] */
static inline int hf_read_document(const char *path, char **text, size_t *length, char *why, size_t why_size) {
    char what[200];
    int got = json_read_file(path, HF_DOCUMENT_MOST, text, length, what, sizeof what);
    if (got == -2) snprintf(why, why_size, "%.300s: %zu bytes, more than a document's %d: split it into files", path, *length, HF_DOCUMENT_MOST);
    else if (got) snprintf(why, why_size, "%.300s: %.150s", path, what);
    return got ? -1 : 0;
}

/* One line of f into *line (grown as needed, without its newline); 0, or -1 at the end or out of memory */
static inline int hf_read_line(FILE *f, char **line, size_t *cap, size_t *length) {
    *length = 0;
    for (;;) {
        if (*cap - *length < 2) {
            size_t grown = *cap ? 2 * *cap : 4096;
            char *l = realloc(*line, grown);
            if (!l) return -1;
            *line = l, *cap = grown;
        }
        if (!fgets(*line + *length, (int)(*cap - *length < 1 << 30 ? *cap - *length : 1 << 30), f)) return *length ? 0 : -1;
        *length += strlen(*line + *length);
        if (*length && (*line)[*length - 1] == '\n') return (*line)[--*length] = 0, 0;
    }
}

/* A JSON Lines record's top-level strings (their bytes: a \u0000 among them): "text" (a document), or "prompt" and
 * "completion" (an answer to learn) */
typedef struct { char *s; size_t n; } hf_bytes;
typedef struct { hf_bytes text, prompt, completion; } hf_record;
static inline int hf_jsonl_record(void *user, const json_value *v) {
    hf_record *r = user;
    const char *k = hf_key(v, 0);
    hf_bytes *to = v->depth != 1 || v->type != JSON_STRING ? NULL : !strcmp(k, "text") ? &r->text : !strcmp(k, "prompt") ? &r->prompt
                                                                 : !strcmp(k, "completion") ? &r->completion : NULL;
    if (!to || to->s) return 0;
    if (!(to->s = malloc(v->length + 1))) return 1;
    return memcpy(to->s, v->string, v->length + 1), to->n = v->length, 0;
}

typedef struct { size_t documents, bytes; uint64_t tokens, prompt_tokens; } hf_tokenize_stats;

/* The ids of text[0 .. length) into f, each stored as ~id where `prompt` (read, but no target: pdde_data) */
static inline int hf_write_ids(const hf_tokenizer *t, FILE *f, const char *text, size_t length, int prompt, hf_tokenize_stats *stats) {
    int32_t *ids = NULL;
    size_t count = 0;
    int bad = hf_tokenizer_encode(t, text, length, 0, &ids, &count) != 0;
    for (size_t i = 0; i < count && prompt; i++) ids[i] = ~ids[i];
    if (!bad && count) bad = fwrite(ids, sizeof *ids, count, f) != count;
    stats->tokens += count, stats->prompt_tokens += prompt ? count : 0, stats->bytes += length;
    free(ids);
    return bad ? -1 : 0;
}

/* One document into f: token `start` (unless -1), then its text; or with a prompt (its s not NULL) start and the
 * prompt as no targets, then the text, its completion, and token `end` (unless -1) as targets */
static inline int hf_write_document(const hf_tokenizer *t, FILE *f, int32_t start, hf_bytes prompt, hf_bytes doc, int32_t end, hf_tokenize_stats *stats) {
    int32_t first = prompt.s && start >= 0 ? ~start : start;
    int bad = start >= 0 && fwrite(&first, sizeof first, 1, f) != 1;
    stats->tokens += start >= 0, stats->prompt_tokens += prompt.s && start >= 0, stats->documents++;
    if (!bad && prompt.s) bad = hf_write_ids(t, f, prompt.s, prompt.n, 1, stats);
    if (!bad) bad = hf_write_ids(t, f, doc.s, doc.n, 0, stats);
    if (!bad && prompt.s && end >= 0) bad = fwrite(&end, sizeof end, 1, f) != 1, stats->tokens++;
    return bad ? -1 : 0;
}

/* Writes the ids of the documents in paths[0 .. n) as a pdde token file at out ("PDDETOK1", the count
 * as u64, the ids as i32), each after token `start` unless it is -1, through out.tmp and a rename. A
 * file is one document; a .jsonl file holds one on each line (JSON Lines, as datasets are exported): its
 * record's "text", or its "prompt" and "completion" (TRL's prompt-completion form: the prompt's tokens are
 * stored as no targets, ~id, and the completion ends with token `end` unless it is -1; the two are
 * tokenized apart). 0, or -1 with why[] naming the file (and line); nothing is left at out */
static inline int hf_tokenizer_write_tokens(const hf_tokenizer *t, char *const *paths, int n, int32_t start, int32_t end, const char *out,
                                            hf_tokenize_stats *stats, char *why, size_t why_size) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%.4190s.tmp", out);
    FILE *f = fopen(tmp, "wb");
    if (!f) return snprintf(why, why_size, "%.300s: %s", tmp, strerror(errno)), -1;
    *stats = (hf_tokenize_stats){0};
    int bad = fwrite("PDDETOK1", 8, 1, f) != 1 || fwrite(&stats->tokens, 8, 1, f) != 1, said = 0; /* (said: why[] holds a document's error) */
    for (int i = 0; i < n && !bad; i++) {
        size_t len = strlen(paths[i]), length, cap = 0;
        char *doc = NULL;
        if (len < 6 || strcmp(paths[i] + len - 6, ".jsonl")) {
            if ((bad = said = hf_read_document(paths[i], &doc, &length, why, why_size) != 0)) break;
            if ((bad = hf_write_document(t, f, start, (hf_bytes){0}, (hf_bytes){doc, length}, -1, stats))) said = 0;
            free(doc);
            continue;
        }
        FILE *in = fopen(paths[i], "rb");
        if (!in) { bad = said = 1, snprintf(why, why_size, "%.300s: %s", paths[i], strerror(errno)); break; }
        for (long line = 1; !bad && !hf_read_line(in, &doc, &cap, &length); line++) {
            hf_record r = {0};
            char what[200] = "";
            if (strspn(doc, " \t\r") == length) continue; /* (a blank line) */
            int scanned = !json_scan(doc, length, hf_jsonl_record, &r, what, sizeof what);
            hf_bytes text = r.prompt.s || r.completion.s ? r.completion : r.text;
            if (!scanned || !text.s || (r.prompt.s && r.text.s) || (r.completion.s && !r.prompt.s))
                bad = said = 1, snprintf(why, why_size, "%.200s:%ld: %.150s", paths[i], line, what[0] ? what : !scanned ? "out of memory"
                                                                        : "a record with a \"text\" string, or a \"prompt\" and a \"completion\", expected");
            else bad = hf_write_document(t, f, start, r.prompt, text, end, stats);
            free(r.text.s), free(r.prompt.s), free(r.completion.s);
        }
        if (!bad && ferror(in)) bad = said = 1, snprintf(why, why_size, "%.300s: read failed", paths[i]);
        fclose(in), free(doc);
    }
    if (!bad) bad = fseek(f, 8, SEEK_SET) || fwrite(&stats->tokens, 8, 1, f) != 1;
    bad |= fclose(f) != 0;
    if (!bad && rename(tmp, out)) bad = 1;
    if (bad && !said) snprintf(why, why_size, "%.300s: %s", out, errno ? strerror(errno) : "out of memory");
    if (bad) remove(tmp);
    return bad ? -1 : 0;
}

#endif
