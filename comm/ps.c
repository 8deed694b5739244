/* comm/ps.c — the parameter server: sparse tables keyed by 64-bit ids, a server loop that serves
 * them to worker ranks over point-to-point messages of a world communicator (sync, async with
 * bounded staleness, geo), and the worker's client. Knows nothing of graphs: rows are float arrays.
 * Above the rest of comm/: it calls only the public communicator calls (pdde.h) and base.c's CRC-32. */

#ifndef PDDE_COMM_PS_C
#define PDDE_COMM_PS_C

#include "../backends/backend_impl.h"
#include "../backends/deadline.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------------
 * Hashing */

static uint64_t ps_mix(uint64_t x) { /* splitmix64's finaliser */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int pdde_ps_shard_of(uint64_t id, int n_servers) {
    return n_servers > 1 ? (int)(ps_mix(id ^ 0x5bd1e995ull) % (uint64_t)n_servers) : 0;
}

/* A new row: normal(0, std) values from a hash of (seed, id, column pair), so every shard and every
 * run creates the same row; Box-Muller gives two values per pair of 24-bit uniforms, in float (a
 * recommender creates rows all the time: in double this was most of a new row's cost). */
static void ps_init_row(float *v, int dim, float std, uint64_t seed, uint64_t id) {
    uint64_t h = seed ^ ps_mix(id);
    for (int c = 0; c < dim; c += 2) {
        uint64_t a = ps_mix(h ^ ((uint64_t)c << 1));
        float u1 = ((float)(a >> 40) + 0.5f) * 0x1.0p-24f, u2 = (float)(a & 0xffffff) * 0x1.0p-24f;
        float r = std * sqrtf(-2.0f * logf(u1)), angle = 6.28318531f * u2;
        v[c] = r * cosf(angle);
        if (c + 1 < dim) v[c + 1] = r * sinf(angle);
    }
}

/* ------------------------------------------------------------------------------------------------
 * ps_map: u64 -> u32, open addressing with linear probing and backward-shift deletion. */

#define PS_EMPTY UINT32_MAX

typedef struct {
    uint64_t *keys;
    uint32_t *vals;  /* PS_EMPTY marks a free slot */
    size_t cap, n;   /* cap: a power of two (0 before the first insert) */
} ps_map;

static void ps_map_free(ps_map *m) { free(m->keys), free(m->vals), memset(m, 0, sizeof *m); }

static size_t ps_map_slot(const ps_map *m, uint64_t key) {
    size_t mask = m->cap - 1, i = (size_t)ps_mix(key) & mask;
    while (m->vals[i] != PS_EMPTY && m->keys[i] != key) i = (i + 1) & mask;
    return i;
}

static uint32_t *ps_map_find(const ps_map *m, uint64_t key) {
    if (!m->cap) return NULL;
    size_t i = ps_map_slot(m, key);
    return m->vals[i] == PS_EMPTY ? NULL : &m->vals[i];
}

static bool ps_map_grow(ps_map *m) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    ps_map old = *m;
    m->keys = malloc(cap * sizeof *m->keys), m->vals = malloc(cap * sizeof *m->vals);
    if (!m->keys || !m->vals) { free(m->keys), free(m->vals); *m = old; return false; }
    memset(m->vals, 0xff, cap * sizeof *m->vals);
    m->cap = cap;
    for (size_t i = 0; i < old.cap; i++)
        if (old.vals[i] != PS_EMPTY) {
            size_t j = ps_map_slot(m, old.keys[i]);
            m->keys[j] = old.keys[i], m->vals[j] = old.vals[i];
        }
    free(old.keys), free(old.vals);
    return true;
}

/* Inserts key with val (key absent); NULL when out of memory. */
static uint32_t *ps_map_insert(ps_map *m, uint64_t key, uint32_t val) {
    if ((m->n + 1) * 10 > m->cap * 7 && !ps_map_grow(m)) return NULL;
    size_t i = ps_map_slot(m, key);
    m->keys[i] = key, m->vals[i] = val, m->n++;
    return &m->vals[i];
}

/* key's value, or val inserted for it where it is absent (*added says which): one probe for both; NULL when out
 * of memory. */
static uint32_t *ps_map_find_or_insert(ps_map *m, uint64_t key, uint32_t val, bool *added) {
    if ((m->n + 1) * 10 > m->cap * 7 && !ps_map_grow(m)) return NULL;
    size_t i = ps_map_slot(m, key);
    if ((*added = m->vals[i] == PS_EMPTY)) m->keys[i] = key, m->vals[i] = val, m->n++;
    return &m->vals[i];
}

static void ps_map_remove(ps_map *m, uint64_t key) {
    if (!m->cap) return;
    size_t mask = m->cap - 1, i = ps_map_slot(m, key);
    if (m->vals[i] == PS_EMPTY) return;
    /* backward shift: pull later entries of the probe run into the hole unless that would move an
     * entry before its home slot */
    for (size_t j = (i + 1) & mask; m->vals[j] != PS_EMPTY; j = (j + 1) & mask) {
        size_t home = (size_t)ps_mix(m->keys[j]) & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j], m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->vals[i] = PS_EMPTY;
    m->n--;
}

/* Fetches key's home slot into the cache: a lookup a few keys later finds it there (a large table's probes
 * are cache misses; prefetched in turn they overlap). */
static void ps_map_prefetch(const ps_map *m, uint64_t key) {
    if (!m->cap) return;
    size_t i = (size_t)ps_mix(key) & (m->cap - 1);
    __builtin_prefetch(&m->keys[i]), __builtin_prefetch(&m->vals[i]);
}

static size_t ps_map_bytes(const ps_map *m) { return m->cap * (sizeof *m->keys + sizeof *m->vals); }

/* ------------------------------------------------------------------------------------------------
 * Tables. A row is [u64 id][u32 last step][u32 optimizer step][dim values][state]. The rows are spread
 * over PS_STRIPES stripes by a hash of the id, each with its own index, admission counts, rows and
 * reader-writer lock, so that threads pull and push at once: pulls of rows that exist share a stripe;
 * a push, or a pull that creates rows, holds it alone. A call takes one stripe at a time, so a pull
 * reads each row whole and a push updates row by row (a pull beside it may see some of its rows
 * updated and others not yet, as an asynchronous server's pull may). A stripe stores its rows in
 * chunks of PS_CHUNK rows: growth never copies rows, and the table holds at most a chunk a stripe
 * more than its rows. */

#define PS_STRIPES 16
#define PS_CHUNK 256
#define PS_ROW_META 16

typedef struct {
    pthread_rwlock_t lock;
    ps_map index;           /* id -> row of this stripe */
    ps_map seen;            /* admission: id -> times pulled, for ids not admitted yet */
    ps_map first;           /* a push's scratch: id -> its first position (kept: a push allocates nothing) */
    float *sum;             /* a push's scratch: gradients of repeated ids summed */
    size_t sum_cap;
    char **chunks;
    size_t n_chunks, chunk_cap;
    int64_t rows, evicted;
} ps_stripe;

/* A call's grouping of its ids by stripe; kept in a free list so a call allocates nothing once warm. */
typedef struct ps_scratch {
    struct ps_scratch *next;
    uint32_t *order;        /* positions of the call's ids, stripe by stripe */
    uint32_t *row;          /* the row of order[j] in its stripe (PS_EMPTY: none) */
    uint8_t *stripe;        /* each id's stripe */
    size_t cap;
} ps_scratch;

struct pdde_ps_table {
    pdde_context *ctx;
    pdde_ps_table_params p;
    int state;              /* state floats per row: 0 (SGD), dim (Adagrad), 2 dim (Adam) */
    size_t row_bytes;
    _Atomic int64_t step;   /* pushes so far (a row's last step is stamped from it) */
    ps_stripe s[PS_STRIPES];
    pthread_mutex_t scratch_lock;
    ps_scratch *scratch;
};

static int ps_stripe_of(uint64_t id) { /* (a hash of its own: a server's shard would otherwise fill one stripe) */
    return (int)(ps_mix(id ^ 0x2545f4914f6cdd1dull) % PS_STRIPES);
}
static char *ps_row(const pdde_ps_table *t, const ps_stripe *s, uint32_t r) {
    return s->chunks[r / PS_CHUNK] + (size_t)(r % PS_CHUNK) * t->row_bytes;
}
static float *ps_row_vals(char *row) { return (float *)(row + PS_ROW_META); }
static uint64_t ps_row_id(const char *row) { uint64_t id; memcpy(&id, row, 8); return id; }
/* A row's last step: stamped by pulls that share the stripe, hence atomic. */
static void ps_row_stamp(char *row, int64_t step) { __atomic_store_n((uint32_t *)(void *)(row + 8), (uint32_t)step, __ATOMIC_RELAXED); }
static uint32_t ps_row_last(char *row) { return __atomic_load_n((uint32_t *)(void *)(row + 8), __ATOMIC_RELAXED); }
static int64_t ps_step(const pdde_ps_table *t) { return atomic_load_explicit(&((pdde_ps_table *)t)->step, memory_order_relaxed); }
/* (const calls lock too: the locks are not the table's contents) */
static void ps_rdlock(const ps_stripe *s) { pthread_rwlock_rdlock(&((ps_stripe *)s)->lock); }
static void ps_wrlock(const ps_stripe *s) { pthread_rwlock_wrlock(&((ps_stripe *)s)->lock); }
static void ps_unlock(const ps_stripe *s) { pthread_rwlock_unlock(&((ps_stripe *)s)->lock); }

pdde_status pdde_ps_table_init(pdde_context *ctx, const pdde_ps_table_params *p, pdde_ps_table **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_ps_table_init: no out");
    *out = NULL;
    if (!p || p->dim <= 0 || p->dim > (1 << 20))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "ps table: dim %d must be in [1, 2^20]", p ? p->dim : 0);
    if ((unsigned)p->optimizer > PDDE_PS_ADAM || p->admit_after < 0 || p->evict_after < 0)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "ps table: optimizer %d, admit_after %d or evict_after %lld out of range",
                          (int)p->optimizer, p->admit_after, (long long)p->evict_after);
    pdde_ps_table *t = calloc(1, sizeof *t);
    if (!t) return pdde_error(ctx, PDDE_ERR_OOM, "ps table: out of memory");
    t->ctx = ctx;
    t->p = *p;
    if (t->p.lr == 0) t->p.lr = 0.01f;
    if (t->p.beta1 == 0) t->p.beta1 = 0.9f;
    if (t->p.beta2 == 0) t->p.beta2 = 0.999f;
    if (t->p.eps == 0) t->p.eps = 1e-8f;
    t->state = p->optimizer == PDDE_PS_SGD ? 0 : p->optimizer == PDDE_PS_ADAGRAD ? p->dim : 2 * p->dim;
    t->row_bytes = PS_ROW_META + (size_t)(p->dim + t->state) * sizeof(float);
    atomic_init(&t->step, 0);
    for (int k = 0; k < PS_STRIPES; k++) pthread_rwlock_init(&t->s[k].lock, NULL);
    pthread_mutex_init(&t->scratch_lock, NULL);
    *out = t;
    return PDDE_OK;
}

static void ps_stripe_clear(ps_stripe *s) {
    for (size_t i = 0; i < s->n_chunks; i++) free(s->chunks[i]);
    free(s->chunks);
    s->chunks = NULL, s->n_chunks = s->chunk_cap = 0;
    ps_map_free(&s->index), ps_map_free(&s->seen), ps_map_free(&s->first);
    free(s->sum), s->sum = NULL, s->sum_cap = 0;
    s->rows = 0;
}

void pdde_ps_table_free(pdde_ps_table *t) {
    if (!t) return;
    for (int k = 0; k < PS_STRIPES; k++) ps_stripe_clear(&t->s[k]), pthread_rwlock_destroy(&t->s[k].lock);
    for (ps_scratch *sc = t->scratch, *next; sc; sc = next) next = sc->next, free(sc->order), free(sc->row), free(sc->stripe), free(sc);
    pthread_mutex_destroy(&t->scratch_lock);
    free(t);
}

static void ps_scratch_put(pdde_ps_table *t, ps_scratch *sc) {
    pthread_mutex_lock(&t->scratch_lock);
    sc->next = t->scratch, t->scratch = sc;
    pthread_mutex_unlock(&t->scratch_lock);
}

/* A scratch with ids[0..n) grouped by stripe: order[first[k] .. first[k + 1]) are the positions of
 * stripe k's ids, in their order. NULL when out of memory. */
