/* backends/gpu_graph.h — when a stream's work may be replayed as a recorded graph (CUDA graphs), decided
 * without a device.
 *
 * What the executor enqueues on a stream between two host-visible operations (a read, a write, an event, a
 * synchronisation) is a segment: a sequence of operations, each summarised by a key. A node's key covers
 * what its launches depend on: the node and its sources (their identity, op, dtype, shape, flags, op
 * parameters and device addresses), but not the parameters the executor sets anew each step (the
 * learning rate, the step of the bias corrections, the gradient scale, the dropout counter: the "per-step"
 * slots). So a step whose program, shapes and buffer addresses are those of the last one gives the same
 * keys, and a shape change, a new program or a moved buffer gives others.
 *
 * A segment also ends after PGD_GRAPH_MAX_OPS operations. A stream keeps up to PGD_GRAPH_SLOTS segments it has seen (least recently used replaced). A segment is
 * found by its first key; then:
 *   - not seen before, or not alike its last two runs: PLAIN (run as without graphs, keys recorded);
 *   - run twice alike (repeats): CAPTURE (recorded into a graph, launched; kept if the keys are alike again);
 *   - a graph kept: REPLAY. Each operation is compared with the recorded key at its position and deferred;
 *     at the segment's end, all alike, the graph is launched (its per-step arguments patched, see the
 *     backend). An operation that differs, or a segment that ends early or runs longer, diverges: the
 *     deferred operations run as without graphs, the graph is dropped and the segment is PLAIN again.
 * The backend owns the graphs; this file owns only the keys and the decisions, so a unit test checks them. */
#ifndef PDDE_GPU_GRAPH_H
#define PDDE_GPU_GRAPH_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../pdde_extension.h" /* (the named op parameters) */

#define PGD_GRAPH_SLOTS 16
/* A segment is closed after this many operations (the next opens another): a replay then launches its first
 * part while the host still compares the keys of the next, instead of leaving the device idle until a whole
 * step is keyed. */
#define PGD_GRAPH_MAX_OPS 256

/* ---- keys ---- */

