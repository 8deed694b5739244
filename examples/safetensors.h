/* safetensors.h — Demonstrates how to read and write Hugging Face's safetensors files, the format model
 * hubs publish weights in: an 8-byte little-endian header length N, N bytes of JSON naming each tensor's
 * dtype, shape and [begin, end) byte offsets in the data that follows. A model saved in several files
 * (model-00001-of-00002.safetensors, ...) has model.safetensors.index.json mapping names to files.
 *
 *   st_open(path, &model, why, n)    a .safetensors file, or a directory holding model.safetensors or the
 *                                    index and its files; 0, or -1 with why[] naming the file and field
 *   st_find(&model, name)            a tensor by name, or NULL
 *   st_read_f32(&model, t, dst, ..)  its values as f32 (F32, BF16 and F16 are read)
 *   st_write_header(f, n, names, ndims, shapes, dtype)  a single file of F32, BF16 or F16 tensors: the
 *                                    header, then the caller writes each tensor's values in the order given
 *   st_close(&model)
 *
 * Every offset is checked against the file's size and its tensor's dtype and shape before anything is
 * read: a truncated or hostile file is refused, naming the tensor. (Offsets past 2 GiB seek with long,
 * 64-bit on the platforms pdde builds for.) */
#ifndef PDDE_SAFETENSORS_H
#define PDDE_SAFETENSORS_H
#include "pdde.h"
#include "json_scan.h"
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { ST_MAX_DIMS = 8, ST_MAX_HEADER = 100 << 20 /* (the format's own limit) */ };
typedef enum { ST_F32, ST_BF16, ST_F16, ST_OTHER } st_dtype;
static const char *const st_dtype_names[ST_OTHER] = {"F32", "BF16", "F16"}; /* (as the header writes them) */

typedef struct {
    char *name;
    char dtype_name[16];
    st_dtype dtype;
    int ndim, file; /* file: which of the model's files holds it */
    long member;    /* its place in that file's header */
    int64_t shape[ST_MAX_DIMS], begin, end; /* [begin, end): bytes of the file's data section */
} st_tensor;

typedef struct {
    int n_files, n;
    char **path;      /* [n_files] */
    int64_t *data_at; /* [n_files]: where each file's data section starts (8 + header length) */
    st_tensor *t;     /* [n] */
} st_model;

/* Its element count; 2^60 for any past it (no file holds that many: its bytes then disagree) */
static inline int64_t st_numel(const st_tensor *t) {
    int64_t n = 1, most = INT64_C(1) << 60;
    for (int i = 0; i < t->ndim; i++)
        if (!t->shape[i]) return 0;
    for (int i = 0; i < t->ndim; i++) n = n > most / t->shape[i] ? most : n * t->shape[i];
    return n;
}

static inline void st_close(st_model *m) {
    for (int i = 0; i < m->n; i++) free(m->t[i].name);
    for (int i = 0; i < m->n_files; i++) free(m->path[i]);
    free(m->t), free(m->path), free(m->data_at);
    memset(m, 0, sizeof *m);
}

static inline const st_tensor *st_find(const st_model *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->t[i].name, name)) return &m->t[i];
    return NULL;
}

/* why[] = dir + file + ": " + why[] (cut to why_size) */
static inline void st_prefix(char *why, size_t why_size, const char *dir, const char *file) {
    size_t d = strlen(dir), f = strlen(file), p = d + f + 2, n = strlen(why);
    if (p >= why_size) return;
    if (n + p >= why_size) n = why_size - p - 1;
    memmove(why + p, why, n), memcpy(why, dir, d), memcpy(why + d, file, f), memcpy(why + d + f, ": ", 2);
    why[p + n] = 0;
}

/* The header walk: a member of the top object is a tensor (or __metadata__, skipped); its fields fill
 * m->t[m->n - 1] */
typedef struct {
    st_model *m;
    int file;
    char *why;
    size_t why_size;
} st_header_walk;