static ps_scratch *ps_group(pdde_ps_table *t, size_t n, const uint64_t *ids, size_t first[PS_STRIPES + 1]) {
    if (n >= UINT32_MAX) return NULL;
    pthread_mutex_lock(&t->scratch_lock);
    ps_scratch *sc = t->scratch;
    if (sc) t->scratch = sc->next;
    pthread_mutex_unlock(&t->scratch_lock);
    if (!sc && !(sc = calloc(1, sizeof *sc))) return NULL;
    if (n > sc->cap) {
        size_t cap = n < 1024 ? 1024 : n;
        uint32_t *o = realloc(sc->order, cap * sizeof *o), *r = o ? realloc(sc->row, cap * sizeof *r) : NULL;
        if (o) sc->order = o;
        if (r) sc->row = r;
        uint8_t *k = r ? realloc(sc->stripe, cap) : NULL;
        if (!k) { ps_scratch_put(t, sc); return NULL; }
        sc->stripe = k, sc->cap = cap;
    }
    size_t pos[PS_STRIPES] = {0};
    for (size_t i = 0; i < n; i++) pos[sc->stripe[i] = (uint8_t)ps_stripe_of(ids[i])]++;
    first[0] = 0;
    for (int k = 0; k < PS_STRIPES; k++) first[k + 1] = first[k] + pos[k], pos[k] = first[k];
    for (size_t i = 0; i < n; i++) sc->order[pos[sc->stripe[i]]++] = (uint32_t)i;
    return sc;
}

/* A new row for id in stripe s (index entry included; the caller holds s alone); NULL when out of memory. */
static char *ps_new_row(pdde_ps_table *t, ps_stripe *s, uint64_t id) {
    if (s->rows >= (int64_t)UINT32_MAX - 1) return NULL;
    uint32_t r = (uint32_t)s->rows;
    if (r / PS_CHUNK >= s->n_chunks) {
        if (s->n_chunks == s->chunk_cap) {
            size_t cap = s->chunk_cap ? 2 * s->chunk_cap : 16;
            char **c = realloc(s->chunks, cap * sizeof *c);
            if (!c) return NULL;
            s->chunks = c, s->chunk_cap = cap;
        }
        if (!(s->chunks[s->n_chunks] = malloc(PS_CHUNK * t->row_bytes))) return NULL;
        s->n_chunks++;
    }
    if (!ps_map_insert(&s->index, id, r)) return NULL;
    s->rows++;
    char *row = ps_row(t, s, r);
    uint32_t meta[2] = {(uint32_t)ps_step(t), 0};
    memcpy(row, &id, 8), memcpy(row + 8, meta, 8);
    float *v = ps_row_vals(row);
    if (t->p.init_std > 0) ps_init_row(v, t->p.dim, t->p.init_std, t->p.seed, id);
    else memset(v, 0, (size_t)t->p.dim * sizeof(float));
    memset(v + t->p.dim, 0, (size_t)t->state * sizeof(float));
    return row;
}

/* The row of id in stripe s (the caller holds it alone), created if admitted (count: this touch
 * counts towards admission). NULL with *oom false: not admitted. */
static char *ps_touch(pdde_ps_table *t, ps_stripe *s, uint64_t id, bool count, bool *oom) {
    *oom = false;
    uint32_t *r = ps_map_find(&s->index, id);
    char *row;
    if (r) row = ps_row(t, s, *r);
    else {
        if (t->p.admit_after > 1) {
            if (!count) return NULL;
            uint32_t *seen = ps_map_find(&s->seen, id);
            if (!seen && !(seen = ps_map_insert(&s->seen, id, 0))) { *oom = true; return NULL; }
            if (++*seen < (uint32_t)t->p.admit_after) return NULL;
            ps_map_remove(&s->seen, id);
        }
        if (!(row = ps_new_row(t, s, id))) { *oom = true; return NULL; }
    }
    ps_row_stamp(row, ps_step(t));
    return row;
}

/* Ids looked up ahead of their use, their index slots and rows prefetched: the cache misses of a table
 * larger than the caches overlap instead of coming one after another. */
#define PS_AHEAD 8

/* The rows of ids[pos[0..m)] in stripe s (the caller holds it): row[j], PS_EMPTY where there is none. */
static void ps_find_rows(const ps_stripe *s, const uint64_t *ids, const uint32_t *pos, size_t m, uint32_t *row) {
    for (size_t j = 0; j < m; j++) {
        if (j + PS_AHEAD < m) ps_map_prefetch(&s->index, ids[pos[j + PS_AHEAD]]);
        const uint32_t *r = ps_map_find(&s->index, ids[pos[j]]);
        row[j] = r ? *r : PS_EMPTY;
    }
}

/* Fetches row r of stripe s into the cache (PS_EMPTY: nothing). */
static void ps_row_prefetch(const pdde_ps_table *t, const ps_stripe *s, uint32_t r) {
    if (r == PS_EMPTY) return;
    const char *row = ps_row(t, s, r);
    for (size_t b = 0; b < t->row_bytes; b += 64) __builtin_prefetch(row + b, 1);
}

static pdde_status ps_oom(const pdde_ps_table *t, const ps_stripe *s) {
    return pdde_error(t->ctx, PDDE_ERR_OOM, "ps table: out of memory at %lld rows of a stripe (of %d)", (long long)s->rows, PS_STRIPES);
}