static inline uint64_t pgd_graph_mix(uint64_t h, uint64_t v) { /* (splitmix64's finaliser over h ^ v) */
    uint64_t z = (h ^ v) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* t's op parameters with the per-step slots (those the executor sets before each run) zeroed; returns
 * whether t has any. */
static inline int pgd_graph_params(const pdde_tensor *t, int32_t ip[8], float fp[8]) {
    memcpy(ip, t->iparams, sizeof t->iparams), memcpy(fp, t->fparams, sizeof t->fparams);
    switch (t->op) {
    case PDDE_OP_DROPOUT:
    case PDDE_OP_DROPOUT_BACK: ip[PDDE_P_DROPOUT_COUNTER] = 0; return 1;
    case PDDE_OP_SGD_UPDATE:
    case PDDE_OP_ADAMW_UPDATE:
        ip[PDDE_P_UPDATE_STEP] = 0, fp[PDDE_P_UPDATE_LR] = 0, fp[PDDE_P_UPDATE_GRAD_SCALE] = 0;
        return 1;
    case PDDE_OP_GRAD_NORM_SQ: fp[PDDE_P_UPDATE_GRAD_SCALE] = 0; return 1;
    default: return 0;
    }
}

/* One tensor's part of a key (and whether it has per-step parameters). */
static inline uint64_t pgd_graph_tensor_key(uint64_t h, const pdde_tensor *t, int *per_step) {
    int32_t ip[8];
    float fp[8];
    int ps = pgd_graph_params(t, ip, fp);
    if (per_step) *per_step |= ps;
    h = pgd_graph_mix(h, (uint64_t)(uintptr_t)t);
    h = pgd_graph_mix(h, (uint64_t)t->op | (uint64_t)t->dtype << 16 | (uint64_t)(uint32_t)t->ndim << 32 | (uint64_t)(uint32_t)t->nsrc << 48);
    for (int d = 0; d < t->ndim && d < PDDE_MAX_DIMS; d++) h = pgd_graph_mix(h, (uint64_t)t->shape[d]);
    h = pgd_graph_mix(h, t->flags);
    for (int k = 0; k < 8; k++) {
        uint32_t f;
        memcpy(&f, &fp[k], sizeof f);
        h = pgd_graph_mix(h, (uint64_t)(uint32_t)ip[k] | (uint64_t)f << 32);
    }
    h = pgd_graph_mix(h, (uint64_t)(uintptr_t)t->data);
    return pgd_graph_mix(h, (uint64_t)t->offset);
}

/* A node's key: the node and its sources; *per_step (may be NULL): whether a per-step slot of the node's
 * own reaches its kernels (then the backend patches their arguments on a replay). */
static inline uint64_t pgd_graph_node_key(const pdde_tensor *t, int *per_step) {
    int own = 0;
    uint64_t h = pgd_graph_tensor_key(1, t, &own);
    for (int k = 0; k < t->nsrc && k < PDDE_MAX_SRC; k++) h = t->src[k] ? pgd_graph_tensor_key(h, t->src[k], NULL) : pgd_graph_mix(h, 0);
    if (per_step) *per_step = own;
    return h | 1; /* (never 0: 0 is "none") */
}

/* The key of a group of nodes in one launch (pdde_backend_iface.compute_group); declined: the backend
 * declined it (the nodes then come one by one), a different key. */
static inline uint64_t pgd_graph_group_key(pdde_tensor *const *nodes, int n, int declined, int *per_step) {
    uint64_t h = pgd_graph_mix(2, (uint64_t)n << 1 | (uint64_t)!!declined);
    int any = 0;
    for (int i = 0; i < n; i++) {
        int ps = 0;
        h = pgd_graph_mix(h, pgd_graph_node_key(nodes[i], &ps));
        any |= ps;
    }
    if (per_step) *per_step = any;
    return h | 1;
}

/* The key of a device-to-device copy (addresses and size). */
static inline uint64_t pgd_graph_copy_key(uint64_t dst, uint64_t src, uint64_t nbytes) {
    return pgd_graph_mix(pgd_graph_mix(pgd_graph_mix(3, dst), src), nbytes) | 1;
}

/* ---- decisions ---- */

typedef enum { PGD_GRAPH_IDLE, PGD_GRAPH_PLAIN, PGD_GRAPH_CAPTURE, PGD_GRAPH_REPLAY } pgd_graph_mode;
/* pgd_graph_op's answers */
enum { PGD_GRAPH_RUN = 0, PGD_GRAPH_DEFER = 1, PGD_GRAPH_DIVERGE = 2, PGD_GRAPH_NOMEM = -1 };
/* pgd_graph_close's answers: what the backend does at the segment's end */
typedef enum {
    PGD_GRAPH_DONE,    /* nothing (no segment, or a PLAIN one) */
    PGD_GRAPH_KEEP,    /* CAPTURE: instantiate, launch and keep the graph */
    PGD_GRAPH_DISCARD, /* CAPTURE: instantiate and launch it, then drop it (the keys were not alike) */
    PGD_GRAPH_LAUNCH,  /* REPLAY: every key alike: launch the kept graph */
    PGD_GRAPH_FALLBACK /* REPLAY diverged at the end: run the deferred operations, drop the graph */
} pgd_graph_action;

typedef struct {
    uint64_t *keys;
    int n, cap;
    int repeats;  /* the last two runs recorded these keys */
    int has_exec; /* a graph is kept for them */
    uint64_t used;
} pgd_graph_slot;

typedef struct {
    pgd_graph_slot slot[PGD_GRAPH_SLOTS];
    int cur, pos; /* the open segment's slot; REPLAY: the keys matched so far */
    pgd_graph_mode mode;
    uint64_t *rec; /* PLAIN, CAPTURE: this run's keys */
    int n_rec, cap_rec;
    uint64_t clock;
} pgd_graph_tracker;

static inline void pgd_graph_tracker_free(pgd_graph_tracker *tr) {
    for (int i = 0; i < PGD_GRAPH_SLOTS; i++) free(tr->slot[i].keys);
    free(tr->rec);
    memset(tr, 0, sizeof *tr);
}

static inline int pgd_graph_push(pgd_graph_tracker *tr, uint64_t key) {
    if (tr->n_rec == tr->cap_rec) {
        int cap = tr->cap_rec ? 2 * tr->cap_rec : 256;
        uint64_t *r = realloc(tr->rec, (size_t)cap * sizeof *r);
        if (!r) return PGD_GRAPH_NOMEM;
        tr->rec = r, tr->cap_rec = cap;
    }
    tr->rec[tr->n_rec++] = key;
    return PGD_GRAPH_RUN;
}

/* Opens a segment whose first operation has key; returns its mode. *drop: the slot's graph (if any) is to be
 * destroyed (the slot is taken for another segment). */
static inline pgd_graph_mode pgd_graph_open(pgd_graph_tracker *tr, uint64_t key, int *drop) {
    int hit = -1, lru = 0;
    *drop = 0;
    for (int i = 0; i < PGD_GRAPH_SLOTS && hit < 0; i++) {
        if (tr->slot[i].n && tr->slot[i].keys[0] == key) hit = i;
        if (tr->slot[i].used < tr->slot[lru].used) lru = i;
    }
    tr->clock++;
    tr->n_rec = 0, tr->pos = 0;
    if (hit < 0) { /* a segment not seen (lately): the least recently used slot, emptied */
        pgd_graph_slot *s = &tr->slot[lru];
        *drop = s->has_exec;
        s->n = 0, s->repeats = 0, s->has_exec = 0, s->used = tr->clock;
        tr->cur = lru;
        return tr->mode = PGD_GRAPH_PLAIN;
    }
    pgd_graph_slot *s = &tr->slot[hit];
    s->used = tr->clock;
    tr->cur = hit;
    return tr->mode = s->has_exec ? PGD_GRAPH_REPLAY : s->repeats ? PGD_GRAPH_CAPTURE : PGD_GRAPH_PLAIN;
}

/* REPLAY -> PLAIN: the keys matched so far become this run's record, the graph is dropped (the caller
 * destroys it and runs the deferred operations). */
static inline int pgd_graph_diverge(pgd_graph_tracker *tr) {
    pgd_graph_slot *s = &tr->slot[tr->cur];
    s->has_exec = 0, s->repeats = 0;
    tr->mode = PGD_GRAPH_PLAIN, tr->n_rec = 0;
    for (int i = 0; i < tr->pos; i++)
        if (pgd_graph_push(tr, s->keys[i])) return PGD_GRAPH_NOMEM;
    return PGD_GRAPH_DIVERGE;
}

/* The key the open REPLAY segment expects next (0: none). */
static inline uint64_t pgd_graph_expected(const pgd_graph_tracker *tr) {
    const pgd_graph_slot *s = &tr->slot[tr->cur];
    return tr->mode == PGD_GRAPH_REPLAY && tr->pos < s->n ? s->keys[tr->pos] : 0;
}

/* The next operation of the open segment: REPLAY: DEFER when alike, else DIVERGE (the deferred operations
 * run, then this one; the segment goes on PLAIN); PLAIN, CAPTURE: RUN (recorded). */
static inline int pgd_graph_op(pgd_graph_tracker *tr, uint64_t key) {
    if (tr->mode == PGD_GRAPH_REPLAY) {
        if (pgd_graph_expected(tr) == key) {
            tr->pos++;
            return PGD_GRAPH_DEFER;
        }
        int r = pgd_graph_diverge(tr);
        return r == PGD_GRAPH_DIVERGE && pgd_graph_push(tr, key) ? PGD_GRAPH_NOMEM : r;
    }
    return tr->mode == PGD_GRAPH_IDLE ? PGD_GRAPH_RUN : pgd_graph_push(tr, key);
}

/* Whether the open segment has its PGD_GRAPH_MAX_OPS operations (the backend closes it). */
static inline int pgd_graph_full(const pgd_graph_tracker *tr) {
    int n = tr->mode == PGD_GRAPH_REPLAY ? tr->pos : tr->mode == PGD_GRAPH_IDLE ? 0 : tr->n_rec;
    return n >= PGD_GRAPH_MAX_OPS;
}

/* Replaces the last recorded key (an operation that turned out otherwise: a declined group). */
static inline void pgd_graph_rekey(pgd_graph_tracker *tr, uint64_t key) {
    if ((tr->mode == PGD_GRAPH_PLAIN || tr->mode == PGD_GRAPH_CAPTURE) && tr->n_rec) tr->rec[tr->n_rec - 1] = key;
}

/* This run's record becomes the slot's keys; returns whether they were alike. */
static inline int pgd_graph_settle(pgd_graph_tracker *tr) {
    pgd_graph_slot *s = &tr->slot[tr->cur];
    int alike = s->n == tr->n_rec && !memcmp(s->keys, tr->rec, (size_t)tr->n_rec * sizeof *tr->rec);
    if (!alike) { /* (swap the arrays: no copy) */
        uint64_t *k = s->keys;
        int cap = s->cap;
        s->keys = tr->rec, s->cap = tr->cap_rec, s->n = tr->n_rec;
        tr->rec = k, tr->cap_rec = cap;
    }
    tr->n_rec = 0;
    return alike;
}

/* Closes the open segment (a host-visible operation follows); says what the backend does. */
static inline pgd_graph_action pgd_graph_close(pgd_graph_tracker *tr) {
    pgd_graph_mode m = tr->mode;
    pgd_graph_slot *s = &tr->slot[tr->cur];
    tr->mode = PGD_GRAPH_IDLE;
    switch (m) {
    case PGD_GRAPH_PLAIN: s->repeats = pgd_graph_settle(tr) && s->n > 0; return PGD_GRAPH_DONE;
    case PGD_GRAPH_CAPTURE: {
        int alike = pgd_graph_settle(tr);
        s->has_exec = alike, s->repeats = alike;
        return alike ? PGD_GRAPH_KEEP : PGD_GRAPH_DISCARD;
    }
    case PGD_GRAPH_REPLAY:
        if (tr->pos == s->n) return PGD_GRAPH_LAUNCH;
        tr->mode = PGD_GRAPH_REPLAY; /* (ended early: what was deferred runs, the slot records it) */
        if (pgd_graph_diverge(tr) == PGD_GRAPH_NOMEM) s->n = 0;
        else pgd_graph_settle(tr);
        tr->mode = PGD_GRAPH_IDLE;
        return PGD_GRAPH_FALLBACK;
    default: return PGD_GRAPH_DONE;
    }
}

/* The backend could not keep or use the open segment's graph (a capture or a patch failed): the slot starts
 * over (PLAIN twice before the next capture). */
static inline void pgd_graph_abandon(pgd_graph_tracker *tr) {
    pgd_graph_slot *s = &tr->slot[tr->cur];
    s->has_exec = 0, s->repeats = 0;
}

#endif /* PDDE_GPU_GRAPH_H */
