/* json_read.c — a small JSON reader for builds without cJSON (a GPU machine seldom has libcjson-dev):
 * the part of cJSON's interface the cluster loader uses (parse into a tree of values; object members
 * by key; arrays walked child by child), under cJSON's names inside this layer only, so that
 * planner/cluster.c reads a cluster file the same way in both builds. Strict RFC 8259 syntax;
 * nesting is bounded (no stack overflow on hostile input); an error gives the byte it stopped at. */
#include "planner_impl.h"
#ifndef PDDE_HAVE_CJSON

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { PJ_NULL, PJ_FALSE, PJ_TRUE, PJ_NUMBER, PJ_STRING, PJ_ARRAY, PJ_OBJECT };
enum { PJ_MAX_DEPTH = 64 };
#define PJ_FN static __attribute__((unused)) /* (a part compiled alone uses only some) */

typedef struct pdde_json_value {
    struct pdde_json_value *next, *child;
    int type;
    char *string;      /* the member's key in an object */
    char *valuestring; /* a string's value */
    double valuedouble;
} cJSON;

static const char *pj_error_at;

PJ_FN void cJSON_Delete(cJSON *v) {
    while (v) {
        cJSON *next = v->next;
        cJSON_Delete(v->child);
        free(v->string), free(v->valuestring), free(v);
        v = next;
    }
}

PJ_FN const char *pj_skip(const char *s) {
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    return s;
}

PJ_FN int pj_hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + (unsigned)d;
    }
    *out = v;
    return 0;
}

/* A string at s (its opening quote) into a new buffer (UTF-8); *end past its closing quote. */
PJ_FN char *pj_string(const char *s, const char **end) {
    size_t n = 0;
    const char *p = s + 1;
    for (; *p != '"'; p++, n++) { /* an upper bound of the decoded length */
        if ((unsigned char)*p < 0x20) return pj_error_at = p, NULL;
        if (*p == '\\' && !*++p) return pj_error_at = p, NULL;
    }
    char *out = malloc(n + 1), *o = out;
    if (!out) return pj_error_at = s, NULL;
    for (p = s + 1; *p != '"'; p++) {
        if (*p != '\\') { *o++ = *p; continue; }
        unsigned u;
        switch (*++p) {
        case '"': case '\\': case '/': *o++ = *p; break;
        case 'b': *o++ = '\b'; break;
        case 'f': *o++ = '\f'; break;
        case 'n': *o++ = '\n'; break;
        case 'r': *o++ = '\r'; break;
        case 't': *o++ = '\t'; break;
        case 'u':
            if (pj_hex4(p + 1, &u)) return free(out), pj_error_at = p, NULL;
            p += 4;
            if (u >= 0xd800 && u < 0xdc00) { /* a surrogate pair */
                unsigned lo;
                if (p[1] != '\\' || p[2] != 'u' || pj_hex4(p + 3, &lo) || lo < 0xdc00 || lo > 0xdfff)
                    return free(out), pj_error_at = p, NULL;
                u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00), p += 6;
            } else if (u >= 0xdc00 && u < 0xe000) return free(out), pj_error_at = p, NULL;
            /* (at most 4 bytes for the 6 or 12 characters read) */
            if (u < 0x80) *o++ = (char)u;
            else if (u < 0x800) *o++ = (char)(0xc0 | u >> 6), *o++ = (char)(0x80 | (u & 0x3f));
            else if (u < 0x10000) *o++ = (char)(0xe0 | u >> 12), *o++ = (char)(0x80 | ((u >> 6) & 0x3f)), *o++ = (char)(0x80 | (u & 0x3f));
            else *o++ = (char)(0xf0 | u >> 18), *o++ = (char)(0x80 | ((u >> 12) & 0x3f)), *o++ = (char)(0x80 | ((u >> 6) & 0x3f)),
                 *o++ = (char)(0x80 | (u & 0x3f));
            break;
        default: return free(out), pj_error_at = p, NULL;
        }
    }
    *o = 0;
    *end = p + 1;
    return out;
}

/* A number as JSON writes one (strtod alone would take hex, inf, leading '+' or '.'). */
PJ_FN int pj_number(const char *s, const char **end, double *out) {
    const char *p = s;
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
    else return -1;
    if (*p == '.') {
        if (!(*++p >= '0' && *p <= '9')) return -1;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (!(*p >= '0' && *p <= '9')) return -1;
        while (*p >= '0' && *p <= '9') p++;
    }
    char *e;
    *out = strtod(s, &e); /* (the C locale's decimal point: pdde never sets another) */
    if (e != p) return -1;
    *end = p;
    return 0;
}