static inline int st_header_value(void *user, const json_value *v) {
    st_header_walk *w = user;
    st_model *m = w->m;
    if (!v->key[0]) return snprintf(w->why, w->why_size, "the header is not a JSON object"), 1;
    if (!strcmp(v->key[0], "__metadata__")) return 0;
    st_tensor *t = m->n ? &m->t[m->n - 1] : NULL;
    if (!t || t->file != w->file || t->member != v->index[0]) { /* (a tensor's fields come together: its first one) */
        if (st_find(m, v->key[0])) return snprintf(w->why, w->why_size, "tensor %s: named twice", v->key[0]), 1;
        st_tensor *more = realloc(m->t, (size_t)(m->n + 1) * sizeof *more);
        if (!more || !(more[m->n].name = json_strdup(v->key[0]))) return m->t = more ? more : m->t, snprintf(w->why, w->why_size, "out of memory"), 1;
        m->t = more, t = &m->t[m->n++];
        *t = (st_tensor){.name = t->name, .file = w->file, .member = v->index[0], .ndim = -1, .begin = -1, .end = -1};
    }
    const char *field = v->depth >= 2 && v->key[1] ? v->key[1] : "(an object of dtype, shape and data_offsets expected)";
    if (v->depth == 2 && !strcmp(field, "dtype") && v->type == JSON_STRING) {
        snprintf(t->dtype_name, sizeof t->dtype_name, "%s", v->string);
        t->dtype = ST_OTHER;
        for (int k = 0; k < ST_OTHER; k++)
            if (!strcmp(v->string, st_dtype_names[k])) t->dtype = (st_dtype)k;
        return 0;
    }
    int is_int = v->type == JSON_NUMBER && v->number >= 0 && v->number <= (double)(INT64_C(1) << 53) && v->number == (double)(int64_t)v->number;
    if (v->depth == 3 && !strcmp(field, "shape") && !v->key[2] && is_int && v->index[2] < ST_MAX_DIMS) {
        t->shape[v->index[2]] = (int64_t)v->number, t->ndim = (int)v->index[2] + 1;
        return 0;
    }
    if (v->depth == 3 && !strcmp(field, "data_offsets") && !v->key[2] && is_int && v->index[2] < 2) {
        *(v->index[2] ? &t->end : &t->begin) = (int64_t)v->number;
        return 0;
    }
    return snprintf(w->why, w->why_size, "tensor %s: field %s: a dtype string, a shape of at most %d sizes, or two data_offsets expected",
                    v->key[0], field, ST_MAX_DIMS), 1;
}

/* Reads the header of one file into m (its tensors appended, as file number m->n_files) */
static inline int st_open_file(const char *path, st_model *m, char *why, size_t why_size) {
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(why, why_size, "%s: %s", path, strerror(errno)), -1;
    unsigned char len8[8];
    uint64_t n = 0;
    int64_t size = fseek(f, 0, SEEK_END) ? -1 : (int64_t)ftell(f);
    int ok = size >= 8 && !fseek(f, 0, SEEK_SET) && fread(len8, 1, 8, f) == 8;
    for (int i = 7; ok && i >= 0; i--) n = n << 8 | len8[i];
    if (!ok || n < 2 || n > ST_MAX_HEADER || (int64_t)n > size - 8) {
        fclose(f);
        return snprintf(why, why_size, "%s: %lld bytes, header length %llu: not a safetensors file (8 bytes of header length, a JSON header "
                        "of at most %d MiB within the file)", path, (long long)size, (unsigned long long)n, ST_MAX_HEADER >> 20), -1;
    }
    char *text = malloc((size_t)n), **paths = realloc(m->path, (size_t)(m->n_files + 1) * sizeof *paths);
    int64_t *data_at = paths ? realloc(m->data_at, (size_t)(m->n_files + 1) * sizeof *data_at) : NULL;
    if (paths) m->path = paths;
    if (data_at) m->data_at = data_at;
    ok = text && paths && data_at && (m->path[m->n_files] = json_strdup(path));
    if (ok && fread(text, 1, (size_t)n, f) != (size_t)n) ok = 0, snprintf(why, why_size, "%s: reading its header: %s", path, strerror(errno));
    else if (!ok) snprintf(why, why_size, "out of memory");
    fclose(f);
    int file = m->n_files, first = m->n;
    if (ok) m->data_at[m->n_files++] = 8 + (int64_t)n;
    st_header_walk w = {m, file, why, why_size};
    char syntax[160];
    if (ok && json_scan(text, (size_t)n, st_header_value, &w, syntax, sizeof syntax)) {
        if (syntax[0]) snprintf(why, why_size, "%s: its header: %s", path, syntax);
        else st_prefix(why, why_size, path, ""); /* (the walk's own why) */
        ok = 0;
    }
    free(text);
    static const int64_t bytes[3] = {4, 2, 2};
    int64_t data = size - (ok ? m->data_at[file] : 0);
    for (int i = first; ok && i < m->n; i++) {
        const st_tensor *t = &m->t[i];
        int64_t numel = st_numel(t);
        if (!t->dtype_name[0] || t->ndim < 0 || t->begin < 0 || t->end < 0)
            ok = 0, snprintf(why, why_size, "%s: tensor %s lacks its %s", path, t->name, !t->dtype_name[0] ? "dtype" : t->ndim < 0 ? "shape" : "data_offsets");
        else if (t->end < t->begin || t->end > data)
            ok = 0, snprintf(why, why_size, "%s: tensor %s: data_offsets [%lld, %lld] outside the file's %lld bytes of data", path, t->name,
                             (long long)t->begin, (long long)t->end, (long long)data);
        else if (t->dtype != ST_OTHER && t->end - t->begin != numel * bytes[t->dtype])
            ok = 0, snprintf(why, why_size, "%s: tensor %s: %lld bytes for %lld values of %s", path, t->name, (long long)(t->end - t->begin),
                             (long long)numel, t->dtype_name);
    }
    return ok ? 0 : -1;
}

