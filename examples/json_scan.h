/* json_scan.h — Demonstrates how to read JSON with a reader small enough to vendor beside pdde: it walks
 * a document and hands every scalar (string, number, true, false, null) to a callback with the keys
 * that lead to it. Hugging Face's files need no more: a safetensors header (examples/safetensors.h) and
 * a model's config.json (examples/gpt_hf.h).
 *
 *   json_scan(text, length, visit, user, why, sizeof why)   0, or -1 with why[] giving the byte offset
 *   json_scan_file(path, most, visit, user, why, sizeof why)   the same of a file of at most `most` bytes
 *   json_read_file(path, most, &text, &length, why, sizeof why)   such a file's bytes (json_utf8_put, json_strdup: helpers)
 *
 * visit(user, v) sees v->key[0 .. v->depth): the member names from the top object down (NULL for an
 * array element, whose position is v->index[i]). Returning nonzero stops the walk (json_scan returns
 * -1 and leaves why[] to the callback). Strict RFC 8259 syntax, strings unescaped (\uXXXX to UTF-8),
 * nesting bounded by JSON_SCAN_DEPTH. */
#ifndef PDDE_JSON_SCAN_H
#define PDDE_JSON_SCAN_H
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { JSON_SCAN_DEPTH = 16 };
typedef enum { JSON_STRING, JSON_NUMBER, JSON_TRUE, JSON_FALSE, JSON_NULL } json_type;

typedef struct {
    int depth;
    const char *key[JSON_SCAN_DEPTH]; /* member name at each level; NULL inside an array */
    long index[JSON_SCAN_DEPTH];      /* element index at each level inside an array */
    json_type type;
    const char *string; /* JSON_STRING: the unescaped value (NUL-terminated) */
    size_t length;      /* JSON_STRING: its bytes (a \u0000 among them) */
    double number;      /* JSON_NUMBER */
} json_value;

typedef int (*json_visit)(void *user, const json_value *v);

typedef struct {
    const char *s, *end, *start;
    json_visit visit;
    void *user;
    json_value v;
    char *why;
    size_t why_size;
} json_scanner;

static inline int json_fail(json_scanner *j, const char *what) {
    snprintf(j->why, j->why_size, "JSON syntax at byte %ld: %s", (long)(j->s - j->start), what);
    return -1;
}

static inline void json_skip_space(json_scanner *j) {
    while (j->s < j->end && (*j->s == ' ' || *j->s == '\t' || *j->s == '\n' || *j->s == '\r')) j->s++;
}

static inline int json_hex4(const char *p, unsigned *u) {
    *u = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *u = *u << 4 | (unsigned)d;
    }
    return 0;
}

/* Code point u (at most 0x10FFFF) as UTF-8 into out (at most 4 bytes): its length */
static inline size_t json_utf8_put(uint32_t u, char *out) {
    if (u < 0x80) return out[0] = (char)u, 1;
    if (u < 0x800) return out[0] = (char)(0xC0 | u >> 6), out[1] = (char)(0x80 | (u & 63)), 2;
    if (u < 0x10000) return out[0] = (char)(0xE0 | u >> 12), out[1] = (char)(0x80 | (u >> 6 & 63)), out[2] = (char)(0x80 | (u & 63)), 3;
    return out[0] = (char)(0xF0 | u >> 18), out[1] = (char)(0x80 | (u >> 12 & 63)), out[2] = (char)(0x80 | (u >> 6 & 63)),
           out[3] = (char)(0x80 | (u & 63)), 4;
}

static inline char *json_strdup(const char *s) {
    char *d = malloc(strlen(s) + 1);
    return d ? strcpy(d, s) : NULL;
}