PJ_FN cJSON *pj_value(const char *s, const char **end, int depth) {
    s = pj_skip(s);
    cJSON *v = calloc(1, sizeof *v);
    if (!v) return pj_error_at = s, NULL;
    if (*s == '{' || *s == '[') {
        int obj = *s == '{';
        char close = obj ? '}' : ']';
        v->type = obj ? PJ_OBJECT : PJ_ARRAY;
        if (depth >= PJ_MAX_DEPTH) return cJSON_Delete(v), pj_error_at = s, NULL;
        s = pj_skip(s + 1);
        cJSON **tail = &v->child;
        if (*s == close) return *end = s + 1, v;
        for (;;) {
            char *key = NULL;
            if (obj) {
                s = pj_skip(s);
                if (*s != '"' || !(key = pj_string(s, &s))) return cJSON_Delete(v), pj_error_at = pj_error_at ? pj_error_at : s, NULL;
                s = pj_skip(s);
                if (*s != ':') return free(key), cJSON_Delete(v), pj_error_at = s, NULL;
                s++;
            }
            cJSON *e = pj_value(s, &s, depth + 1);
            if (!e) return free(key), cJSON_Delete(v), NULL;
            e->string = key;
            *tail = e, tail = &e->next;
            s = pj_skip(s);
            if (*s == ',') { s++; continue; }
            if (*s == close) return *end = s + 1, v;
            return cJSON_Delete(v), pj_error_at = s, NULL;
        }
    }
    if (*s == '"') {
        v->type = PJ_STRING;
        if (!(v->valuestring = pj_string(s, end))) return cJSON_Delete(v), NULL;
        return v;
    }
    static const struct { const char *word; int type; } words[] = {{"null", PJ_NULL}, {"false", PJ_FALSE}, {"true", PJ_TRUE}};
    for (int i = 0; i < 3; i++)
        if (!strncmp(s, words[i].word, strlen(words[i].word))) return v->type = words[i].type, *end = s + strlen(words[i].word), v;
    v->type = PJ_NUMBER;
    if (pj_number(s, end, &v->valuedouble)) return cJSON_Delete(v), pj_error_at = s, NULL;
    return v;
}

/* The document in text (nothing but blanks after its value); NULL on a syntax error
 * (cJSON_GetErrorPtr: where). */
PJ_FN cJSON *cJSON_Parse(const char *text) {
    const char *end = text;
    pj_error_at = NULL;
    cJSON *v = pj_value(text, &end, 0);
    if (v && *pj_skip(end)) return cJSON_Delete(v), pj_error_at = pj_skip(end), NULL;
    if (!v && !pj_error_at) pj_error_at = text;
    return v;
}

PJ_FN const char *cJSON_GetErrorPtr(void) { return pj_error_at; }

PJ_FN cJSON *cJSON_GetObjectItemCaseSensitive(const cJSON *obj, const char *key) {
    if (!obj || obj->type != PJ_OBJECT) return NULL;
    for (cJSON *e = obj->child; e; e = e->next)
        if (e->string && !strcmp(e->string, key)) return e;
    return NULL;
}

PJ_FN int cJSON_GetArraySize(const cJSON *a) {
    int n = 0;
    for (const cJSON *e = a ? a->child : NULL; e; e = e->next) n++;
    return n;
}

PJ_FN cJSON *cJSON_GetArrayItem(const cJSON *a, int i) {
    cJSON *e = a ? a->child : NULL;
    while (e && i-- > 0) e = e->next;
    return i < 0 || !e ? e : NULL;
}

PJ_FN bool cJSON_IsArray(const cJSON *v) { return v && v->type == PJ_ARRAY; }
PJ_FN bool cJSON_IsObject(const cJSON *v) { return v && v->type == PJ_OBJECT; }
PJ_FN bool cJSON_IsNumber(const cJSON *v) { return v && v->type == PJ_NUMBER; }
PJ_FN bool cJSON_IsString(const cJSON *v) { return v && v->type == PJ_STRING; }
PJ_FN bool cJSON_IsBool(const cJSON *v) { return v && (v->type == PJ_TRUE || v->type == PJ_FALSE); }
PJ_FN bool cJSON_IsTrue(const cJSON *v) { return v && v->type == PJ_TRUE; }

#define cJSON_ArrayForEach(e, a) for ((e) = (a) ? (a)->child : NULL; (e); (e) = (e)->next)

#endif