/* The files of the index dir/model.safetensors.index.json: each distinct value of its weight_map */
typedef struct {
    const char *dir;
    st_model *m;
    char *why;
    size_t why_size;
} st_index_walk;

static inline int st_index_value(void *user, const json_value *v) {
    st_index_walk *w = user;
    if (v->depth != 2 || strcmp(v->key[0], "weight_map")) return 0;
    if (v->type != JSON_STRING || strchr(v->string, '/') || !strcmp(v->string, "..") || !v->string[0])
        return snprintf(w->why, w->why_size, "weight_map[%s]: a file name in the directory expected", v->key[1]), 1;
    for (int i = 0; i < w->m->n_files; i++) {
        const char *base = strrchr(w->m->path[i], '/');
        if (!strcmp(base ? base + 1 : w->m->path[i], v->string)) return 0;
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", w->dir, v->string);
    return st_open_file(path, w->m, w->why, w->why_size) ? 1 : 0;
}

static inline int st_open(const char *path, st_model *m, char *why, size_t why_size) {
    memset(m, 0, sizeof *m);
    struct stat sb;
    if (stat(path, &sb)) return snprintf(why, why_size, "%s: %s", path, strerror(errno)), -1;
    if (!S_ISDIR(sb.st_mode)) return st_open_file(path, m, why, why_size) ? (st_close(m), -1) : 0;
    char file[4200];
    snprintf(file, sizeof file, "%s/model.safetensors", path);
    if (!stat(file, &sb)) return st_open_file(file, m, why, why_size) ? (st_close(m), -1) : 0;
    snprintf(file, sizeof file, "%s/model.safetensors.index.json", path);
    if (stat(file, &sb)) return snprintf(why, why_size, "%s: neither model.safetensors nor model.safetensors.index.json there", path), -1;
    st_index_walk w = {path, m, why, why_size};
    int rc = json_scan_file(file, ST_MAX_HEADER, st_index_value, &w, why, why_size);
    if (rc && !strstr(why, ".safetensors:")) st_prefix(why, why_size, path, "/model.safetensors.index.json"); /* (a shard's own why names it) */
    if (!rc && !m->n_files) rc = -1, snprintf(why, why_size, "%s/model.safetensors.index.json: its weight_map names no file", path);
    return rc ? (st_close(m), -1) : 0;
}

/* Tensor t's values as f32 into dst (st_numel(t) of them), or -1 with why[] */
static inline int st_read_f32(const st_model *m, const st_tensor *t, float *dst, char *why, size_t why_size) {
    if (t->dtype == ST_OTHER)
        return snprintf(why, why_size, "%s: tensor %s is %s: F32, BF16 or F16 expected", m->path[t->file], t->name, t->dtype_name), -1;
    int64_t count = st_numel(t), es = t->dtype == ST_F32 ? 4 : 2;
    uint16_t *half = (uint16_t *)(dst + count) - count; /* (16-bit values: read into the upper half, widened from the front) */
    errno = 0;
    FILE *f = fopen(m->path[t->file], "rb");
    int ok = f && !fseek(f, (long)(m->data_at[t->file] + t->begin), SEEK_SET) &&
             fread(es == 4 ? (void *)dst : (void *)half, (size_t)es, (size_t)count, f) == (size_t)count;
    if (f) fclose(f);
    if (!ok) return snprintf(why, why_size, "%s: reading tensor %s: %s", m->path[t->file], t->name, errno ? strerror(errno) : "the file ended"), -1;
    for (int64_t i = 0; i < count && es == 2; i++) dst[i] = t->dtype == ST_BF16 ? pdde_bf16_to_f32(half[i]) : pdde_f16_to_f32(half[i]);
    return 0;
}

/* Writes the header of a safetensors file of n tensors of one dtype (F32, BF16 or F16; names[k] of shapes[k][0 ..
 * ndims[k]), laid out in that order) to f, with metadata "format": "pt"; the caller then writes each tensor's values */
static inline int st_write_header(FILE *f, int n, const char *const *names, const int *ndims, const int64_t (*shapes)[ST_MAX_DIMS], st_dtype dtype) {
    if (dtype >= ST_OTHER) return -1;
    int64_t size = dtype == ST_F32 ? 4 : 2;
    size_t cap = 256 + (size_t)n * 160, len = 0;
    for (int k = 0; k < n; k++) cap += strlen(names[k]);
    char *h = malloc(cap + 8);
    if (!h) return -1;
    len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        int64_t numel = 1;
        len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[", names[k], st_dtype_names[dtype]);
        for (int d = 0; d < ndims[k]; d++) numel *= shapes[k][d], len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "", (long long)shapes[k][d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%lld,%lld]}", (long long)at, (long long)(at + size * numel));
        at += size * numel;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8) h[len++] = ' '; /* (the data section starts 8-byte aligned, as Hugging Face's writer pads) */
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)len >> (8 * i));
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(h, 1, len, f) == len;
    free(h);
    return ok ? 0 : -1;
}

#endif