/* The string at j->s (its opening quote), unescaped into a malloc'd buffer (*out, *length bytes), or -1 */
static inline int json_string(json_scanner *j, char **out, size_t *length) {
    const char *p = ++j->s;
    while (p < j->end && *p != '"') p += *p == '\\' && p + 1 < j->end ? 2 : 1;
    if (p >= j->end) return json_fail(j, "a string without its closing quote");
    char *o = malloc((size_t)(p - j->s) + 1), *w = o;
    if (!o) return json_fail(j, "out of memory");
    while (j->s < p) {
        unsigned char c = (unsigned char)*j->s++;
        if (c < 0x20) return free(o), json_fail(j, "a control character inside a string");
        if (c != '\\') { *w++ = (char)c; continue; }
        c = (unsigned char)*j->s++;
        const char *simple = strchr("\"\\/bfnrt", c), *to = "\"\\/\b\f\n\r\t";
        if (c && simple) { *w++ = to[simple - "\"\\/bfnrt"]; continue; }
        unsigned u, lo;
        if (c != 'u' || p - j->s < 4 || json_hex4(j->s, &u)) return free(o), json_fail(j, "a bad escape in a string");
        j->s += 4;
        if (u >= 0xD800 && u < 0xDC00) { /* a surrogate pair */
            if (p - j->s < 6 || j->s[0] != '\\' || j->s[1] != 'u' || json_hex4(j->s + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                return free(o), json_fail(j, "an unpaired surrogate in a string");
            j->s += 6, u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
        }
        w += json_utf8_put(u, w);
    }
    *w = 0, j->s = p + 1, *out = o, *length = (size_t)(w - o);
    return 0;
}

static inline int json_emit(json_scanner *j, json_type type, const char *string, size_t length, double number) {
    j->v.type = type, j->v.string = string, j->v.length = length, j->v.number = number;
    return j->visit(j->user, &j->v) ? -1 : 0;
}

static inline int json_scan_value(json_scanner *j) {
    json_skip_space(j);
    if (j->s >= j->end) return json_fail(j, "the document ended where a value was expected");
    char c = *j->s;
    if (c == '{' || c == '[') {
        int depth = j->v.depth, rc = 0;
        if (depth >= JSON_SCAN_DEPTH) return json_fail(j, "nested too deep");
        char close = c == '{' ? '}' : ']';
        j->s++, json_skip_space(j);
        if (j->s < j->end && *j->s == close) return j->s++, 0;
        for (long i = 0;; i++) {
            char *key = NULL;
            size_t key_length;
            json_skip_space(j);
            if (c == '{') {
                if (j->s >= j->end || *j->s != '"') return json_fail(j, "a member name expected");
                if (json_string(j, &key, &key_length)) return -1;
                json_skip_space(j);
                if (j->s >= j->end || *j->s != ':') return free(key), json_fail(j, "':' expected after a member name");
                j->s++;
            }
            j->v.key[depth] = key, j->v.index[depth] = i, j->v.depth = depth + 1;
            rc = json_scan_value(j);
            j->v.depth = depth;
            free(key);
            if (rc) return rc;
            json_skip_space(j);
            if (j->s < j->end && *j->s == ',') { j->s++; continue; }
            if (j->s < j->end && *j->s == close) return j->s++, 0;
            return json_fail(j, c == '{' ? "',' or '}' expected" : "',' or ']' expected");
        }
    }
    if (c == '"') {
        char *str = NULL;
        size_t length;
        if (json_string(j, &str, &length)) return -1;
        int rc = json_emit(j, JSON_STRING, str, length, 0);
        free(str);
        return rc;
    }
    static const char *const words[3] = {"true", "false", "null"};
    for (int w = 0; w < 3; w++) {
        size_t n = strlen(words[w]);
        if ((size_t)(j->end - j->s) >= n && !memcmp(j->s, words[w], n)) return j->s += n, json_emit(j, (json_type)(JSON_TRUE + w), NULL, 0, 0);
    }
    /* a number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
    const char *p = j->s;
    char buf[64];
    if (p < j->end && *p == '-') p++;
    if (p >= j->end || *p < '0' || *p > '9') return json_fail(j, "a value expected");
    if (*p == '0') p++;
    else while (p < j->end && *p >= '0' && *p <= '9') p++;
    if (p < j->end && *p == '.') {
        if (++p >= j->end || *p < '0' || *p > '9') return json_fail(j, "a digit expected after '.'");
        while (p < j->end && *p >= '0' && *p <= '9') p++;
    }
    if (p < j->end && (*p == 'e' || *p == 'E')) {
        if (++p < j->end && (*p == '+' || *p == '-')) p++;
        if (p >= j->end || *p < '0' || *p > '9') return json_fail(j, "a digit expected in an exponent");
        while (p < j->end && *p >= '0' && *p <= '9') p++;
    }
    if ((size_t)(p - j->s) >= sizeof buf) return json_fail(j, "a number of more than 63 characters");
    memcpy(buf, j->s, (size_t)(p - j->s)), buf[p - j->s] = 0;
    j->s = p;
    return json_emit(j, JSON_NUMBER, NULL, 0, strtod(buf, NULL));
}

static inline int json_scan(const char *text, size_t length, json_visit visit, void *user, char *why, size_t why_size) {
    json_scanner j = {.s = text, .end = text + length, .start = text, .visit = visit, .user = user, .why = why, .why_size = why_size};
    if (why_size) why[0] = 0;
    if (json_scan_value(&j)) return -1;
    json_skip_space(&j);
    return j.s == j.end ? 0 : json_fail(&j, "text after the document");
}

/* The file at path (at most `most` bytes) scanned as json_scan does; -1 with why[] saying why where it
 * cannot be read whole */
/* The whole file at path into *text (malloc'd, NUL-terminated, *length bytes) if it holds at most `most`
 * bytes: 0; -1 when it cannot be read (why[]: the reason); -2 when it is larger (*length: its size) */
static inline int json_read_file(const char *path, long most, char **text, size_t *length, char *why, size_t why_size) {
    FILE *f = fopen(path, "rb");
    *text = NULL, *length = 0;
    if (!f) return snprintf(why, why_size, "%s", strerror(errno)), -1;
    long n = fseek(f, 0, SEEK_END) ? -1 : ftell(f);
    if (n > most) return fclose(f), *length = (size_t)n, -2;
    *text = n >= 0 ? malloc((size_t)n + 1) : NULL;
    int ok = *text && !fseek(f, 0, SEEK_SET) && fread(*text, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    if (!ok) return snprintf(why, why_size, "%s", *text ? "read failed" : n < 0 ? "cannot seek in it" : "out of memory"), free(*text), *text = NULL, -1;
    return (*text)[n] = 0, *length = (size_t)n, 0;
}

static inline int json_scan_file(const char *path, long most, json_visit visit, void *user, char *why, size_t why_size) {
    char *text;
    size_t n;
    int got = json_read_file(path, most, &text, &n, why, why_size);
    if (got == -2) snprintf(why, why_size, "cannot read it (%zu bytes, at most %ld)", n, most);
    int rc = got ? -1 : json_scan(text, n, visit, user, why, why_size);
    free(text);
    return rc;
}

#endif