pdde_status pdde_ps_table_pull(pdde_ps_table *t, size_t n, const uint64_t *ids, float *out) {
    if (!t || (n && (!ids || !out))) return pdde_error(t ? t->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_table_pull: no %s", !t ? "table" : !ids ? "ids" : "out");
    size_t first[PS_STRIPES + 1], C = (size_t)t->p.dim;
    ps_scratch *sc = ps_group(t, n, ids, first);
    if (!sc) return pdde_error(t->ctx, PDDE_ERR_OOM, "ps table: out of memory (a pull of %zu ids)", n);
    pdde_status st = PDDE_OK;
    for (int k = 0; k < PS_STRIPES && !st; k++) {
        ps_stripe *s = &t->s[k];
        size_t miss = first[k], end = first[k + 1];
        int64_t step = ps_step(t);
        ps_rdlock(s);
        ps_find_rows(s, ids, sc->order + first[k], end - first[k], sc->row + first[k]);
        for (size_t j = first[k]; j < end; j++) {
            if (j + PS_AHEAD < end) ps_row_prefetch(t, s, sc->row[j + PS_AHEAD]);
            uint32_t i = sc->order[j];
            if (sc->row[j] == PS_EMPTY) { sc->order[miss++] = i; continue; } /* (miss <= j: the misses move to the front) */
            char *row = ps_row(t, s, sc->row[j]);
            ps_row_stamp(row, step);
            memcpy(out + i * C, ps_row_vals(row), C * sizeof(float));
        }
        ps_unlock(s);
        if (miss == first[k]) continue;
        /* ids without a row: created, or counted towards admission, holding the stripe alone */
        ps_wrlock(s);
        for (size_t j = first[k]; j < miss && !st; j++) {
            uint32_t i = sc->order[j];
            bool oom;
            char *row = ps_touch(t, s, ids[i], true, &oom);
            if (oom) st = ps_oom(t, s);
            else if (row) memcpy(out + i * C, ps_row_vals(row), C * sizeof(float));
            else memset(out + i * C, 0, C * sizeof(float));
        }
        ps_unlock(s);
    }
    ps_scratch_put(t, sc);
    return st;
}

pdde_status pdde_ps_table_get(const pdde_ps_table *t, uint64_t id, float *out) {
    if (!t || !out) return pdde_error(t ? t->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_table_get: no %s", t ? "out" : "table");
    const ps_stripe *s = &t->s[ps_stripe_of(id)];
    ps_rdlock(s);
    uint32_t *r = ps_map_find(&s->index, id);
    if (r) memcpy(out, ps_row_vals(ps_row(t, s, *r)), (size_t)t->p.dim * sizeof(float));
    ps_unlock(s);
    return r ? PDDE_OK : PDDE_ERR_NOT_FOUND;
}

/* Drops stripe s's rows untouched for evict_after steps at step (the caller holds s alone): the
 * stripe's last row moves into each hole. */
static void ps_evict(pdde_ps_table *t, ps_stripe *s, int64_t step) {
    for (int64_t i = 0; i < s->rows;) {
        char *row = ps_row(t, s, (uint32_t)i);
        if ((int64_t)(uint32_t)step - (int64_t)ps_row_last(row) < t->p.evict_after) { i++; continue; }
        ps_map_remove(&s->index, ps_row_id(row));
        int64_t end = --s->rows;
        if (i != end) {
            char *tail = ps_row(t, s, (uint32_t)end);
            memcpy(row, tail, t->row_bytes);
            *ps_map_find(&s->index, ps_row_id(row)) = (uint32_t)i;
        }
        s->evicted++;
    }
    while (s->n_chunks > ((size_t)s->rows + PS_CHUNK - 1) / PS_CHUNK) free(s->chunks[--s->n_chunks]);
}

static void ps_end_step(pdde_ps_table *t) {
    int64_t step = atomic_fetch_add_explicit(&t->step, 1, memory_order_relaxed) + 1;
    int64_t every = t->p.evict_after / 8 > 0 ? t->p.evict_after / 8 : 1;
    if (t->p.evict_after > 0 && step % every == 0)
        for (int k = 0; k < PS_STRIPES; k++) ps_wrlock(&t->s[k]), ps_evict(t, &t->s[k], step), ps_unlock(&t->s[k]);
}

static void ps_apply(pdde_ps_table *t, char *row, const float *g, float scale) {
    float *w = ps_row_vals(row), *s = w + t->p.dim, lr = t->p.lr, eps = t->p.eps;
    int C = t->p.dim;
    switch (t->p.optimizer) {
    case PDDE_PS_SGD:
        for (int c = 0; c < C; c++) w[c] -= lr * scale * g[c];
        break;
    case PDDE_PS_ADAGRAD:
        for (int c = 0; c < C; c++) {
            float gc = scale * g[c];
            s[c] += gc * gc;
            w[c] -= lr * gc / (sqrtf(s[c]) + eps);
        }
        break;
    case PDDE_PS_ADAM: { /* lazy Adam: the row's own step count for the bias correction */
        uint32_t k;
        memcpy(&k, row + 12, 4);
        k++;
        memcpy(row + 12, &k, 4);
        float b1 = t->p.beta1, b2 = t->p.beta2;
        float c1 = 1.0f - powf(b1, (float)k), c2 = 1.0f - powf(b2, (float)k);
        for (int c = 0; c < C; c++) {
            float gc = scale * g[c];
            s[c] = b1 * s[c] + (1 - b1) * gc;
            s[C + c] = b2 * s[C + c] + (1 - b2) * gc * gc;
            w[c] -= lr * (s[c] / c1) / (sqrtf(s[C + c] / c2) + eps);
        }
        break;
    }
    }
}

/* A push's (or add's) ids of stripe s, at positions pos[0..m) of the call (the caller holds s alone;
 * rows: m rows of scratch). Sums the gradients of repeated ids first: an optimizer step per row, not per
 * occurrence. */
static pdde_status ps_stripe_update(pdde_ps_table *t, ps_stripe *s, const uint64_t *ids, const float *vals, const uint32_t *pos, size_t m,
                                    uint32_t *rows, float scale, bool add) {
    size_t C = (size_t)t->p.dim, n_dup = 0;
    ps_map *first = &s->first;
    if (first->cap) memset(first->vals, 0xff, first->cap * sizeof *first->vals), first->n = 0;
    for (size_t j = 0; j < m; j++) { /* find duplicates (rare): keep the first position */
        bool added;
        if (!ps_map_find_or_insert(first, ids[pos[j]], (uint32_t)j, &added)) return ps_oom(t, s);
        n_dup += !added;
    }
    if (n_dup && m * C > s->sum_cap) {
        float *sum = realloc(s->sum, m * C * sizeof *sum);
        if (!sum) return ps_oom(t, s);
        s->sum = sum, s->sum_cap = m * C;
    }
    if (n_dup) {
        for (size_t j = 0; j < m; j++) memcpy(s->sum + j * C, vals + pos[j] * C, C * sizeof(float));
        for (size_t j = 0; j < m; j++) {
            uint32_t f = *ps_map_find(first, ids[pos[j]]);
            if (f != j) for (size_t c = 0; c < C; c++) s->sum[f * C + c] += vals[pos[j] * C + c];
        }
    }
    ps_find_rows(s, ids, pos, m, rows); /* (a row created below is another id's: the repeated ones are skipped) */
    int64_t step = ps_step(t);
    for (size_t j = 0; j < m; j++) {
        if (j + PS_AHEAD < m) ps_row_prefetch(t, s, rows[j + PS_AHEAD]);
        if (n_dup && *ps_map_find(first, ids[pos[j]]) != j) continue;
        const float *g = n_dup ? s->sum + j * C : vals + pos[j] * C;
        bool oom = false;
        char *row;
        if (rows[j] != PS_EMPTY) ps_row_stamp(row = ps_row(t, s, rows[j]), step);
        else if (!(row = ps_touch(t, s, ids[pos[j]], add, &oom)) && oom) return ps_oom(t, s);
        if (row && add) {
            float *w = ps_row_vals(row);
            for (size_t c = 0; c < C; c++) w[c] += g[c];
        } else if (row) ps_apply(t, row, g, scale);
    }
    return PDDE_OK;
}

static pdde_status ps_push_or_add(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *vals, float scale, bool add) {
    if (!t || (n && (!ids || !vals))) return pdde_error(t ? t->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_table_%s: no %s", add ? "add" : "push", !t ? "table" : !ids ? "ids" : "values");
    size_t first[PS_STRIPES + 1];
    ps_scratch *sc = ps_group(t, n, ids, first);
    if (!sc) return pdde_error(t->ctx, PDDE_ERR_OOM, "ps table: out of memory (a push of %zu ids)", n);
    pdde_status st = PDDE_OK;
    for (int k = 0; k < PS_STRIPES && !st; k++) {
        if (first[k] == first[k + 1]) continue;
        ps_wrlock(&t->s[k]);
        st = ps_stripe_update(t, &t->s[k], ids, vals, sc->order + first[k], first[k + 1] - first[k], sc->row + first[k], scale, add);
        ps_unlock(&t->s[k]);
    }
    ps_scratch_put(t, sc);
    if (!st) ps_end_step(t);
    return st;
}

pdde_status pdde_ps_table_push(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *grads, float scale) {
    return ps_push_or_add(t, n, ids, grads, scale, false);
}
pdde_status pdde_ps_table_add(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *deltas) {
    return ps_push_or_add(t, n, ids, deltas, 1.0f, true);
}

pdde_status pdde_ps_table_set(pdde_ps_table *t, size_t n, const uint64_t *ids, const float *vals) {
    if (!t || (n && (!ids || !vals))) return pdde_error(t ? t->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_table_set: no %s", !t ? "table" : !ids ? "ids" : "values");
    int C = t->p.dim;
    pdde_status st = PDDE_OK;
    for (size_t i = 0; i < n && !st; i++) { /* (not a hot path: a lock per id) */
        ps_stripe *s = &t->s[ps_stripe_of(ids[i])];
        ps_wrlock(s);
        uint32_t *r = ps_map_find(&s->index, ids[i]);
        char *row = r ? ps_row(t, s, *r) : ps_new_row(t, s, ids[i]); /* (no admission: the caller means it) */
        if (!row) st = ps_oom(t, s);
        else {
            uint32_t meta[2] = {(uint32_t)ps_step(t), 0};
            memcpy(row + 8, meta, 8);
            memcpy(ps_row_vals(row), vals + i * C, (size_t)C * sizeof(float));
            memset(ps_row_vals(row) + C, 0, (size_t)t->state * sizeof(float));
        }
        ps_unlock(s);
    }
    return st;
}

void pdde_ps_table_stats_get(const pdde_ps_table *t, pdde_ps_table_stats *out) {
    if (out) memset(out, 0, sizeof *out);
    if (!t || !out) return;
    out->step = ps_step(t);
    out->bytes = sizeof *t;
    for (int k = 0; k < PS_STRIPES; k++) {
        const ps_stripe *s = &t->s[k];
        ps_rdlock(s);
        out->rows += s->rows, out->evicted += s->evicted, out->not_admitted += (int64_t)s->seen.n;
        out->bytes += s->n_chunks * PS_CHUNK * t->row_bytes + s->chunk_cap * sizeof(char *) + ps_map_bytes(&s->index) +
                      ps_map_bytes(&s->seen) + ps_map_bytes(&s->first) + s->sum_cap * sizeof(float);
        ps_unlock(s);
    }
    pthread_mutex_lock((pthread_mutex_t *)&t->scratch_lock);
    for (const ps_scratch *sc = t->scratch; sc; sc = sc->next) out->bytes += sizeof *sc + sc->cap * (sizeof *sc->order + sizeof *sc->row + 1);
    pthread_mutex_unlock((pthread_mutex_t *)&t->scratch_lock);
}

/* File: "PDDEPS02" u32 dim u32 optimizer u32 row_bytes u32 0 i64 step i64 rows, rows x row_bytes,
 * i64 pending, pending x (u64 id, u32 times pulled): the admission filter's counts of ids not admitted
 * yet, so a restart goes on counting; u32 crc32 of everything before it. "PDDEPS01" files (before the
 * counts were saved) load with no counts. The rows are in no particular order. */
#define PS_MAGIC "PDDEPS02"
#define PS_MAGIC_V1 "PDDEPS01"

pdde_status pdde_ps_table_save(const pdde_ps_table *t, const char *path) {
    char tmp[4096];
    if (!t || !path) return pdde_error(t ? t->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_table_save: no %s", t ? "path" : "table");
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return pdde_error(t->ctx, PDDE_ERR_INVALID_ARG, "ps table: path too long: %s", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return pdde_error(t->ctx, PDDE_ERR_IO, "ps table: cannot create %s: %s", tmp, strerror(errno));
    /* every stripe held alone: one consistent snapshot (pulls beside it would stamp rows) */
    for (int k = 0; k < PS_STRIPES; k++) ps_wrlock(&t->s[k]);
    int64_t rows = 0, pending = 0;
    for (int k = 0; k < PS_STRIPES; k++) rows += t->s[k].rows, pending += (int64_t)t->s[k].seen.n;
    uint32_t head[4] = {(uint32_t)t->p.dim, (uint32_t)t->p.optimizer, (uint32_t)t->row_bytes, 0};
    int64_t nums[2] = {ps_step(t), rows};
    uint32_t crc = 0;
    bool ok = true;
#define PS_PUT(p, n) do { ok = ok && fwrite((p), 1, (n), f) == (n); crc = crc32_update(crc, (p), (n)); } while (0)
    PS_PUT(PS_MAGIC, 8);
    PS_PUT(head, sizeof head);
    PS_PUT(nums, sizeof nums);
    for (int k = 0; k < PS_STRIPES; k++)
        for (int64_t i = 0; i < t->s[k].rows; i++) PS_PUT(ps_row(t, &t->s[k], (uint32_t)i), t->row_bytes);
    PS_PUT(&pending, sizeof pending);
    for (int k = 0; k < PS_STRIPES; k++) {
        const ps_map *seen = &t->s[k].seen;
        for (size_t i = 0; i < seen->cap; i++)
            if (seen->vals[i] != PS_EMPTY) {
                PS_PUT(&seen->keys[i], sizeof seen->keys[i]);
                PS_PUT(&seen->vals[i], sizeof seen->vals[i]);
            }
    }
#undef PS_PUT
    for (int k = PS_STRIPES - 1; k >= 0; k--) ps_unlock(&t->s[k]);
    ok = ok && fwrite(&crc, 4, 1, f) == 1 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    if (fclose(f) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        pdde_status st = pdde_error(t->ctx, PDDE_ERR_IO, "ps table: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return PDDE_OK;
}

/* Reads the table file at path into `into` (a fresh table with t's parameters), keeping only the rows
 * and admission counts of the ids server keep_index of keep_of owns (keep_of 0: all of them); *step:
 * the file's table step. A bad file returns its error; `into` then holds part of it. */
static pdde_status ps_table_read(const pdde_ps_table *t, const char *path, pdde_ps_table *into, int keep_index, int keep_of, int64_t *step) {
    FILE *f = fopen(path, "rb");
    if (!f) return pdde_error(t->ctx, PDDE_ERR_IO, "ps table: cannot open %s: %s", path, strerror(errno));
    char magic[8];
    uint32_t head[4], crc = 0, want;
    int64_t nums[2];
    pdde_status st = PDDE_OK;
    bool v1 = false;
    if (fread(magic, 1, 8, f) != 8 || (memcmp(magic, PS_MAGIC, 8) && !(v1 = !memcmp(magic, PS_MAGIC_V1, 8))) || fread(head, sizeof head, 1, f) != 1 ||
        fread(nums, sizeof nums, 1, f) != 1)
        st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s is not a table file (magic or header)", path);
    else if (head[0] != (uint32_t)t->p.dim || head[1] != (uint32_t)t->p.optimizer || head[2] != t->row_bytes)
        st = pdde_error(t->ctx, PDDE_ERR_MISMATCH, "ps table: %s has dim %u optimizer %u, the table dim %d optimizer %d",
                        path, head[0], head[1], t->p.dim, (int)t->p.optimizer);
    else if (nums[1] < 0 || nums[1] >= (int64_t)UINT32_MAX - 1)
        st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s: row count %lld", path, (long long)nums[1]);
    if (!st) {
        *step = nums[0];
        crc = crc32_update(crc32_update(crc32_update(0, magic, 8), head, sizeof head), nums, sizeof nums);
        for (int64_t i = 0; i < nums[1] && !st; i++) {
            char *row = malloc(t->row_bytes), *dst;
            ps_stripe *s = NULL;
            if (!row) st = pdde_error(t->ctx, PDDE_ERR_OOM, "ps table: out of memory loading %s", path);
            else if (fread(row, 1, t->row_bytes, f) != t->row_bytes)
                st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s is truncated at row %lld of %lld", path, (long long)i, (long long)nums[1]);
            else if (crc = crc32_update(crc, row, t->row_bytes), keep_of && pdde_ps_shard_of(ps_row_id(row), keep_of) != keep_index) {
                /* another server's row (a table saved by another count of servers) */
            } else if (ps_map_find(&(s = &into->s[ps_stripe_of(ps_row_id(row))])->index, ps_row_id(row)))
                st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s holds id %llu twice (or another shard has it)", path, (unsigned long long)ps_row_id(row));
            else if (!(dst = ps_new_row(into, s, ps_row_id(row))))
                st = pdde_error(t->ctx, PDDE_ERR_OOM, "ps table: out of memory loading %s", path);
            else memcpy(dst, row, t->row_bytes);
            free(row);
        }
        int64_t pending = 0;
        if (!st && !v1 && fread(&pending, sizeof pending, 1, f) != 1)
            st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s is truncated before its admission counts", path);
        else if (!st && (pending < 0 || pending >= (int64_t)UINT32_MAX))
            st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s: admission count of %lld ids", path, (long long)pending);
        crc = crc32_update(crc, &pending, v1 ? 0 : sizeof pending);
        for (int64_t i = 0; i < pending && !st; i++) {
            uint64_t id;
            uint32_t times;
            ps_stripe *s = NULL;
            if (fread(&id, sizeof id, 1, f) != 1 || fread(&times, sizeof times, 1, f) != 1)
                st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s is truncated at admission count %lld of %lld", path, (long long)i, (long long)pending);
            else if (crc = crc32_update(crc32_update(crc, &id, sizeof id), &times, sizeof times), keep_of && pdde_ps_shard_of(id, keep_of) != keep_index) {
            } else if (ps_map_find(&(s = &into->s[ps_stripe_of(id)])->index, id) || ps_map_find(&s->seen, id))
                st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s counts id %llu twice (or has a row for it)", path, (unsigned long long)id);
            else if (!ps_map_insert(&s->seen, id, times))
                st = pdde_error(t->ctx, PDDE_ERR_OOM, "ps table: out of memory loading %s", path);
        }
        if (!st && (fread(&want, 4, 1, f) != 1 || want != crc))
            st = pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps table: %s: checksum mismatch", path);
    }
    fclose(f);
    return st;
}

/* Swaps the contents of `from` (read by ps_table_read) into t, every stripe held alone. */
static void ps_table_take(pdde_ps_table *t, pdde_ps_table *from_table, int64_t step) {
    for (int k = 0; k < PS_STRIPES; k++) {
        ps_stripe *s = &t->s[k], *from = &from_table->s[k];
        ps_wrlock(s);
        ps_stripe_clear(s);
        s->index = from->index, s->seen = from->seen, s->chunks = from->chunks, s->n_chunks = from->n_chunks, s->chunk_cap = from->chunk_cap;
        s->rows = from->rows;
        memset(&from->index, 0, sizeof from->index), memset(&from->seen, 0, sizeof from->seen), from->chunks = NULL, from->n_chunks = from->chunk_cap = 0;
        ps_unlock(s);
    }
    atomic_store(&t->step, step);
}

pdde_status pdde_ps_table_load(pdde_ps_table *t, const char *path) {
    if (!t || !path) return pdde_error(t ? t->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_table_load: no %s", t ? "path" : "table");
    /* read into a fresh table first: a bad file leaves t as it was */
    pdde_ps_table *n = NULL;
    int64_t step = 0;
    pdde_status st = pdde_ps_table_init(t->ctx, &t->p, &n);
    if (!st) st = ps_table_read(t, path, n, 0, 0, &step);
    if (!st) ps_table_take(t, n, step);
    pdde_ps_table_free(n);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Wire protocol. A worker sends a request header to a server (on one tag for all its requests), then
 * its payload (ids as i64, values as f32) on the tags of the request's lane; the server answers on
 * that lane's tags with a reply header that echoes the request's id, then rows or stats. A client has
 * PS_LANES lanes, each with at most one request outstanding per server, so requests of several
 * threads are in flight at once and messages of one (pair, tag) never overtake each other. */

enum { PS_PULL = 1, PS_PUSH, PS_ADD, PS_SAVE, PS_STATS, PS_BYE, PS_SET };
#define PS_LANES 8
enum { PS_TAG_REQ = 0xF0000, PS_TAG_LANE = 0xF0010 };      /* lane l's tags: PS_TAG_LANE + 4 l + one of: */
enum { PS_TAG_IDS, PS_TAG_VALS, PS_TAG_REPLY, PS_TAG_ROWS };
static int ps_tag(int lane, int k) { return PS_TAG_LANE + 4 * lane + k; }
/* req: the request's id, lane | sequence << 8 (the sequence counts the lane's requests) */
typedef struct { int64_t op, n, clock, status, req; } ps_hdr;
static int ps_lane_of(int64_t req) { return (int)(req & 0xff); }
static const char *ps_op_name(int64_t op) {
    static const char *const names[] = {"?", "pull", "push", "add", "save", "stats", "bye", "set"};
    return op >= 1 && op <= PS_SET ? names[op] : names[0];
}
#define PS_HDR_WORDS (sizeof(ps_hdr) / 8)
#define PS_STATS_WORDS ((sizeof(pdde_ps_server_stats) + 7) / 8)

int pdde_ps_shard_path(char *buf, size_t n, const char *dir, int index, int n_servers) {
    return snprintf(buf, n, "%s/ps-shard-%d-of-%d.bin", dir, index, n_servers);
}

/* Loads server index's shard of n_servers from dir: its own file where dir has one, else the table
 * of another count of servers re-partitioned (the table is a map hashed over the servers: every
 * shard file of dir is read and the ids this server owns kept). */
static pdde_status ps_load_shard_dir(pdde_ps_table *t, const char *dir, int index, int n_servers) {
    char path[4096];
    if (pdde_ps_shard_path(path, sizeof path, dir, index, n_servers) >= (int)sizeof path)
        return pdde_error(t->ctx, PDDE_ERR_INVALID_ARG, "ps: load directory path too long: %s", dir);
    if (access(path, F_OK) == 0) return pdde_ps_table_load(t, path);
    DIR *d = opendir(dir);
    if (!d) return pdde_error(t->ctx, PDDE_ERR_IO, "ps: cannot open the load directory %s: %s", dir, strerror(errno));
    int saved_by = 0, other = 0; /* the servers that wrote dir's shards (another count too: other) */
    for (struct dirent *e; (e = readdir(d));) {
        int i, of, end = 0;
        if (sscanf(e->d_name, "ps-shard-%d-of-%d.bin%n", &i, &of, &end) != 2 || e->d_name[end] || of < 1) continue;
        if (!saved_by) saved_by = of;
        else if (of != saved_by) other = of;
    }
    closedir(d);
    if (!saved_by)
        return pdde_error(t->ctx, PDDE_ERR_NOT_FOUND, "ps: %s holds no table shards (ps-shard-I-of-N.bin files, as pdde_ps_client_save writes)", dir);
    if (other)
        return pdde_error(t->ctx, PDDE_ERR_CORRUPT, "ps: %s holds shards of %d and of %d servers, none of %d: keep one set", dir, saved_by, other, n_servers);
    pdde_ps_table *n = NULL;
    int64_t step = 0;
    pdde_status st = pdde_ps_table_init(t->ctx, &t->p, &n);
    for (int i = 0; i < saved_by && !st; i++) {
        int64_t file_step = 0;
        pdde_ps_shard_path(path, sizeof path, dir, i, saved_by);
        if (!(st = ps_table_read(t, path, n, index, n_servers, &file_step)) && file_step > step) step = file_step;
    }
    if (st) { /* (the reader's message, with what was being done) */
        char why[1024];
        snprintf(why, sizeof why, "%s", pdde_last_error(t->ctx));
        pdde_error(t->ctx, st, "ps: loading the table %d servers saved in %s as shard %d of %d: %s", saved_by, dir, index, n_servers, why);
    } else ps_table_take(t, n, step);
    pdde_ps_table_free(n);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Server. Several threads serve at once (leader/follower): one thread at a time polls the workers'
 * request headers; the one that finds a header posts that worker's next header receive and serves the
 * request itself (its payload, the table, the reply). It hands the polling on to another thread when
 * there is more to do at once (another header has come too) or its request has to wait (its payload
 * is not all here), and otherwise keeps it: a request served at once costs no hand-over, as with one
 * thread. The table locks its own stripes; the workers' clocks and states, the sync round, the
 * deferred pulls and the stats are under the server's lock, so the staleness bound and the rounds are
 * decided one request at a time. */

typedef enum { PS_W_IDLE = 0, PS_W_ACK_WAIT, PS_W_GONE } ps_worker_state;

typedef struct {
    ps_hdr hdr;
    pdde_comm_request *req;  /* the posted receive of the next request header (the poller's) */
    /* under the server's lock: */
    ps_worker_state state;
    int64_t clock;           /* pushes applied from this worker */
    int64_t ack_req;         /* sync: the push waiting for its round (ACK_WAIT) */
    /* async: the deferred pulls, one a lane at most (a lane has one request outstanding) */
    unsigned deferred;       /* a bit a lane */
    uint64_t *ids[PS_LANES];
    int64_t n_ids[PS_LANES], pull_req[PS_LANES];
} ps_worker;

/* The default: one request at a time. Threads measured faster only with many requests in flight (2
 * workers x 8 threads: 1.3-1.6x) and slower with few (1-2 threads a worker: 0.6-0.9x), on 2 cores
 * (tools/bench/RESULTS.md); PDDE_PS_SERVER_THREADS or pdde_ps_params.server_threads set it. */
#define PS_SERVER_THREADS 1
#define PS_SERVER_THREADS_MAX 64

struct pdde_ps_server {
    pdde_context *ctx;
    pdde_ps_params p;
    int index;
    pdde_ps_table *table;
    pthread_mutex_t lock;       /* the stats, the sync round, and a run's workers' clocks, states and deferred pulls */
    pthread_mutex_t ckpt_lock;  /* one automatic checkpoint at a time */
    pthread_rwlock_t round_lock;/* sync: a round is applied whole before or after a pull, never beside it */
    pdde_ps_server_stats stats;
    /* sync: the round's gradient sums */
    ps_map round_index;
    float *round_sum;
    uint64_t *round_ids;
    size_t round_n, round_cap;
    char *ckpt_path;         /* automatic checkpoints: this shard's file (NULL: none) */
    int64_t ckpt_step;       /* the table step the last one holds (every step up to it) */
};

pdde_status pdde_ps_server_init(pdde_context *ctx, const pdde_ps_params *p, int server_index, pdde_ps_server **out) {
    if (!p || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_ps_server_init: no %s", p ? "out" : "params");
    *out = NULL;
    int n_servers = p->n_servers > 0 ? p->n_servers : 1;
    if (server_index < 0 || server_index >= n_servers)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "ps server: index %d not in [0, %d)", server_index, n_servers);
    if (p->server_threads < 0 || p->server_threads > PS_SERVER_THREADS_MAX)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "ps server: server_threads %d not in [0, %d]", p->server_threads, PS_SERVER_THREADS_MAX);
    pdde_ps_server *s = calloc(1, sizeof *s);
    if (!s) return pdde_error(ctx, PDDE_ERR_OOM, "ps server: out of memory");
    s->ctx = ctx, s->p = *p, s->index = server_index;
    s->p.n_servers = n_servers;
    s->p.load_dir = s->p.checkpoint_dir = NULL;
    pthread_mutex_init(&s->lock, NULL), pthread_mutex_init(&s->ckpt_lock, NULL), pthread_rwlock_init(&s->round_lock, NULL);
    pdde_status st = PDDE_OK;
    if (!s->p.server_threads) { /* PDDE_PS_SERVER_THREADS=k: k threads (1: one request at a time) */
        long k;
        pdde_env_int("PDDE_PS_SERVER_THREADS", PS_SERVER_THREADS, 1, PS_SERVER_THREADS_MAX, &k);
        s->p.server_threads = (int)k;
    }
    if (!st && p->checkpoint_dir && p->checkpoint_every > 0) {
        char path[4096];
        if (pdde_ps_shard_path(path, sizeof path, p->checkpoint_dir, server_index, n_servers) >= (int)sizeof path || !(s->ckpt_path = strdup(path)))
            st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "ps server: checkpoint directory %s: path too long or out of memory", p->checkpoint_dir);
    }
    if (!st) st = pdde_ps_table_init(ctx, &p->table, &s->table);
    if (!st && p->load_dir) st = ps_load_shard_dir(s->table, p->load_dir, server_index, n_servers);
    if (st) { pdde_ps_server_free(s); return st; }
    s->ckpt_step = ps_step(s->table);
    *out = s;
    return PDDE_OK;
}

void pdde_ps_server_free(pdde_ps_server *s) {
    if (!s) return;
    pdde_ps_table_free(s->table);
    ps_map_free(&s->round_index);
    free(s->round_sum), free(s->round_ids);
    free(s->ckpt_path);
    pthread_mutex_destroy(&s->lock), pthread_mutex_destroy(&s->ckpt_lock), pthread_rwlock_destroy(&s->round_lock);
    free(s);
}

pdde_ps_table *pdde_ps_server_table(pdde_ps_server *s) { return s ? s->table : NULL; }

void pdde_ps_server_stats_get(const pdde_ps_server *s, pdde_ps_server_stats *out) {
    if (out && !s) memset(out, 0, sizeof *out);
    if (!s || !out) return;
    pthread_mutex_lock((pthread_mutex_t *)&s->lock); /* (the lock is not the server's contents) */
    *out = s->stats;
    pthread_mutex_unlock((pthread_mutex_t *)&s->lock);
    pdde_ps_table_stats_get(s->table, &out->table);
}

/* Writes the automatic checkpoint when checkpoint_every steps have passed since the last (or, force,
 * any step). step: the table's step read after the caller's own step was applied; a checkpoint that
 * already holds it is enough. Called before the step is acknowledged: a worker that saw its push
 * acknowledged past a checkpoint step knows the checkpoint holds it. */
static pdde_status ps_auto_checkpoint(pdde_ps_server *s, int64_t step, bool force, bool holds_lock) {
    if (!s->ckpt_path) return PDDE_OK;
    pthread_mutex_lock(&s->ckpt_lock);
    pdde_status st = PDDE_OK;
    if (step > s->ckpt_step && (force || step - s->ckpt_step >= s->p.checkpoint_every)) {
        /* every step up to `held` is complete (a push counts its step once all its rows are written),
         * so the file, written after, holds them all */
        int64_t held = ps_step(s->table);
        if ((st = pdde_ps_table_save(s->table, s->ckpt_path)))
            pdde_log(PDDE_LOG_WARN, "pdde ps server %d: automatic checkpoint: %s\n", s->index, pdde_last_error(s->ctx));
        else {
            s->ckpt_step = held;
            if (!holds_lock) pthread_mutex_lock(&s->lock); /* (a sync round closes under it) */
            s->stats.checkpoints++;
            if (!holds_lock) pthread_mutex_unlock(&s->lock);
        }
    }
    pthread_mutex_unlock(&s->ckpt_lock);
    return st;
}

/* The reply header of request req (on its lane's tags). */
static pdde_status ps_reply(pdde_comm *comm, int peer, int64_t req, int64_t status, int64_t n) {
    ps_hdr h = {0, n, 0, status, req};
    return pdde_comm_send(comm, &h, PS_HDR_WORDS, PDDE_I64, peer, ps_tag(ps_lane_of(req), PS_TAG_REPLY));
}

/* Adds one worker's push to the round's sums (sync mode; the caller holds the server's lock). */
static pdde_status ps_round_add(pdde_ps_server *s, int64_t n, const uint64_t *ids, const float *g) {
    int C = s->p.table.dim;
    for (int64_t i = 0; i < n; i++) {
        uint32_t *r = ps_map_find(&s->round_index, ids[i]);
        if (!r) {
            if (s->round_n == s->round_cap) {
                size_t cap = s->round_cap ? 2 * s->round_cap : 1024;
                float *sum = realloc(s->round_sum, cap * (size_t)C * sizeof(float));
                if (sum) s->round_sum = sum;
                uint64_t *ri = sum ? realloc(s->round_ids, cap * sizeof *ri) : NULL;
                if (!ri) return pdde_error(s->ctx, PDDE_ERR_OOM, "ps server: out of memory (round of %zu rows)", s->round_n);
                s->round_ids = ri, s->round_cap = cap;
            }
            if (!(r = ps_map_insert(&s->round_index, ids[i], (uint32_t)s->round_n)))
                return pdde_error(s->ctx, PDDE_ERR_OOM, "ps server: out of memory");
            s->round_ids[s->round_n] = ids[i];
            memset(s->round_sum + s->round_n * C, 0, (size_t)C * sizeof(float));
            s->round_n++;
        }
        float *dst = s->round_sum + (size_t)*r * C;
        for (int c = 0; c < C; c++) dst[c] += g[i * C + c];
    }
    return PDDE_OK;
}

static int64_t ps_min_clock(const ps_worker *w, int n) {
    int64_t m = INT64_MAX;
    for (int i = 0; i < n; i++)
        if (w[i].state != PS_W_GONE && w[i].clock < m) m = w[i].clock;
    return m;
}

/* How many pushes worker i is ahead of the slowest worker still here. */
static int64_t ps_ahead(const ps_worker *w, int nw, int i) { return w[i].clock - ps_min_clock(w, nw); }

/* Answers a pull: rows of the ids. */
static pdde_status ps_serve_pull(pdde_ps_server *s, pdde_comm *comm, int peer, int64_t req, const uint64_t *ids, int64_t n) {
    int C = s->p.table.dim;
    float *rows = n ? malloc((size_t)n * C * sizeof(float)) : NULL;
    if (n && !rows) return pdde_error(s->ctx, PDDE_ERR_OOM, "ps server: out of memory (pull of %lld rows)", (long long)n);
    bool sync = s->p.mode == PDDE_PS_SYNC;
    if (sync) pthread_rwlock_rdlock(&s->round_lock);
    pdde_status st = pdde_ps_table_pull(s->table, (size_t)n, ids, rows);
    if (sync) pthread_rwlock_unlock(&s->round_lock);
    if (st && n) memset(rows, 0, (size_t)n * C * sizeof(float)); /* (the rows go all the same: the client posted their receive) */
    pdde_status sr = ps_reply(comm, peer, req, st, n);
    if (!sr && n) sr = pdde_comm_send(comm, rows, (size_t)n * C, PDDE_F32, peer, ps_tag(ps_lane_of(req), PS_TAG_ROWS));
    free(rows);
    pthread_mutex_lock(&s->lock), s->stats.pulls++, pthread_mutex_unlock(&s->lock);
    return sr;
}

/* A pull the staleness bound holds back, taken out of its worker once the bound allows it. */
typedef struct { int peer; int64_t req, n; uint64_t *ids; } ps_pull;

/* Async: takes one deferred pull that the staleness bound now allows (false: none). The caller holds
 * the server's lock. */
static bool ps_take_released(pdde_ps_server *s, ps_worker *w, int nw, ps_pull *out) {
    for (int i = 0; i < nw; i++) {
        int64_t ahead = w[i].deferred ? ps_ahead(w, nw, i) : 0;
        if (!w[i].deferred || ahead > s->p.staleness) continue;
        if (ahead > s->stats.max_staleness) s->stats.max_staleness = ahead;
        for (int l = 0; l < PS_LANES; l++) {
            if (!(w[i].deferred & 1u << l)) continue;
            *out = (ps_pull){s->p.n_servers + i, w[i].pull_req[l], w[i].n_ids[l], w[i].ids[l]};
            w[i].ids[l] = NULL;
            w[i].deferred &= ~(1u << l);
            return true;
        }
    }
    return false;
}

/* Async: serves the deferred pulls the staleness bound now allows (after a clock moved). */
static pdde_status ps_release_pulls(pdde_ps_server *s, pdde_comm *comm, ps_worker *w, int nw) {
    pdde_status st = PDDE_OK;
    for (;;) {
        ps_pull q;
        pthread_mutex_lock(&s->lock);
        bool any = ps_take_released(s, w, nw, &q);
        pthread_mutex_unlock(&s->lock);
        if (!any) return st;
        pdde_status sp = ps_serve_pull(s, comm, q.peer, q.req, q.ids, q.n);
        free(q.ids);
        if (!st) st = sp;
    }
}

/* Sync: once every worker still here has pushed, applies the round and acknowledges. The caller holds
 * the server's lock. */
static pdde_status ps_close_round(pdde_ps_server *s, pdde_comm *comm, ps_worker *w, int nw) {
    int waiting = 0, live = 0;
    for (int i = 0; i < nw; i++) live += w[i].state != PS_W_GONE, waiting += w[i].state == PS_W_ACK_WAIT;
    if (!waiting || waiting < live) return PDDE_OK;
    pthread_rwlock_wrlock(&s->round_lock);
    pdde_status st = pdde_ps_table_push(s->table, s->round_n, s->round_ids, s->round_sum, 1.0f / (float)waiting);
    pthread_rwlock_unlock(&s->round_lock);
    if (!st) st = ps_auto_checkpoint(s, ps_step(s->table), false, true);
    s->round_n = 0;
    ps_map_free(&s->round_index);
    for (int i = 0; i < nw; i++) {
        if (w[i].state != PS_W_ACK_WAIT) continue;
        w[i].state = PS_W_IDLE;
        pdde_status sr = ps_reply(comm, s->p.n_servers + i, w[i].ack_req, st, 0);
        if (sr) return sr;
    }
    return st;
}

/* One run of the server: its workers and the threads serving them. */
typedef struct {
    pdde_ps_server *s;
    pdde_comm *comm;
    ps_worker *w;
    int nw;
    pthread_mutex_t lock;       /* the poll role, the count of workers here, the first error */
    pthread_cond_t cv;
    bool polling;               /* a thread holds the poll role */
    int live;                   /* workers that have not said goodbye */
    int idle;                   /* the poller's back-off: polls in a row that found nothing */
    _Atomic int busy;           /* threads serving a request */
    _Atomic int failed;
    pdde_status st;
    char err[1024];
} ps_run;

/* Gives the poll role up (when this thread holds it), so that another thread polls meanwhile. */
static void ps_hand_on(ps_run *run, bool *holding) {
    if (!*holding) return;
    *holding = false;
    pthread_mutex_lock(&run->lock);
    run->polling = false;
    pthread_cond_signal(&run->cv);
    pthread_mutex_unlock(&run->lock);
}

#define PS_PAYLOAD_SPIN_S 50e-6

/* Receives part of a request's payload; if it has not all arrived soon, hands the polling on first. */
static pdde_status ps_recv_payload(ps_run *run, bool *holding, void *buf, size_t count, pdde_dtype t, int peer, int tag) {
    pdde_comm_request *r = NULL;
    pdde_status st = pdde_comm_irecv(run->comm, buf, count, t, peer, tag, &r);
    int done = 0;
    if (!st) st = pdde_comm_test(r, &done);
    /* the rest of a payload is usually microseconds behind its header: a hand-over (waking another
     * thread) costs more than a short wait for it */
    struct timespec since, now;
    clock_gettime(CLOCK_MONOTONIC, &since);
    for (bool waited = false; !st && !done && *holding && !waited;) {
        st = pdde_comm_test(r, &done);
        clock_gettime(CLOCK_MONOTONIC, &now);
        waited = (double)(now.tv_sec - since.tv_sec) + 1e-9 * (double)(now.tv_nsec - since.tv_nsec) > PS_PAYLOAD_SPIN_S;
    }
    if (!st && !done) {
        ps_hand_on(run, holding);
        /* (a timeout fails the world, as a blocking receive's does: the receive left posted would take
         * the lane's next payload) */
        if ((st = pdde_comm_wait(r, -1)) == PDDE_ERR_TIMEOUT) pdde_comm_abort(run->comm);
    }
    pdde_comm_request_free(r);
    return st;
}

/* Handles worker i's request h (its header has arrived; its payload follows on the lane's tags).
 * holding: this thread holds the poll role (given up where the request has to wait). */
static pdde_status ps_handle(ps_run *run, int i, ps_hdr h, bool *holding) {
    pdde_ps_server *s = run->s;
    pdde_comm *comm = run->comm;
    ps_worker *w = run->w;
    int nw = run->nw, peer = s->p.n_servers + i, C = s->p.table.dim;
    pdde_status st = PDDE_OK;
    uint64_t *ids = NULL;
    float *vals = NULL;
    int lane = ps_lane_of(h.req);
    bool async = s->p.mode == PDDE_PS_ASYNC;
    if (h.n < 0 || h.n > ((int64_t)1 << 32) || lane >= PS_LANES)
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "ps server %d: request %lld (op %lld) from rank %d with %lld ids (lanes: %d)",
                          s->index, (long long)h.req, (long long)h.op, peer, (long long)h.n, PS_LANES);
    if (h.op == PS_PULL || h.op == PS_PUSH || h.op == PS_ADD || h.op == PS_SET || h.op == PS_SAVE) {
        /* SAVE sends its path as bytes in an i64 array of ceil(len / 8) + 1 words */
        size_t words = h.op == PS_SAVE ? (size_t)h.n / 8 + 1 : (size_t)h.n;
        if (words && !(ids = calloc(words, 8))) return pdde_error(s->ctx, PDDE_ERR_OOM, "ps server: out of memory");
        if (words) st = ps_recv_payload(run, holding, ids, words, PDDE_I64, peer, ps_tag(lane, PS_TAG_IDS));
    }
    if (!st && (h.op == PS_PUSH || h.op == PS_ADD || h.op == PS_SET) && h.n) {
        if (!(vals = malloc((size_t)h.n * C * sizeof(float)))) st = pdde_error(s->ctx, PDDE_ERR_OOM, "ps server: out of memory");
        else st = ps_recv_payload(run, holding, vals, (size_t)h.n * C, PDDE_F32, peer, ps_tag(lane, PS_TAG_VALS));
    }
    /* everything of the request is here (or the worker is gone and nothing is applied) */
    if (!st) switch (h.op) {
    case PS_PULL:
        if (async) { /* served now if the staleness bound allows, else when the slowest worker catches up */
            pthread_mutex_lock(&s->lock);
            int64_t ahead = ps_ahead(w, nw, i);
            bool now = ahead <= s->p.staleness;
            if (w[i].deferred & 1u << lane) /* (its lane has one outstanding: the client broke the protocol) */
                st = pdde_error(s->ctx, PDDE_ERR_CORRUPT, "ps server %d: rank %d sent pull %lld on lane %d, which has one waiting",
                                s->index, peer, (long long)h.req, lane);
            else if (now) {
                if (ahead > s->stats.max_staleness) s->stats.max_staleness = ahead;
            } else {
                w[i].deferred |= 1u << lane, w[i].ids[lane] = ids, w[i].n_ids[lane] = h.n, w[i].pull_req[lane] = h.req, ids = NULL;
                s->stats.deferred_pulls++;
            }
            pthread_mutex_unlock(&s->lock);
            if (!st && now) st = ps_serve_pull(s, comm, peer, h.req, ids, h.n);
        } else st = ps_serve_pull(s, comm, peer, h.req, ids, h.n);
        break;
    case PS_PUSH:
        if (s->p.mode == PDDE_PS_SYNC) { /* the round is the server's: one push at a time adds to it */
            pthread_mutex_lock(&s->lock);
            s->stats.pushes++;
            w[i].clock++;
            st = ps_round_add(s, h.n, ids, vals);
            w[i].state = PS_W_ACK_WAIT, w[i].ack_req = h.req;
            if (!st) st = ps_close_round(s, comm, w, nw);
            pthread_mutex_unlock(&s->lock);
        } else {
            /* applied beside other pushes (the table's stripes), then counted: the worker's clock
             * moves once its push is in the table and before it is acknowledged, so a pull the
             * bound releases sees it and the worker's next pull is measured with it */
            pdde_status sa = pdde_ps_table_push(s->table, (size_t)h.n, ids, vals, 1.0f);
            if (!sa) sa = ps_auto_checkpoint(s, ps_step(s->table), false, false);
            pthread_mutex_lock(&s->lock);
            s->stats.pushes++;
            w[i].clock++;
            pthread_mutex_unlock(&s->lock);
            st = ps_reply(comm, peer, h.req, sa, 0);
            if (async) {
                pdde_status sr = ps_release_pulls(s, comm, w, nw);
                if (!st) st = sr;
            }
        }
        break;
    case PS_ADD: {
        pdde_status sa = pdde_ps_table_add(s->table, (size_t)h.n, ids, vals);
        if (!sa) sa = ps_auto_checkpoint(s, ps_step(s->table), false, false);
        pthread_mutex_lock(&s->lock);
        s->stats.pushes++;
        w[i].clock++;
        pthread_mutex_unlock(&s->lock);
        st = ps_reply(comm, peer, h.req, sa, 0);
        break;
    }
    case PS_SET: /* not a step: no clock, no round */
        st = ps_reply(comm, peer, h.req, pdde_ps_table_set(s->table, (size_t)h.n, ids, vals), 0);
        break;
    case PS_SAVE: {
        char path[4096];
        pdde_ps_shard_path(path, sizeof path, (const char *)ids, s->index, s->p.n_servers);
        pdde_status sa = pdde_ps_table_save(s->table, path);
        if (sa) pdde_log(PDDE_LOG_WARN, "pdde ps server %d: %s\n", s->index, pdde_last_error(s->ctx));
        st = ps_reply(comm, peer, h.req, sa, 0);
        break;
    }
    case PS_STATS: {
        int64_t buf[PS_STATS_WORDS] = {0};
        pdde_ps_server_stats ss;
        pdde_ps_server_stats_get(s, &ss);
        memcpy(buf, &ss, sizeof ss);
        st = ps_reply(comm, peer, h.req, 0, (int64_t)PS_STATS_WORDS);
        if (!st) st = pdde_comm_send(comm, buf, PS_STATS_WORDS, PDDE_I64, peer, ps_tag(lane, PS_TAG_ROWS));
        break;
    }
    case PS_BYE:
        pthread_mutex_lock(&s->lock);
        w[i].state = PS_W_GONE;
        if (s->p.mode == PDDE_PS_SYNC) st = ps_close_round(s, comm, w, nw);
        pthread_mutex_unlock(&s->lock);
        if (async) st = ps_release_pulls(s, comm, w, nw);
        break;
    default:
        st = pdde_error(s->ctx, PDDE_ERR_CORRUPT, "ps server %d: unknown request op %lld from rank %d", s->index, (long long)h.op, peer);
    }
    free(ids), free(vals);
    return st;
}

/* Records a thread's failure (the first one's message is the run's) and stops the others. */
static void ps_run_fail(ps_run *run, pdde_status st) {
    pthread_mutex_lock(&run->lock);
    if (!run->st) run->st = st, snprintf(run->err, sizeof run->err, "%s", pdde_last_error(run->s->ctx));
    atomic_store(&run->failed, 1);
    pthread_cond_broadcast(&run->cv);
    pthread_mutex_unlock(&run->lock);
}

/* The poller: waits for a worker's request header; on one, posts that worker's next header receive
 * (none after its goodbye) and returns the worker (-1: every worker has gone, or the run failed);
 * *more: another worker's header has come too. */
static int ps_poll(ps_run *run, ps_hdr *h, pdde_status *st, bool *more) {
    ps_worker *w = run->w;
    *st = PDDE_OK;
    for (;;) {
        if (atomic_load(&run->failed)) return -1;
        int any = 0;
        for (int i = 0; i < run->nw; i++) {
            if (!w[i].req) continue;
            any = 1;
            int done = 0;
            if ((*st = pdde_comm_test(w[i].req, &done))) return -1;
            if (!done) continue;
            pdde_comm_request_free(w[i].req);
            w[i].req = NULL;
            *h = w[i].hdr;
            run->idle = 0;
            if (h->op == PS_BYE) { /* (the last goodbye ends the run: every waiting thread is told) */
                pthread_mutex_lock(&run->lock);
                if (--run->live == 0) pthread_cond_broadcast(&run->cv);
                pthread_mutex_unlock(&run->lock);
            }
            else *st = pdde_comm_irecv(run->comm, &w[i].hdr, PS_HDR_WORDS, PDDE_I64, run->s->p.n_servers + i, PS_TAG_REQ, &w[i].req);
            *more = false;
            for (int j = i; j < run->nw && !*st && !*more; j++) { /* (this worker's next header too; a finished receive stays finished for the next poll) */
                int other = 0;
                if (w[j].req && !(*st = pdde_comm_test(w[j].req, &other))) *more = other;
            }
            return *st ? -1 : i;
        }
        if (!any) return -1;
        /* idle: back off to at most 200 us between polls, so a waiting server leaves the core; while
         * other threads serve, the poller gives them its core between polls (cores may be few) */
        if (++run->idle > 64) usleep(run->idle > 1000 ? 200 : 20);
        else if (atomic_load(&run->busy)) sched_yield();
    }
}

/* A serving thread: takes the poll role when it is free (or keeps it from its last request), polls,
 * and serves what it found. */
static void *ps_serve_thread(void *arg) {
    ps_run *run = arg;
    bool holding = false;
    for (;;) {
        if (!holding) {
            pthread_mutex_lock(&run->lock);
            while (run->polling && run->live > 0 && !run->st) { /* (every wait bounded: the state is checked again) */
                struct timespec until = cond_deadline(0.1);
                pthread_cond_timedwait(&run->cv, &run->lock, &until);
            }
            bool stop = run->live == 0 || run->st;
            if (!stop) run->polling = true;
            pthread_mutex_unlock(&run->lock);
            if (stop) return NULL;
            holding = true;
        }
        ps_hdr h = {0};
        pdde_status st;
        bool more = false;
        int i = ps_poll(run, &h, &st, &more);
        if (st || i < 0 || more) ps_hand_on(run, &holding);
        if (st) ps_run_fail(run, st);
        else if (i >= 0) {
            atomic_fetch_add(&run->busy, 1);
            if ((st = ps_handle(run, i, h, &holding))) ps_run_fail(run, st);
            atomic_fetch_sub(&run->busy, 1);
        }
    }
}

pdde_status pdde_ps_server_run(pdde_ps_server *s, pdde_comm *comm) {
    if (!s || !comm) return pdde_error(s ? s->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_server_run: no %s", s ? "communicator" : "server");
    int size = pdde_comm_size(comm), nw = size - s->p.n_servers;
    if (nw <= 0 || pdde_comm_rank(comm) != s->index)
        return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "ps server %d: runs on rank %d of %d ranks with %d servers",
                          s->index, pdde_comm_rank(comm), size, s->p.n_servers);
    ps_run run = {.s = s, .comm = comm, .nw = nw, .live = nw};
    if (!(run.w = calloc((size_t)nw, sizeof *run.w))) return pdde_error(s->ctx, PDDE_ERR_OOM, "ps server: out of memory");
    pthread_mutex_init(&run.lock, NULL), pthread_cond_init(&run.cv, NULL);
    atomic_init(&run.failed, 0), atomic_init(&run.busy, 0);
    s->round_n = 0;
    ps_map_free(&s->round_index);
    pdde_status st = PDDE_OK;
    for (int i = 0; i < nw && !st; i++)
        st = pdde_comm_irecv(comm, &run.w[i].hdr, PS_HDR_WORDS, PDDE_I64, s->p.n_servers + i, PS_TAG_REQ, &run.w[i].req);
    if (!st) {
        /* this thread serves too; threads that cannot be made leave the others to it */
        pthread_t th[PS_SERVER_THREADS_MAX];
        int n = 0;
        while (n + 1 < s->p.server_threads && pthread_create(&th[n], NULL, ps_serve_thread, &run) == 0) n++;
        ps_serve_thread(&run);
        for (int k = 0; k < n; k++) pthread_join(th[k], NULL); /* (each returns within the world's timeouts) */
        if ((st = run.st)) pdde_error(s->ctx, st, "%s", run.err); /* (the failing thread's message, on this thread) */
    }
    for (int i = 0; i < nw; i++) {
        if (run.w[i].req) pdde_comm_request_free(run.w[i].req);
        for (int l = 0; l < PS_LANES; l++) free(run.w[i].ids[l]);
    }
    free(run.w);
    pthread_mutex_destroy(&run.lock), pthread_cond_destroy(&run.cv);
    if (!st) st = ps_auto_checkpoint(s, ps_step(s->table), true, false); /* the job's last steps */
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Client */

/* A lane: the scratch of one request in flight (ids and values split by server) and its tags. */
typedef struct {
    int64_t seq;               /* requests sent on this lane */
    size_t *count, *cap;       /* per server */
    uint64_t **ids;
    float **vals;              /* values sent, or rows received */
    int64_t **where;           /* position in the caller's arrays */
    ps_hdr *reply;             /* per server: the reply header, and the posted receives of it and of the rows */
    pdde_comm_request **reply_req, **rows_req;
} ps_lane;

struct pdde_ps_client {
    pdde_context *ctx;
    pdde_comm *comm;           /* NULL: local table */
    pdde_ps_params p;
    pdde_ps_table *local;      /* single-process mode (the table takes its own locks: threads share it) */
    pthread_mutex_t lock;      /* geo: one exchange at a time; sync: one push at a time (a worker's share of a round) */
    pthread_rwlock_t geo_lock; /* geo: the local copy */
    /* requests to the servers: a thread takes a free lane for each (several threads, several in flight) */
    pthread_mutex_t lane_lock;
    pthread_cond_t lane_cv;
    unsigned lanes_busy;       /* a bit a lane */
    int n_lanes;
    double timeout_s;          /* waiting for a free lane */
    ps_lane lane[PS_LANES];
    _Atomic int64_t clock, pushes;
    /* geo: the local copy (id -> row of `cur` and `base`) and the rows touched since the last exchange */
    ps_map geo_index;
    float *geo_cur, *geo_base;
    uint64_t *geo_ids;
    uint8_t *geo_touched;
    size_t geo_n, geo_cap;
    double geo_delta_sum;
    int64_t kill_at_push;      /* PDDE_TEST_PS_KILL_AT_PUSH: die by SIGKILL in the middle of that push (fault tests) */
    int64_t stop_at_push;      /* PDDE_TEST_PS_STOP_AT_PUSH: stop (SIGSTOP) there, its ids sent and its values not (tests) */
};

pdde_status pdde_ps_client_init(pdde_context *ctx, pdde_comm *comm, const pdde_ps_params *p, pdde_ps_client **out) {
    if (!p || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_ps_client_init: no %s", p ? "out" : "params");
    *out = NULL;
    pdde_ps_client *c = calloc(1, sizeof *c);
    if (!c) return pdde_error(ctx, PDDE_ERR_OOM, "ps client: out of memory");
    c->ctx = ctx, c->comm = comm, c->p = *p;
    if (c->p.n_servers <= 0) c->p.n_servers = 1;
    if (c->p.geo_steps <= 0) c->p.geo_steps = 1;
    if (c->p.table.lr == 0) c->p.table.lr = 0.01f;
    const char *kill_at = getenv("PDDE_TEST_PS_KILL_AT_PUSH");
    c->kill_at_push = kill_at ? strtoll(kill_at, NULL, 10) : 0;
    const char *stop_at = getenv("PDDE_TEST_PS_STOP_AT_PUSH");
    c->stop_at_push = stop_at ? strtoll(stop_at, NULL, 10) : 0;
    /* PDDE_PS_LANES=k: at most k requests in flight (1: one at a time, as a single lock would) */
    long lanes;
    pdde_env_int("PDDE_PS_LANES", PS_LANES, 1, PS_LANES, &lanes);
    c->n_lanes = (int)lanes;
    pdde_env_double("PDDE_COMM_TIMEOUT", 300, 1e-3, 86400, &c->timeout_s); /* (as the communicator reads it) */
    atomic_init(&c->clock, 0), atomic_init(&c->pushes, 0);
    pthread_mutex_init(&c->lock, NULL), pthread_mutex_init(&c->lane_lock, NULL), pthread_cond_init(&c->lane_cv, NULL);
    pthread_rwlock_init(&c->geo_lock, NULL);
    pdde_status st = PDDE_OK;
    int ns = c->p.n_servers;
    if (!comm) {
        st = pdde_ps_table_init(ctx, &p->table, &c->local);
        if (!st && p->load_dir) st = ps_load_shard_dir(c->local, p->load_dir, 0, 1);
    }
    else if (pdde_comm_rank(comm) < ns || pdde_comm_size(comm) <= ns)
        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "ps client: rank %d of %d is not a worker (ranks 0..%d are servers)",
                        pdde_comm_rank(comm), pdde_comm_size(comm), ns - 1);
    else if (p->table.dim <= 0) st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "ps client: table dim %d", p->table.dim);
    else if (ns < 1) st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "ps client: %d servers (want >= 1)", ns);
    else for (int l = 0; l < PS_LANES && !st; l++) {
        ps_lane *L = &c->lane[l];
        L->count = calloc((size_t)ns, sizeof *L->count), L->cap = calloc((size_t)ns, sizeof *L->cap);
        L->ids = calloc((size_t)ns, sizeof *L->ids), L->vals = calloc((size_t)ns, sizeof *L->vals);
        L->where = calloc((size_t)ns, sizeof *L->where), L->reply = calloc((size_t)ns, sizeof *L->reply);
        L->reply_req = calloc((size_t)ns, sizeof *L->reply_req), L->rows_req = calloc((size_t)ns, sizeof *L->rows_req);
        if (!L->count || !L->cap || !L->ids || !L->vals || !L->where || !L->reply || !L->reply_req || !L->rows_req)
            st = pdde_error(ctx, PDDE_ERR_OOM, "ps client: out of memory");
    }
    if (st) { c->comm = NULL; pdde_ps_client_free(c); return st; }
    *out = c;
    return PDDE_OK;
}

/* Takes a free lane (waiting at most timeout_s for one); -1 when none came free. */
static int ps_lane_get(pdde_ps_client *c) {
    struct timespec until = cond_deadline(c->timeout_s);
    int lane = -1, rc = 0;
    pthread_mutex_lock(&c->lane_lock);
    while (lane < 0 && rc != ETIMEDOUT) {
        for (int l = 0; l < c->n_lanes && lane < 0; l++)
            if (!(c->lanes_busy & 1u << l)) lane = l;
        if (lane < 0) rc = pthread_cond_timedwait(&c->lane_cv, &c->lane_lock, &until);
    }
    if (lane >= 0) c->lanes_busy |= 1u << lane;
    pthread_mutex_unlock(&c->lane_lock);
    return lane;
}

static void ps_lane_put(pdde_ps_client *c, int lane) {
    pthread_mutex_lock(&c->lane_lock);
    c->lanes_busy &= ~(1u << lane);
    pthread_cond_signal(&c->lane_cv);
    pthread_mutex_unlock(&c->lane_lock);
}

static pdde_status ps_no_lane(pdde_ps_client *c, int op) {
    return pdde_error(c->ctx, PDDE_ERR_TIMEOUT, "ps client: a %s waited %.3g s for one of %d request lanes (all busy: a server is not answering)",
                      ps_op_name(op), c->timeout_s, c->n_lanes);
}

/* Splits ids (and values) by server into the lane's scratch arrays. */
static pdde_status ps_split(pdde_ps_client *c, ps_lane *L, size_t n, const uint64_t *ids, const float *vals) {
    int ns = c->p.n_servers, C = c->p.table.dim;
    memset(L->count, 0, (size_t)ns * sizeof *L->count);
    for (size_t i = 0; i < n; i++) L->count[pdde_ps_shard_of(ids[i], ns)]++;
    for (int s = 0; s < ns; s++) {
        if (L->count[s] <= L->cap[s]) continue;
        size_t cap = L->count[s] * 2;
        uint64_t *ii = realloc(L->ids[s], cap * sizeof *ii);
        if (ii) L->ids[s] = ii;
        float *vv = ii ? realloc(L->vals[s], cap * (size_t)C * sizeof *vv) : NULL;
        if (vv) L->vals[s] = vv;
        int64_t *ww = vv ? realloc(L->where[s], cap * sizeof *ww) : NULL;
        if (!ww) return pdde_error(c->ctx, PDDE_ERR_OOM, "ps client: out of memory (%zu ids)", n);
        L->where[s] = ww, L->cap[s] = cap;
    }
    memset(L->count, 0, (size_t)ns * sizeof *L->count);
    for (size_t i = 0; i < n; i++) {
        int s = pdde_ps_shard_of(ids[i], ns);
        size_t k = L->count[s]++;
        L->ids[s][k] = ids[i], L->where[s][k] = (int64_t)i;
        if (vals) memcpy(L->vals[s] + k * C, vals + i * C, (size_t)C * sizeof(float));
    }
    return PDDE_OK;
}

/* A failed exchange with server s, named: the request and the server (the cause, the transport's
 * message, follows). */
static pdde_status ps_failed(pdde_ps_client *c, pdde_status st, int op, int64_t req, size_t n, int s) {
    char why[512];
    snprintf(why, sizeof why, "%s", pdde_last_error(c->ctx));
    return pdde_error(c->ctx, st, "ps client: %s of %zu ids (request %lld, lane %d) to server %d (rank %d): %s", ps_op_name(op), n,
                      (long long)req, ps_lane_of(req), s, s, why);
}

/* The reply header h of server s to request req: it must echo req (lost: it does not, nothing that
 * follows on the lane can be trusted). */
static pdde_status ps_check_reply(pdde_ps_client *c, int s, int op, int64_t req, size_t n, const ps_hdr *h, bool *lost) {
    if (h->req != req)
        return *lost = true, pdde_error(c->ctx, PDDE_ERR_CORRUPT, "ps client: server %d answered %s request %lld with the reply to request %lld",
                                        s, ps_op_name(op), (long long)req, (long long)h->req);
    if (h->status)
        return pdde_error(c->ctx, (pdde_status)h->status, "ps client: server %d failed %s request %lld of %zu ids (status %lld)", s,
                          ps_op_name(op), (long long)req, n, (long long)h->status);
    return PDDE_OK;
}

/* A request to every server on a free lane: header, ids, values; then each reply (rows into out when
 * pulling). The receives of the replies are posted before the request goes out, so a server's reply
 * never waits for this thread (busy sending to, or waiting on, another server): no server waits on a
 * client, and no cycle of waits forms among servers and a worker's threads. */
static pdde_status ps_request(pdde_ps_client *c, int op, size_t n, const uint64_t *ids, const float *vals, float *out) {
    int ns = c->p.n_servers, C = c->p.table.dim, lane = ps_lane_get(c);
    if (lane < 0) return ps_no_lane(c, op);
    ps_lane *L = &c->lane[lane];
    int64_t req = lane | ++L->seq << 8, clock = atomic_load(&c->clock);
    bool pull = op == PS_PULL;
    memset(L->reply_req, 0, (size_t)ns * sizeof *L->reply_req), memset(L->rows_req, 0, (size_t)ns * sizeof *L->rows_req);
    pdde_status st = ps_split(c, L, n, ids, vals);
    for (int s = 0; s < ns && !st; s++) {
        st = pdde_comm_irecv(c->comm, &L->reply[s], PS_HDR_WORDS, PDDE_I64, s, ps_tag(lane, PS_TAG_REPLY), &L->reply_req[s]);
        if (!st && pull && L->count[s])
            st = pdde_comm_irecv(c->comm, L->vals[s], L->count[s] * C, PDDE_F32, s, ps_tag(lane, PS_TAG_ROWS), &L->rows_req[s]);
        if (st) st = ps_failed(c, st, op, req, L->count[s], s);
    }
    for (int s = 0; s < ns && !st; s++) {
        ps_hdr h = {op, (int64_t)L->count[s], clock, 0, req};
        st = pdde_comm_send(c->comm, &h, PS_HDR_WORDS, PDDE_I64, s, PS_TAG_REQ);
        if (!st && h.n) st = pdde_comm_send(c->comm, L->ids[s], (size_t)h.n, PDDE_I64, s, ps_tag(lane, PS_TAG_IDS));
        if (!st && op == PS_PUSH && c->kill_at_push == atomic_load(&c->pushes) + 1) raise(SIGKILL);
        if (!st && op == PS_PUSH && c->stop_at_push == atomic_load(&c->pushes) + 1) raise(SIGSTOP);
        if (!st && vals && h.n) st = pdde_comm_send(c->comm, L->vals[s], (size_t)h.n * C, PDDE_F32, s, ps_tag(lane, PS_TAG_VALS));
        if (st) st = ps_failed(c, st, op, req, L->count[s], s);
    }
    /* every server's reply is taken, also after one refused the request, so the lane's next request
     * meets no stale reply */
    /* lost: the world failed, or a receive stays posted that would take the lane's next reply (a
     * timeout, a reply that is not this request's): then the world cannot go on (doomed: this client
     * fails it, as a blocking call's timeout does) */
    bool lost = st != PDDE_OK, doomed = st == PDDE_ERR_OOM && L->reply_req[0]; /* (a send fails only in a failed world) */
    for (int s = 0; s < ns && !lost; s++) {
        pdde_status sr = pdde_comm_wait(L->reply_req[s], -1);
        if (sr) doomed = sr == PDDE_ERR_TIMEOUT, sr = ps_failed(c, sr, op, req, L->count[s], s), lost = true;
        if (!sr && (sr = ps_check_reply(c, s, op, req, L->count[s], &L->reply[s], &lost)) && lost) doomed = true;
        if (!sr && pull && L->reply[s].n != (int64_t)L->count[s])
            sr = pdde_error(c->ctx, PDDE_ERR_CORRUPT, "ps client: server %d answered %lld rows for %zu ids", s, (long long)L->reply[s].n,
                            L->count[s]), lost = doomed = true;
        if (!lost && L->rows_req[s]) { /* (rows come after a refusal too: zeros) */
            pdde_status rr = pdde_comm_wait(L->rows_req[s], -1);
            if (rr) doomed = rr == PDDE_ERR_TIMEOUT, sr = ps_failed(c, rr, op, req, L->count[s], s), lost = true;
            for (size_t k = 0; !sr && k < L->count[s]; k++)
                memcpy(out + L->where[s][k] * C, L->vals[s] + k * C, (size_t)C * sizeof(float));
        }
        if (!st) st = sr;
    }
    if (doomed) {
        char why[768];
        snprintf(why, sizeof why, "%s", pdde_last_error(c->ctx));
        pdde_comm_abort(c->comm);
        st = pdde_error(c->ctx, st, "%s", why); /* (this thread's message stays the cause) */
    }
    for (int s = 0; s < ns; s++) pdde_comm_request_free(L->reply_req[s]), pdde_comm_request_free(L->rows_req[s]);
    ps_lane_put(c, lane);
    return st;
}

/* Geo's local copy: threads read it at once and update it one at a time (geo_lock); an exchange holds
 * it only to take the change and to refresh, not while its requests travel. */

/* Geo: pulls the rows of ids not held locally into the local copy. No lock is held while they travel;
 * a row another thread added meanwhile is kept. */
static pdde_status ps_geo_fetch(pdde_ps_client *c, size_t n, const uint64_t *ids) {
    int C = c->p.table.dim;
    uint64_t *miss = NULL;
    size_t m = 0;
    bool oom = false;
    pthread_rwlock_rdlock(&c->geo_lock);
    for (size_t i = 0; i < n && !oom; i++) {
        if (ps_map_find(&c->geo_index, ids[i])) continue;
        if (!miss && !(miss = malloc(n * sizeof *miss))) oom = true;
        else miss[m++] = ids[i];
    }
    pthread_rwlock_unlock(&c->geo_lock);
    if (oom) return pdde_error(c->ctx, PDDE_ERR_OOM, "ps client: out of memory");
    if (!m) return PDDE_OK;
    float *rows = malloc(m * C * sizeof(float));
    pdde_status st = rows ? ps_request(c, PS_PULL, m, miss, NULL, rows) : pdde_error(c->ctx, PDDE_ERR_OOM, "ps client: out of memory");
    bool locked = !st;
    if (locked) pthread_rwlock_wrlock(&c->geo_lock);
    for (size_t k = 0; k < m && !st; k++) {
        if (ps_map_find(&c->geo_index, miss[k])) continue; /* (added meanwhile, or twice in ids) */
        if (c->geo_n == c->geo_cap) {
            size_t cap = c->geo_cap ? 2 * c->geo_cap : 1024;
            float *cur = realloc(c->geo_cur, cap * C * sizeof(float));
            if (cur) c->geo_cur = cur;
            float *base = cur ? realloc(c->geo_base, cap * C * sizeof(float)) : NULL;
            if (base) c->geo_base = base;
            uint64_t *gi = base ? realloc(c->geo_ids, cap * sizeof *gi) : NULL;
            if (gi) c->geo_ids = gi;
            uint8_t *tt = gi ? realloc(c->geo_touched, cap) : NULL;
            if (!tt) { st = pdde_error(c->ctx, PDDE_ERR_OOM, "ps client: out of memory (geo copy)"); break; }
            c->geo_touched = tt, c->geo_cap = cap;
        }
        if (!ps_map_insert(&c->geo_index, miss[k], (uint32_t)c->geo_n)) { st = pdde_error(c->ctx, PDDE_ERR_OOM, "ps client: out of memory"); break; }
        size_t r = c->geo_n++;
        c->geo_ids[r] = miss[k], c->geo_touched[r] = 0;
        memcpy(c->geo_cur + r * C, rows + k * C, C * sizeof(float));
        memcpy(c->geo_base + r * C, rows + k * C, C * sizeof(float));
    }
    if (locked) pthread_rwlock_unlock(&c->geo_lock);
    free(rows), free(miss);
    return st;
}

/* Geo: sends (local - base) of the touched rows, then refreshes them from the servers. One exchange at a
 * time (lock): a refresh must not be overwritten by an older one. Pulls and pushes go on beside it: a
 * row's change made after the exchange took it stays in the copy on top of the refreshed row. */
static pdde_status ps_geo_exchange(pdde_ps_client *c) {
    struct timespec until = cond_deadline(c->timeout_s);
    if (pthread_mutex_timedlock(&c->lock, &until))
        return pdde_error(c->ctx, PDDE_ERR_TIMEOUT, "ps client: a geo exchange waited %.3g s for the one in flight", c->timeout_s);
    int C = c->p.table.dim;
    pthread_rwlock_wrlock(&c->geo_lock);
    size_t m = 0, k = 0;
    for (size_t r = 0; r < c->geo_n; r++) m += c->geo_touched[r];
    uint64_t *ids = calloc(m ? m : 1, sizeof *ids);
    float *d = malloc((m ? m : 1) * C * sizeof(float)), *taken = malloc((m ? m : 1) * C * sizeof(float));
    pdde_status st = ids && d && taken ? PDDE_OK : pdde_error(c->ctx, PDDE_ERR_OOM, "ps client: out of memory");
    for (size_t r = 0; r < c->geo_n && !st; r++) { /* the change, and each row as it was when taken */
        if (!c->geo_touched[r]) continue;
        ids[k] = c->geo_ids[r];
        for (int j = 0; j < C; j++) d[k * C + j] = c->geo_cur[r * C + j] - c->geo_base[r * C + j];
        memcpy(taken + k * C, c->geo_cur + r * C, C * sizeof(float));
        c->geo_touched[r] = 0;
        k++;
    }
    pthread_rwlock_unlock(&c->geo_lock);
    bool added = false;
    if (!st) st = ps_request(c, PS_ADD, m, ids, d, NULL);
    if (!st) {
        added = true;
        for (size_t j = 0; j < m * C; j++) c->geo_delta_sum += d[j];
        c->clock++;
        st = ps_request(c, PS_PULL, m, ids, NULL, d);
    }
    pthread_rwlock_wrlock(&c->geo_lock);
    for (size_t j = 0; j < k; j++) {
        size_t r = *ps_map_find(&c->geo_index, ids[j]);
        float *cur = c->geo_cur + r * C, *base = c->geo_base + r * C;
        if (!added) c->geo_touched[r] = 1; /* (not sent: the change stays pending) */
        else if (st) memcpy(base, taken + j * C, C * sizeof(float)); /* (sent, not refreshed: the base is what was sent) */
        else
            for (int q = 0; q < C; q++) { /* refreshed: the server's row, plus what changed here since it was taken */
                float since = cur[q] - taken[j * C + q];
                base[q] = d[j * C + q], cur[q] = d[j * C + q] + since;
            }
    }
    pthread_rwlock_unlock(&c->geo_lock);
    pthread_mutex_unlock(&c->lock);
    free(ids), free(d), free(taken);
    return st;
}

/* Geo: local SGD on the copy; every geo_steps pushes (of all threads) the exchange. */
static pdde_status ps_geo_push(pdde_ps_client *c, size_t n, const uint64_t *ids, const float *grads) {
    int C = c->p.table.dim;
    float lr = c->p.table.lr;
    pdde_status st = ps_geo_fetch(c, n, ids);
    if (st) return st;
    pthread_rwlock_wrlock(&c->geo_lock);
    for (size_t i = 0; i < n; i++) {
        uint32_t r = *ps_map_find(&c->geo_index, ids[i]);
        for (int j = 0; j < C; j++) c->geo_cur[(size_t)r * C + j] -= lr * grads[i * C + j];
        c->geo_touched[r] = 1;
    }
    pthread_rwlock_unlock(&c->geo_lock);
    if ((atomic_fetch_add(&c->pushes, 1) + 1) % c->p.geo_steps == 0) st = ps_geo_exchange(c);
    return st;
}

/* Sync and async requests go on lanes, at once; geo reads its local copy. */
pdde_status pdde_ps_client_pull(pdde_ps_client *c, size_t n, const uint64_t *ids, float *out) {
    if (!c || (n && (!ids || !out))) return pdde_error(c ? c->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_client_pull: no %s", !c ? "client" : !ids ? "ids" : "out");
    if (!c->comm) return pdde_ps_table_pull(c->local, n, ids, out);
    if (c->p.mode != PDDE_PS_GEO) return ps_request(c, PS_PULL, n, ids, NULL, out);
    int C = c->p.table.dim;
    pdde_status st = ps_geo_fetch(c, n, ids);
    if (st) return st;
    pthread_rwlock_rdlock(&c->geo_lock);
    for (size_t i = 0; i < n; i++)
        memcpy(out + i * C, c->geo_cur + (size_t)*ps_map_find(&c->geo_index, ids[i]) * C, C * sizeof(float));
    pthread_rwlock_unlock(&c->geo_lock);
    return st;
}

pdde_status pdde_ps_client_push(pdde_ps_client *c, size_t n, const uint64_t *ids, const float *grads) {
    if (!c || (n && (!ids || !grads))) return pdde_error(c ? c->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_client_push: no %s", !c ? "client" : !ids ? "ids" : "gradients");
    if (!c->comm) {
        pdde_status st = pdde_ps_table_push(c->local, n, ids, grads, 1.0f);
        if (!st) c->pushes++;
        return st;
    }
    if (c->p.mode == PDDE_PS_GEO) return ps_geo_push(c, n, ids, grads);
    /* async: pushes of several threads in flight at once; sync: a worker's push is its share of a
     * round, so its pushes go one at a time (its pulls meanwhile go on) */
    bool one_at_a_time = c->p.mode == PDDE_PS_SYNC;
    if (one_at_a_time) pthread_mutex_lock(&c->lock);
    pdde_status st = ps_request(c, PS_PUSH, n, ids, grads, NULL);
    if (!st) {
        c->clock++;
        c->pushes++;
    }
    if (one_at_a_time) pthread_mutex_unlock(&c->lock);
    return st;
}

pdde_status pdde_ps_client_set(pdde_ps_client *c, size_t n, const uint64_t *ids, const float *vals) {
    if (!c || (n && (!ids || !vals))) return pdde_error(c ? c->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_client_set: no %s", !c ? "client" : !ids ? "ids" : "values");
    if (!c->comm) return pdde_ps_table_set(c->local, n, ids, vals);
    return ps_request(c, PS_SET, n, ids, vals, NULL);
}

pdde_status pdde_ps_client_flush(pdde_ps_client *c) {
    if (!c) return PDDE_ERR_INVALID_ARG;
    return c->comm && c->p.mode == PDDE_PS_GEO ? ps_geo_exchange(c) : PDDE_OK;
}

/* A request that carries no ids to one server or every one (SAVE carries its path), on a free lane. */
static pdde_status ps_command(pdde_ps_client *c, int op, const char *path, int server, void *out) {
    size_t len = path ? strlen(path) : 0, words = len / 8 + 1;
    int64_t *buf = path ? calloc(words, 8) : NULL;
    if (path && !buf) return pdde_error(c->ctx, PDDE_ERR_OOM, "ps client: out of memory");
    if (path) memcpy(buf, path, len);
    int lane = ps_lane_get(c);
    if (lane < 0) { free(buf); return ps_no_lane(c, op); }
    int64_t req = lane | ++c->lane[lane].seq << 8;
    pdde_status st = PDDE_OK;
    int first = server < 0 ? 0 : server, last = server < 0 ? c->p.n_servers - 1 : server;
    for (int s = first; s <= last && !st; s++) {
        ps_hdr h = {op, (int64_t)len, atomic_load(&c->clock), 0, req};
        st = pdde_comm_send(c->comm, &h, PS_HDR_WORDS, PDDE_I64, s, PS_TAG_REQ);
        if (!st && path) st = pdde_comm_send(c->comm, buf, words, PDDE_I64, s, ps_tag(lane, PS_TAG_IDS));
        if (st) st = ps_failed(c, st, op, req, 0, s);
    }
    bool lost = false;
    for (int s = first; s <= last && !st && op != PS_BYE; s++) {
        ps_hdr h = {0};
        st = pdde_comm_recv(c->comm, &h, PS_HDR_WORDS, PDDE_I64, s, ps_tag(lane, PS_TAG_REPLY));
        if (st) st = ps_failed(c, st, op, req, 0, s);
        else st = ps_check_reply(c, s, op, req, 0, &h, &lost);
        if (!st && out) {
            int64_t words_in[PS_STATS_WORDS];
            st = pdde_comm_recv(c->comm, words_in, PS_STATS_WORDS, PDDE_I64, s, ps_tag(lane, PS_TAG_ROWS));
            if (st) st = ps_failed(c, st, op, req, 0, s);
            else memcpy(out, words_in, sizeof(pdde_ps_server_stats));
        }
    }
    ps_lane_put(c, lane);
    free(buf);
    return st;
}

pdde_status pdde_ps_client_save(pdde_ps_client *c, const char *dir) {
    if (!c || !dir) return pdde_error(c ? c->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_client_save: no %s", c ? "directory" : "client");
    if (c->comm) return ps_command(c, PS_SAVE, dir, -1, NULL);
    char path[4096];
    pdde_ps_shard_path(path, sizeof path, dir, 0, 1);
    return pdde_ps_table_save(c->local, path);
}

pdde_status pdde_ps_client_server_stats(pdde_ps_client *c, int index, pdde_ps_server_stats *out) {
    if (!c || !out) return pdde_error(c ? c->ctx : NULL, PDDE_ERR_INVALID_ARG, "pdde_ps_client_server_stats: no %s", c ? "out" : "client");
    memset(out, 0, sizeof *out);
    if (index < 0 || index >= c->p.n_servers)
        return pdde_error(c->ctx, PDDE_ERR_INVALID_ARG, "ps client: server %d of %d", index, c->p.n_servers);
    if (c->comm) return ps_command(c, PS_STATS, NULL, index, out);
    pdde_ps_table_stats_get(c->local, &out->table);
    return PDDE_OK;
}

double pdde_ps_client_geo_delta_sum(const pdde_ps_client *c) { return c->geo_delta_sum; }

void pdde_ps_client_free(pdde_ps_client *c) {
    if (!c) return;
    if (c->comm && pdde_comm_status(c->comm) == PDDE_OK) {
        if (c->p.mode == PDDE_PS_GEO) pdde_ps_client_flush(c);
        ps_command(c, PS_BYE, NULL, -1, NULL);
    }
    pdde_ps_table_free(c->local);
    for (int l = 0; l < PS_LANES; l++) {
        ps_lane *L = &c->lane[l];
        for (int s = 0; L->ids && s < c->p.n_servers; s++) free(L->ids[s]), free(L->vals[s]), free(L->where[s]);
        free(L->ids), free(L->vals), free(L->where), free(L->count), free(L->cap), free(L->reply), free(L->reply_req), free(L->rows_req);
    }
    ps_map_free(&c->geo_index);
    free(c->geo_cur), free(c->geo_base), free(c->geo_ids), free(c->geo_touched);
    pthread_mutex_destroy(&c->lock), pthread_mutex_destroy(&c->lane_lock), pthread_cond_destroy(&c->lane_cv);
    pthread_rwlock_destroy(&c->geo_lock);
    free(c);
}

#endif /* PDDE_COMM_PS_C */
