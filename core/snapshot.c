/* core/snapshot.c — sharded checkpoints and in-memory snapshots: each rank's blocks of the state with
 * their boxes in the global tensors, a manifest naming which file holds which block, and restoring
 * under any other plan from the blocks that overlap what a rank holds (format in pdde.h).
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

/* ================================================================================================
 * A snapshot's bytes (little-endian; a shard file is exactly these):
 *   "PDDESHRD" u32 version u32 rank u32 world u32 n_blocks u64 step u64 data_position u64 rng[2]
 *   schedule (u32 kind, f32 lr, f32 min_lr_ratio, i64 warmup_steps, i64 total_steps) u32 flags
 *   u64 index_bytes u64 total_bytes, then the index, then u32 crc32 of everything before it; the
 *   blocks' data after that (each at the offset its entry says, 8-byte aligned).
 *   Index entry: u16 name_len, name, u8 dtype, u8 ndim, u8 primary, u8 0, i64 shape[ndim] (global),
 *   i64 start[ndim], i64 extent[ndim] (the block's box), u16 attr_len, attr, u64 offset, u64 nbytes,
 *   u32 crc32 of the block's data. */

#define SNAP_MAGIC "PDDESHRD"
#define SNAP_VERSION 1u
#define SNAP_HEADER 104u
#define SNAP_ATTR 512
#define SNAP_MANIFEST "manifest"
#define SNAP_MANIFEST_HEAD "pdde sharded checkpoint 1"
#define SNAP_TAG 0xFFFF0 /* point-to-point tags of a save (none of a step's: those are below 2^20 - 16) */

typedef struct {
    int64_t start[PDDE_MAX_DIMS], extent[PDDE_MAX_DIMS];
} snap_box;

/* What a snapshot or a checkpoint says besides its blocks. */
typedef struct {
    uint64_t step, pos, rng[2], generation;
    pdde_optimizer_params sched;
    int world, rank;
    uint32_t flags;
} snap_meta;

typedef struct {
    char name[64];
    pdde_dtype dtype;
    int ndim;
    int64_t shape[PDDE_MAX_DIMS];
    char attr[SNAP_ATTR];
} snap_tensor;

/* One block: a box of one tensor, and where its bytes are (source src: a file or a snapshot). */
typedef struct {
    int tensor, src, rank;
    bool primary; /* no lower rank holds this box */
    uint64_t offset, nbytes;
    uint32_t crc;
    snap_box box;
} snap_block;

/* What a checkpoint directory or a set of snapshots holds, and where. */
typedef struct {
    pdde_context *ctx;
    char what[4200];      /* for messages: "checkpoint DIR" or "snapshot set" */
    snap_meta meta;
    snap_tensor *t;
    int nt, cap_t;
    snap_block *b;
    int nb, cap_b;
    int *first; /* once indexed (set_index): tensor t's blocks are b[first[t]] .. b[first[t + 1] - 1] */
    /* sources: the shard files of a directory (name, bytes, descriptor opened on first read) or
     * snapshots in memory */
    char dir[4096];
    int nsrc;
    char (*file)[64];
    uint64_t *file_bytes;
    int *fd;
    const pdde_snapshot *const *snap;
} snap_set;

struct pdde_snapshot {
    pdde_context *ctx;
    unsigned char *data;
    size_t size;
    snap_meta meta;
    int n_blocks, n_primary;
    /* a taken snapshot's CRCs are computed when first needed (its bytes handed out, saved, restored):
     * taking it is a copy only, and a save computes them on its writer thread */
    pthread_mutex_t seal_lock;
    bool sealed;
    void *items;          /* until sealed: its snap_items, and the snap_tensors they point to */
    void *tensors;
};

/* ------------------------------------------------------------------------------------------------
 * Little helpers */

static int64_t box_numel(const snap_box *b, int ndim) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= b->extent[d];
    return n;
}

/* The intersection of a and b (false when empty). */
static bool box_intersect(const snap_box *a, const snap_box *b, int ndim, snap_box *out) {
    for (int d = 0; d < ndim; d++) {
        int64_t lo = a->start[d] > b->start[d] ? a->start[d] : b->start[d];
        int64_t ha = a->start[d] + a->extent[d], hb = b->start[d] + b->extent[d];
        int64_t hi = ha < hb ? ha : hb;
        if (hi <= lo) return false;
        out->start[d] = lo, out->extent[d] = hi - lo;
    }
    return true;
}

static bool box_equal(const snap_box *a, const snap_box *b, int ndim) {
    for (int d = 0; d < ndim; d++)
        if (a->start[d] != b->start[d] || a->extent[d] != b->extent[d]) return false;
    return true;
}

static int box_str(const snap_box *b, int ndim, char *buf, size_t n) {
    int k = 0;
    if (n) buf[0] = 0;
    k += snprintf(buf, n, "[");
    for (int d = 0; d < ndim && (size_t)k < n; d++) {
        int64_t end; /* (a damaged file's box may end past int64: said as start+extent, not wrapped) */
        if (__builtin_add_overflow(b->start[d], b->extent[d], &end))
            k += snprintf(buf + k, n - (size_t)k, "%s%lld+%lld", d ? "," : "", (long long)b->start[d], (long long)b->extent[d]);
        else
            k += snprintf(buf + k, n - (size_t)k, "%s%lld:%lld", d ? "," : "", (long long)b->start[d], (long long)end);
    }
    if ((size_t)k < n) k += snprintf(buf + k, n - (size_t)k, "]");
    return k;
}

/* Copies box `in` (inside both) from src (holding box sb) to dst (holding box db), row-major. */
static void box_copy(char *dst, const snap_box *db, const char *src, const snap_box *sb, const snap_box *in, int ndim, size_t esz) {
    if (ndim == 0) { memcpy(dst, src, esz); return; }
    int64_t dstr[PDDE_MAX_DIMS], sstr[PDDE_MAX_DIMS], idx[PDDE_MAX_DIMS] = {0};
    int64_t ds = 1, ss = 1;
    for (int d = ndim - 1; d >= 0; d--) dstr[d] = ds, sstr[d] = ss, ds *= db->extent[d], ss *= sb->extent[d];
    size_t run = (size_t)in->extent[ndim - 1] * esz;
    int64_t rows = box_numel(in, ndim) / in->extent[ndim - 1];
    for (int64_t r = 0; r < rows; r++) {
        int64_t doff = 0, soff = 0;
        for (int d = 0; d < ndim; d++) {
            int64_t g = in->start[d] + (d < ndim - 1 ? idx[d] : 0);
            doff += (g - db->start[d]) * dstr[d], soff += (g - sb->start[d]) * sstr[d];
        }
        memcpy(dst + (size_t)doff * esz, src + (size_t)soff * esz, run);
        for (int d = ndim - 2; d >= 0; d--) { /* the next row */
            if (++idx[d] < in->extent[d]) break;
            idx[d] = 0;
        }
    }
}

typedef struct {
    unsigned char *p;
    size_t n, cap;
    bool oom;
} snap_buf;

static void sb_put(snap_buf *b, const void *p, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) { b->oom = true; return; }
        b->p = q, b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

/* A bounds-checked reader over bytes. */
typedef struct {
    const unsigned char *p;
    size_t n, at;
    bool bad;
} snap_rd;

static void rd_get(snap_rd *r, void *out, size_t n) {
    if (r->bad || n > r->n - r->at) { r->bad = true; memset(out, 0, n); return; }
    memcpy(out, r->p + r->at, n);
    r->at += n;
}

/* A global shape a reader can trust: every dim >= 1, at most 2^48 elements in all (no product of
 * untrusted dims overflows). */
static bool shape_ok(const int64_t *shape, int ndim) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 1 || shape[d] > (INT64_C(1) << 48) / n) return false;
        n *= shape[d];
    }
    return true;
}

/* ------------------------------------------------------------------------------------------------
 * Sets: tensors and blocks */

static void set_free(snap_set *s) {
    for (int i = 0; s->fd && i < s->nsrc; i++)
        if (s->fd[i] >= 0) close(s->fd[i]);
    free(s->t), free(s->b), free(s->first), free(s->file), free(s->file_bytes), free(s->fd);
    memset(s, 0, sizeof *s);
}

static int set_find(const snap_set *s, const char *name) {
    for (int i = 0; i < s->nt; i++)
        if (strcmp(s->t[i].name, name) == 0) return i;
    return -1;
}

/* Adds tensor *t, or finds it (then its dtype and shape must agree): its index in *idx. */
static pdde_status set_tensor(snap_set *s, const snap_tensor *t, int *idx) {
    int i = set_find(s, t->name);
    if (i >= 0) {
        bool same = s->t[i].dtype == t->dtype && s->t[i].ndim == t->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = s->t[i].shape[d] == t->shape[d];
        if (!same) return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: tensor %s is described twice with other dtypes or shapes", s->what, t->name);
        *idx = i;
        return PDDE_OK;
    }
    if (s->nt == s->cap_t) {
        int cap = s->cap_t ? 2 * s->cap_t : 64;
        snap_tensor *q = realloc(s->t, (size_t)cap * sizeof *q);
        if (!q) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", s->what);
        s->t = q, s->cap_t = cap;
    }
    s->t[s->nt] = *t;
    *idx = s->nt++;
    return PDDE_OK;
}

static pdde_status set_block(snap_set *s, const snap_block *b) {
    if (s->nb == s->cap_b) {
        int cap = s->cap_b ? 2 * s->cap_b : 128;
        snap_block *q = realloc(s->b, (size_t)cap * sizeof *q);
        if (!q) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", s->what);
        s->b = q, s->cap_b = cap;
    }
    s->b[s->nb++] = *b;
    free(s->first), s->first = NULL;
    return PDDE_OK;
}

/* Orders the blocks by tensor (in their order otherwise: a replica earlier in the set stays first). */
static pdde_status set_index(snap_set *s) {
    if (s->first) return PDDE_OK;
    int *first = calloc((size_t)s->nt + 2, sizeof *first);
    snap_block *b = malloc(((size_t)s->nb + 1) * sizeof *b);
    if (!first || !b) {
        free(first), free(b);
        return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", s->what);
    }
    for (int k = 0; k < s->nb; k++) first[s->b[k].tensor + 1]++;
    for (int t = 0; t < s->nt; t++) first[t + 1] += first[t];
    int *at = calloc((size_t)s->nt + 1, sizeof *at);
    if (!at) {
        free(first), free(b);
        return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", s->what);
    }
    for (int k = 0; k < s->nb; k++) b[first[s->b[k].tensor] + at[s->b[k].tensor]++] = s->b[k];
    free(at), free(s->b);
    s->b = b, s->cap_b = s->nb + 1, s->first = first;
    return PDDE_OK;
}

/* A block's box must lie inside its tensor and hold nbytes. */
static pdde_status check_block(const snap_set *s, const snap_block *b, const char *where) {
    const snap_tensor *t = &s->t[b->tensor];
    for (int d = 0; d < t->ndim; d++)
        if (b->box.start[d] < 0 || b->box.extent[d] < 1 || b->box.start[d] > t->shape[d] - b->box.extent[d]) {
            char bs[256];
            box_str(&b->box, t->ndim, bs, sizeof bs);
            return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s: a block %s of tensor %s lies outside its shape", s->what, where, bs, t->name);
        }
    if (b->nbytes != (uint64_t)box_numel(&b->box, t->ndim) * pdde_dtype_size(t->dtype))
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s: a block of tensor %s holds %llu bytes, its box %lld elements of %s", s->what, where,
                          t->name, (unsigned long long)b->nbytes, (long long)box_numel(&b->box, t->ndim), pdde_dtype_name(t->dtype));
    return PDDE_OK;
}

/* Every tensor's primary blocks (or all, primary_only false) tile it exactly once: none outside it,
 * none overlapping another, together its every element. */
static pdde_status set_check_cover(snap_set *s, bool primary_only) {
    pdde_status st = set_index(s);
    if (st) return st;
    for (int i = 0; i < s->nt; i++) {
        const snap_tensor *t = &s->t[i];
        int64_t total = 1, got = 0;
        for (int d = 0; d < t->ndim; d++) total *= t->shape[d];
        for (int k = s->first[i]; k < s->first[i + 1]; k++) {
            const snap_block *a = &s->b[k];
            if (a->tensor != i || (primary_only && !a->primary)) continue;
            got += box_numel(&a->box, t->ndim);
            for (int j = k + 1; j < s->first[i + 1]; j++) {
                const snap_block *c = &s->b[j];
                snap_box x;
                if (c->tensor != i || (primary_only && !c->primary) || !box_intersect(&a->box, &c->box, t->ndim, &x)) continue;
                char as[256], cs[256];
                box_str(&a->box, t->ndim, as, sizeof as), box_str(&c->box, t->ndim, cs, sizeof cs);
                return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: tensor %s: blocks %s and %s overlap", s->what, t->name, as, cs);
            }
        }
        if (got != total)
            return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: tensor %s: its blocks hold %lld of its %lld elements", s->what, t->name,
                              (long long)got, (long long)total);
    }
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Snapshot bytes: writing and parsing */

static void put_meta(snap_buf *b, const snap_meta *m, uint32_t n_blocks) {
    uint32_t version = SNAP_VERSION, rank = (uint32_t)m->rank, world = (uint32_t)m->world, kind = (uint32_t)m->sched.schedule;
    sb_put(b, SNAP_MAGIC, 8), sb_put(b, &version, 4), sb_put(b, &rank, 4), sb_put(b, &world, 4), sb_put(b, &n_blocks, 4);
    sb_put(b, &m->step, 8), sb_put(b, &m->pos, 8), sb_put(b, m->rng, 16);
    sb_put(b, &kind, 4), sb_put(b, &m->sched.lr, 4), sb_put(b, &m->sched.min_lr_ratio, 4);
    sb_put(b, &m->sched.warmup_steps, 8), sb_put(b, &m->sched.total_steps, 8), sb_put(b, &m->flags, 4);
}

/* One block to be put into a snapshot. */
typedef struct {
    const snap_tensor *t;
    snap_box box;
    bool primary;
    uint64_t offset, nbytes;
    uint32_t crc;
} snap_item;

/* The header and index of a snapshot of items (their offsets assigned here); the data goes after. */
static pdde_status snap_layout(pdde_context *ctx, const snap_meta *m, snap_item *it, int n, snap_buf *out) {
    snap_buf idx = {0};
    /* the index's size does not depend on the offsets: lay it out once with zeros, then for real */
    for (int pass = 0; pass < 2; pass++) {
        uint64_t at = 0;
        if (pass == 1) {
            at = SNAP_HEADER + idx.n + 4;
            at = (at + 7) & ~(uint64_t)7;
            idx.n = 0;
        }
        for (int i = 0; i < n; i++) {
            const snap_tensor *t = it[i].t;
            uint16_t name_len = (uint16_t)strlen(t->name), attr_len = (uint16_t)strlen(t->attr);
            uint8_t small[4] = {(uint8_t)t->dtype, (uint8_t)t->ndim, it[i].primary, 0};
            if (pass == 1) it[i].offset = at, at += (it[i].nbytes + 7) & ~(uint64_t)7;
            sb_put(&idx, &name_len, 2), sb_put(&idx, t->name, name_len), sb_put(&idx, small, 4);
            sb_put(&idx, t->shape, 8 * (size_t)t->ndim), sb_put(&idx, it[i].box.start, 8 * (size_t)t->ndim);
            sb_put(&idx, it[i].box.extent, 8 * (size_t)t->ndim), sb_put(&idx, &attr_len, 2), sb_put(&idx, t->attr, attr_len);
            sb_put(&idx, &it[i].offset, 8), sb_put(&idx, &it[i].nbytes, 8), sb_put(&idx, &it[i].crc, 4);
        }
        if (pass == 1) {
            uint64_t index_bytes = idx.n, total = at;
            *out = (snap_buf){0};
            put_meta(out, m, (uint32_t)n);
            sb_put(out, &index_bytes, 8), sb_put(out, &total, 8), sb_put(out, idx.p, idx.n);
        }
    }
    free(idx.p);
    if (idx.oom || out->oom) {
        free(out->p);
        return pdde_error(ctx, PDDE_ERR_OOM, "snapshot: out of memory");
    }
    return PDDE_OK;
}

/* Makes the snapshot's buffer: header and index (CRCs of it[] as they are), data zeroed, total bytes. */
static pdde_status snap_alloc(pdde_context *ctx, const snap_meta *m, snap_item *it, int n, pdde_snapshot **out) {
    snap_buf head;
    pdde_status st = snap_layout(ctx, m, it, n, &head);
    if (st) return st;
    uint64_t total;
    memcpy(&total, head.p + 96, 8);
    pdde_snapshot *sn = calloc(1, sizeof *sn);
    unsigned char *data = sn ? calloc(1, (size_t)total) : NULL;
    if (!data) {
        free(sn), free(head.p);
        return pdde_error(ctx, PDDE_ERR_OOM, "snapshot: no memory for its %llu bytes", (unsigned long long)total);
    }
    memcpy(data, head.p, head.n);
    free(head.p);
    sn->ctx = ctx, sn->data = data, sn->size = (size_t)total, sn->meta = *m, sn->n_blocks = n;
    pthread_mutex_init(&sn->seal_lock, NULL);
    for (int i = 0; i < n; i++) sn->n_primary += it[i].primary;
    *out = sn;
    return PDDE_OK;
}

/* Once the data is in: every block's CRC into the index, then the header's CRC. */
static pdde_status snap_seal(pdde_snapshot *sn, snap_item *it, int n) {
    for (int i = 0; i < n; i++) it[i].crc = crc32_update(0, sn->data + it[i].offset, (size_t)it[i].nbytes);
    snap_buf head;
    pdde_status st = snap_layout(sn->ctx, &sn->meta, it, n, &head);
    if (st) return st;
    uint32_t crc = crc32_update(0, head.p, head.n);
    memcpy(sn->data, head.p, head.n);
    memcpy(sn->data + head.n, &crc, 4);
    free(head.p);
    sn->sealed = true;
    return PDDE_OK;
}

/* Seals a taken snapshot once (any thread; the bytes do not change otherwise). */
static pdde_status snap_ready(const pdde_snapshot *csn) {
    pdde_snapshot *sn = (pdde_snapshot *)csn; /* (logically const: the CRCs of bytes already there) */
    pdde_status st = PDDE_OK;
    pthread_mutex_lock(&sn->seal_lock);
    if (!sn->sealed) {
        st = snap_seal(sn, sn->items, sn->n_blocks);
        if (!st) free(sn->items), free(sn->tensors), sn->items = sn->tensors = NULL;
    }
    pthread_mutex_unlock(&sn->seal_lock);
    return st;
}

/* Parses a snapshot's header and index (`size`: the bytes present, at least the header and index;
 * its data need not be) into set s as source src: every block, or its primary ones only. */
static pdde_status snap_parse(snap_set *s, const unsigned char *p, size_t size, int src, bool primary_only, const char *where, snap_meta *meta) {
    snap_rd r = {p, size, 0, false};
    char magic[8];
    uint32_t version, rank, world, n_blocks, kind, crc;
    uint64_t index_bytes, total;
    snap_meta m = {0};
    rd_get(&r, magic, 8);
    if (r.bad || memcmp(magic, SNAP_MAGIC, 8) != 0)
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s is not a pdde shard (bad magic or too short)", s->what, where);
    rd_get(&r, &version, 4);
    if (version != SNAP_VERSION)
        return pdde_error(s->ctx, PDDE_ERR_VERSION, "%s: %s: shard version %u, this build reads version %u", s->what, where, version, SNAP_VERSION);
    rd_get(&r, &rank, 4), rd_get(&r, &world, 4), rd_get(&r, &n_blocks, 4);
    rd_get(&r, &m.step, 8), rd_get(&r, &m.pos, 8), rd_get(&r, m.rng, 16);
    rd_get(&r, &kind, 4), rd_get(&r, &m.sched.lr, 4), rd_get(&r, &m.sched.min_lr_ratio, 4);
    rd_get(&r, &m.sched.warmup_steps, 8), rd_get(&r, &m.sched.total_steps, 8), rd_get(&r, &m.flags, 4);
    rd_get(&r, &index_bytes, 8), rd_get(&r, &total, 8);
    if (r.bad || index_bytes > size - SNAP_HEADER || size - SNAP_HEADER - index_bytes < 4)
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s: the shard's header is cut short", s->what, where);
    memcpy(&crc, p + SNAP_HEADER + index_bytes, 4);
    if (crc32_update(0, p, SNAP_HEADER + (size_t)index_bytes) != crc)
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s: the shard's header and index fail their CRC (damaged)", s->what, where);
    if (world < 1 || world > INT_MAX || rank >= world || kind > PDDE_LR_COSINE) /* (rank and world are ints from here on) */
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s: rank %u of %u, schedule %u", s->what, where, rank, world, kind);
    m.sched.schedule = (pdde_lr_schedule)kind, m.rank = (int)rank, m.world = (int)world;
    r.n = SNAP_HEADER + (size_t)index_bytes;
    for (uint32_t k = 0; k < n_blocks; k++) {
        snap_tensor t = {0};
        snap_block b = {0};
        uint16_t name_len, attr_len;
        uint8_t small[4];
        rd_get(&r, &name_len, 2);
        if (r.bad || name_len >= sizeof t.name) { r.bad = true; break; }
        rd_get(&r, t.name, name_len), rd_get(&r, small, 4);
        if (small[0] >= PDDE_DTYPE_COUNT || small[1] > PDDE_MAX_DIMS) { r.bad = true; break; }
        t.dtype = (pdde_dtype)small[0], t.ndim = small[1], b.primary = small[2] != 0;
        rd_get(&r, t.shape, 8u * t.ndim), rd_get(&r, b.box.start, 8u * t.ndim), rd_get(&r, b.box.extent, 8u * t.ndim);
        rd_get(&r, &attr_len, 2);
        if (r.bad || attr_len >= sizeof t.attr) { r.bad = true; break; }
        rd_get(&r, t.attr, attr_len), rd_get(&r, &b.offset, 8), rd_get(&r, &b.nbytes, 8), rd_get(&r, &b.crc, 4);
        if (r.bad) break;
        if (!shape_ok(t.shape, t.ndim)) { r.bad = true; break; }
        if (b.offset < SNAP_HEADER + index_bytes + 4 || b.offset > total || b.nbytes > total - b.offset)
            return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s: tensor %s's block lies outside the shard's %llu bytes", s->what, where, t.name,
                              (unsigned long long)total);
        if (primary_only && !b.primary) continue;
        pdde_status st = set_tensor(s, &t, &b.tensor);
        if (st) return st;
        b.src = src, b.rank = (int)rank;
        st = check_block(s, &b, where);
        if (!st) st = set_block(s, &b);
        if (st) return st;
    }
    if (r.bad || r.at != r.n) return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s: the shard's index is malformed", s->what, where);
    if (meta) *meta = m;
    return PDDE_OK;
}

/* ------------------------------------------------------------------------------------------------
 * Snapshots of a session */

/* The box of the global tensor t that this rank's block lt holds (along each split dim d, the
 * coord-th of the mesh axis' equal parts, as pdde_session_write_global places it), and whether no
 * lower rank of lt's mesh holds the same box (the replicas along its other axes). */
static void snap_local_box(const pdde_session *s, const pdde_tensor *t, const pdde_tensor *lt, snap_box *b, bool *primary) {
    *primary = true;
    for (int d = 0; d < t->ndim; d++) b->start[d] = 0, b->extent[d] = lt->shape[d];
    const pdde_mesh *m = lt->dist.mesh;
    if (!s->world || !m) return;
    int me = s->prog->rank, mine = mesh_index_of(m, me);
    unsigned split = 0;
    for (int d = 0; d < t->ndim; d++) {
        int a = lt->dist.dims_mapping[d];
        if (a < 0) continue;
        split |= 1u << a;
        b->start[d] = (int64_t)s->prog->coords[program_axis(s->prog, m, a)] * lt->shape[d];
    }
    for (int j = 0; j < m->n_ranks && mine >= 0; j++) {
        if (m->ranks[j] >= me) continue;
        bool same = true; /* j's coordinates on the split axes are mine */
        for (int a = m->ndim - 1, rj = j, rm = mine; a >= 0; rj /= m->shape[a], rm /= m->shape[a], a--)
            if ((split >> a & 1) && rj % m->shape[a] != rm % m->shape[a]) same = false;
        if (same) *primary = false;
    }
}

static snap_meta session_meta(const pdde_session *s, const pdde_checkpoint_extra *extra) {
    snap_meta m = {0};
    m.step = (uint64_t)s->step, m.pos = extra ? extra->data_position : 0;
    m.rng[0] = s->ctx->seed, m.rng[1] = s->run_counter;
    m.sched = s->schedule;
    m.world = s->world ? s->prog->world_size : 1, m.rank = s->world ? s->prog->rank : 0;
    return m;
}

/* The snapshot's view of user tensor t. */
static void snap_tensor_of(const pdde_tensor *t, snap_tensor *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "%s", t->name);
    out->dtype = t->dtype, out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof out->shape);
    if (t->dist.mesh) pdde_dist_attr_str(&t->dist, out->attr, sizeof out->attr);
}

pdde_status pdde_snapshot_take(pdde_session *s, const pdde_snapshot_params *p, const pdde_checkpoint_extra *extra, pdde_snapshot **out) {
    if (!s || !out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    bool replicas = p && p->replicas;
    int n = 0;
    for (int i = 0; i < s->g->n; i++) n += ckpt_saved(s->g->nodes[i]) && local_of(s, s->g->nodes[i]);
    snap_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    snap_item *it = calloc((size_t)n + 1, sizeof *it);
    pdde_tensor **lts = calloc((size_t)n + 1, sizeof *lts);
    if (!ts || !it || !lts) {
        free(ts), free(it), free(lts);
        return pdde_error(s->ctx, PDDE_ERR_OOM, "snapshot: out of memory");
    }
    int k = 0;
    for (int i = 0; i < s->g->n; i++) {
        pdde_tensor *t = s->g->nodes[i], *lt = ckpt_saved(t) ? local_of(s, t) : NULL;
        if (!lt) continue;
        snap_local_box(s, t, lt, &it[k].box, &it[k].primary);
        if (!it[k].primary && !replicas) continue;
        snap_tensor_of(t, &ts[k]);
        it[k].t = &ts[k], it[k].nbytes = pdde_tensor_nbytes(lt), lts[k] = lt;
        k++;
    }
    snap_meta m = session_meta(s, extra);
    m.flags = replicas;
    pdde_snapshot *sn = NULL;
    pdde_status st = snap_alloc(s->ctx, &m, it, k, &sn);
    for (int i = 0; i < k && !st; i++) st = read_local(s, lts[i], sn->data + it[i].offset, (size_t)it[i].nbytes);
    free(lts);
    if (st || !sn) {
        free(ts), free(it);
        pdde_snapshot_free(sn);
        return st;
    }
    sn->items = it, sn->tensors = ts; /* sealed when first needed (snap_ready) */
    *out = sn;
    return PDDE_OK;
}

void pdde_snapshot_free(pdde_snapshot *sn) {
    if (!sn) return;
    pthread_mutex_destroy(&sn->seal_lock);
    free(sn->items), free(sn->tensors);
    free(sn->data);
    free(sn);
}

const void *pdde_snapshot_data(const pdde_snapshot *sn, size_t *nbytes) {
    if (nbytes) *nbytes = 0;
    if (!sn || snap_ready(sn)) return NULL;
    if (nbytes) *nbytes = sn->size;
    return sn->data;
}

int64_t pdde_snapshot_step(const pdde_snapshot *sn) { return sn ? (int64_t)sn->meta.step : 0; }
int pdde_snapshot_rank(const pdde_snapshot *sn) { return sn ? sn->meta.rank : 0; }
int pdde_snapshot_world_size(const pdde_snapshot *sn) { return sn ? sn->meta.world : 0; }

pdde_status pdde_snapshot_from_data(pdde_context *ctx, const void *data, size_t nbytes, pdde_snapshot **out) {
    if (!ctx) return PDDE_ERR_INVALID_ARG;
    if (!data || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "snapshot_from_data: %s is NULL", !data ? "data" : "out");
    *out = NULL;
    snap_set set = {.ctx = ctx};
    snprintf(set.what, sizeof set.what, "snapshot");
    snap_meta m;
    pdde_status st = snap_parse(&set, data, nbytes, 0, false, "its bytes", &m);
    uint64_t total = 0;
    if (!st) memcpy(&total, (const unsigned char *)data + 96, 8);
    if (!st && total != nbytes)
        st = pdde_error(ctx, PDDE_ERR_CORRUPT, "snapshot: %zu bytes, its header says %llu (cut short or padded)", nbytes, (unsigned long long)total);
    pdde_snapshot *sn = st ? NULL : calloc(1, sizeof *sn);
    if (!st && (!sn || !(sn->data = malloc(nbytes ? nbytes : 1)))) free(sn), sn = NULL, st = pdde_error(ctx, PDDE_ERR_OOM, "snapshot: out of memory");
    if (!st) {
        memcpy(sn->data, data, nbytes);
        sn->ctx = ctx, sn->size = nbytes, sn->meta = m, sn->n_blocks = set.nb, sn->sealed = true;
        pthread_mutex_init(&sn->seal_lock, NULL);
        for (int i = 0; i < set.nb; i++) sn->n_primary += set.b[i].primary;
        *out = sn;
    }
    set_free(&set);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Restoring a session from a set (a checkpoint's shard files or snapshots in memory) */

/* What source src of s is called in messages. */
static void set_src_name(const snap_set *s, int src, char *buf, size_t n) {
    if (s->snap) snprintf(buf, n, "the snapshot of rank %d", s->snap[src]->meta.rank);
    else snprintf(buf, n, "shard file %s/%s", s->dir, s->file[src]);
}

/* Block b's bytes, checked against its CRC: a pointer into a snapshot, or read from its file into
 * *tmp (grown to fit). */
static pdde_status set_block_data(snap_set *s, const snap_block *b, char **tmp, size_t *cap, const char **data) {
    const snap_tensor *t = &s->t[b->tensor];
    char src[4200], bs[256];
    set_src_name(s, b->src, src, sizeof src);
    box_str(&b->box, t->ndim, bs, sizeof bs);
    if (s->snap) {
        *data = (const char *)s->snap[b->src]->data + b->offset;
    } else {
        if (s->fd[b->src] < 0) {
            char path[4200];
            struct stat sb;
            pdde_status st;
            snprintf(path, sizeof path, "%s/%s", s->dir, s->file[b->src]);
            int fd = open_regular(s->ctx, path, "checkpoint", &sb, &st);
            if (fd < 0) /* (a file the manifest names is missing: the checkpoint is damaged, not absent) */
                return pdde_error(s->ctx, st == PDDE_ERR_NOT_FOUND ? PDDE_ERR_CORRUPT : st, "%s: %s, which holds block %s of tensor %s, cannot be read: %s", s->what, src, bs, t->name,
                                  st == PDDE_ERR_NOT_FOUND ? "it is missing" : pdde_last_error(s->ctx));
            if ((uint64_t)sb.st_size != s->file_bytes[b->src]) {
                close(fd);
                return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s, which holds block %s of tensor %s, is %lld bytes, the manifest says %llu (cut short?)",
                                  s->what, src, bs, t->name, (long long)sb.st_size, (unsigned long long)s->file_bytes[b->src]);
            }
            s->fd[b->src] = fd;
        }
        if (b->nbytes > *cap) {
            char *q = realloc(*tmp, (size_t)b->nbytes);
            if (!q) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", s->what);
            *tmp = q, *cap = (size_t)b->nbytes;
        }
        size_t got = 0;
        while (got < b->nbytes) {
            ssize_t r = pread(s->fd[b->src], *tmp + got, (size_t)b->nbytes - got, (off_t)(b->offset + got));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                return pdde_error(s->ctx, PDDE_ERR_IO, "%s: %s: cannot read block %s of tensor %s: %s", s->what, src, bs, t->name,
                                  r < 0 ? strerror(errno) : "the file ends before it");
            got += (size_t)r;
        }
        *data = *tmp;
    }
    if (crc32_update(0, *data, (size_t)b->nbytes) != b->crc)
        return pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: %s: block %s of tensor %s fails its CRC-32 (damaged)", s->what, src, bs, t->name);
    return PDDE_OK;
}

/* Assembles box `want` of tensor ti into buf from the blocks that overlap it. Replicas (blocks of
 * the same box) are read once: the first that passes its CRC. */
static pdde_status set_assemble(snap_set *s, int ti, const snap_box *want, char *buf, char **tmp, size_t *cap) {
    const snap_tensor *t = &s->t[ti];
    size_t esz = pdde_dtype_size(t->dtype);
    int64_t covered = 0, need = box_numel(want, t->ndim);
    pdde_status st = set_index(s);
    if (st) return st;
    int *used = malloc(((size_t)s->nb + 1) * sizeof *used), n_used = 0;
    if (!used) return pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", s->what);
    for (int k = s->first[ti]; k < s->first[ti + 1] && !st; k++) {
        const snap_block *b = &s->b[k];
        snap_box in, x;
        if (b->tensor != ti || !box_intersect(&b->box, want, t->ndim, &in)) continue;
        bool dup = false;
        for (int u = 0; u < n_used && !st; u++) {
            if (box_equal(&s->b[used[u]].box, &b->box, t->ndim)) dup = true;
            else if (box_intersect(&s->b[used[u]].box, &b->box, t->ndim, &x)) {
                char as[256], bs[256];
                box_str(&s->b[used[u]].box, t->ndim, as, sizeof as), box_str(&b->box, t->ndim, bs, sizeof bs);
                st = pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: tensor %s: blocks %s and %s overlap", s->what, t->name, as, bs);
            }
        }
        if (st || dup) continue;
        const char *data = NULL;
        st = set_block_data(s, b, tmp, cap, &data);
        if (st) { /* a replica further on may be whole */
            for (int j = k + 1; j < s->first[ti + 1]; j++)
                if (s->b[j].tensor == ti && box_equal(&s->b[j].box, &b->box, t->ndim)) { st = PDDE_OK; break; }
            continue;
        }
        box_copy(buf, want, data, &b->box, &in, t->ndim, esz);
        covered += box_numel(&in, t->ndim);
        used[n_used++] = k;
    }
    free(used);
    if (!st && covered != need) {
        char ws[256];
        box_str(want, t->ndim, ws, sizeof ws);
        st = pdde_error(s->ctx, PDDE_ERR_CORRUPT, "%s: tensor %s: %lld of the %lld elements of its block %s that this rank holds are in none of its blocks",
                        s->what, t->name, (long long)(need - covered), (long long)need, ws);
    }
    return st;
}

/* The step, schedule, data position and loss scale of meta m, as pdde_checkpoint_load sets them. */
static pdde_status snap_finish(pdde_session *s, const snap_meta *m, pdde_checkpoint_extra *extra) {
    s->step = (int64_t)m->step;
    s->run_counter = (uint32_t)m->rng[1];
    pdde_optimizer_params saved = s->g->opt;
    saved.lr = m->sched.lr, saved.schedule = m->sched.schedule, saved.warmup_steps = m->sched.warmup_steps;
    saved.total_steps = m->sched.total_steps, saved.min_lr_ratio = m->sched.min_lr_ratio;
    const pdde_optimizer_params *now = &s->g->opt;
    bool differs = s->g->has_optimizer && (saved.lr != now->lr || saved.schedule != now->schedule || saved.warmup_steps != now->warmup_steps ||
                                           saved.total_steps != now->total_steps || saved.min_lr_ratio != now->min_lr_ratio);
    s->schedule = extra && extra->use_graph_schedule ? *now : saved;
    if (extra) extra->data_position = m->pos, extra->schedule = saved, extra->schedule_differs = differs;
    return s->loss_scaling ? scaler_load(s) : PDDE_OK;
}

/* Every rank's outcome st over comm (NULL: this one's): a rank that did well fails too when another
 * did not, naming it. */
static pdde_status snap_agree(pdde_context *ctx, pdde_comm *comm, pdde_status st, const char *what) {
#ifdef PDDE_HAVE_COMM
    if (!comm) return st;
    int rank = pdde_comm_rank(comm);
    float mine[2] = {st ? (float)(rank + 1) : 0.0f, st ? (float)-st : 0.0f}, all[2] = {0, 0};
    pdde_status cs = pdde_comm_allreduce(comm, mine, all, 2, PDDE_F32, PDDE_REDUCE_MAX);
    if (!st && cs) return cs;
    if (!st && all[0] > 0)
        return pdde_error(ctx, (pdde_status) - (int)all[1], "%s: rank %d could not read its part (its own message says why); nothing was loaded",
                          what, (int)all[0] - 1);
#else
    (void)ctx, (void)comm, (void)what;
#endif
    return st;
}

/* Restores s from set: checks that the set and the model hold the same tensors, assembles every
 * block this rank holds in host memory, agrees over `agree` (every rank's outcome, NULL: none) and
 * only then writes them. */
static pdde_status set_restore(pdde_session *s, snap_set *set, pdde_checkpoint_extra *extra, pdde_comm *agree) {
    pdde_status st = PDDE_OK;
    bool weights_only = extra && extra->weights_only;
    for (int i = 0; i < set->nt && !st; i++) {
        const snap_tensor *c = &set->t[i];
        pdde_tensor *t = pdde_graph_find(s->g, c->name);
        if ((!t || !ckpt_in_step(s, t)) && strcmp(c->name, "loss.grad_seed") == 0) continue; /* another precision's run */
        if (weights_only && (!t || !ckpt_weight(t))) continue; /* (the saving run's optimizer state) */
        if (!t || !ckpt_in_step(s, t)) {
            st = pdde_error(s->ctx, PDDE_ERR_MISMATCH, "%s: tensor %s is not in this model", set->what, c->name);
            break;
        }
        bool same = t->ndim == c->ndim && t->dtype == c->dtype;
        for (int d = 0; same && d < c->ndim; d++) same = t->shape[d] == c->shape[d];
        if (!same) {
            char want[96], have[96];
            shape_str(t, want, sizeof want), dims_str(c->ndim, c->shape, have, sizeof have);
            st = pdde_error(s->ctx, PDDE_ERR_MISMATCH, "%s: tensor %s is %s %s there, the model's is %s %s (another model's checkpoint?)", set->what,
                            c->name, pdde_dtype_name(c->dtype), have, pdde_dtype_name(t->dtype), want);
        }
    }
    for (int i = 0; i < s->g->n && !st; i++) {
        pdde_tensor *t = s->g->nodes[i];
        if (ckpt_in_step(s, t) && t != s->g->grad_seed && (!weights_only || ckpt_weight(t)) && set_find(set, t->name) < 0)
            st = pdde_error(s->ctx, PDDE_ERR_MISMATCH, "%s: tensor %s of the model is missing", set->what, t->name);
    }
    int n = 0;
    for (int i = 0; i < s->g->n; i++) n += ckpt_saved(s->g->nodes[i]) && local_of(s, s->g->nodes[i]);
    pdde_tensor **lts = calloc((size_t)n + 1, sizeof *lts);
    char **bufs = calloc((size_t)n + 1, sizeof *bufs), *tmp = NULL;
    size_t cap = 0;
    if (!st && (!lts || !bufs)) st = pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", set->what);
    int k = 0;
    for (int i = 0; i < s->g->n && !st; i++) {
        pdde_tensor *t = s->g->nodes[i], *lt = ckpt_saved(t) && (!weights_only || ckpt_weight(t)) ? local_of(s, t) : NULL;
        int ti = lt ? set_find(set, t->name) : -1;
        if (ti < 0) continue; /* (the loss scale of an f16 session restored from an f32 run's set keeps its value) */
        snap_box box;
        bool primary;
        snap_local_box(s, t, lt, &box, &primary);
        lts[k] = lt;
        if (!(bufs[k] = malloc(pdde_tensor_nbytes(lt) + 1))) st = pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", set->what);
        if (!st) st = set_assemble(set, ti, &box, bufs[k], &tmp, &cap);
        k++;
    }
    free(tmp);
    st = snap_agree(s->ctx, agree, st, set->what); /* all write, or none */
    for (int i = 0; i < k && !st; i++) {
        if (s->bind) bind_micro(s, lts[i], 0);
        st = write_bound(s, lts[i], bufs[i], pdde_tensor_nbytes(lts[i]));
    }
    for (int i = 0; i < k; i++) free(bufs[i]);
    free(lts), free(bufs);
    return st || weights_only ? st : snap_finish(s, &set->meta, extra);
}

pdde_status pdde_snapshot_restore(pdde_session *s, const pdde_snapshot *const *shards, int n, pdde_checkpoint_extra *extra) {
    if (!s || (!shards && n) || n < 0) return PDDE_ERR_INVALID_ARG;
    snap_set set = {.ctx = s->ctx};
    snprintf(set.what, sizeof set.what, "snapshot set");
    if (n == 0) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "snapshot restore: an empty set");
    pdde_status st = PDDE_OK;
    for (int i = 0; i < n && !st; i++) {
        if (!shards[i]) { st = pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "snapshot restore: snapshot %d of the set is NULL", i); break; }
        char where[64];
        snprintf(where, sizeof where, "the snapshot of rank %d", shards[i]->meta.rank);
        snap_meta m;
        st = snap_ready(shards[i]);
        if (!st) st = snap_parse(&set, shards[i]->data, shards[i]->size, i, false, where, &m);
        if (!st && i == 0) set.meta = m;
        if (!st && m.step != set.meta.step)
            st = pdde_error(s->ctx, PDDE_ERR_MISMATCH, "snapshot restore: the set mixes steps %llu (rank %d) and %llu (rank %d)",
                            (unsigned long long)set.meta.step, shards[0]->meta.rank, (unsigned long long)m.step, m.rank);
    }
    set.snap = shards, set.nsrc = n;
    if (!st) st = set_restore(s, &set, extra, NULL);
    set_free(&set);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * The manifest: text, one record a line, its CRC-32 last:
 *   pdde sharded checkpoint 1
 *   generation G / step S / optimizer_step S / data_position P / rng SEED COUNTER
 *   schedule KIND LR MIN_LR_RATIO WARMUP TOTAL / world W
 *   file INDEX NAME BYTES                      (a shard file of the directory)
 *   tensor INDEX NAME DTYPE SHAPE ATTR          (SHAPE 64x256; ATTR as pdde_dist_attr_str, - for none)
 *   block TENSOR FILE OFFSET NBYTES CRC START EXTENT RANK   (START 0,128; EXTENT 64,128)
 *   crc XXXXXXXX                                (of every byte before this line)
 * Names and attrs are written with %XX for bytes outside '!'..'~' and for '%'. */

static void put_escaped(snap_buf *b, const char *s) {
    if (!*s) { sb_put(b, "-", 1); return; }
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c > ' ' && c < 127 && c != '%') sb_put(b, &c, 1);
        else {
            char e[4];
            snprintf(e, sizeof e, "%%%02X", c);
            sb_put(b, e, 3);
        }
    }
}

static bool get_escaped(const char *tok, char *out, size_t n) {
    size_t k = 0;
    if (strcmp(tok, "-") == 0) { out[0] = 0; return true; }
    for (const char *p = tok; *p; p++) {
        unsigned v = (unsigned char)*p;
        if (*p == '%') {
            if (!isxdigit((unsigned char)p[1]) || !isxdigit((unsigned char)p[2])) return false;
            char h[3] = {p[1], p[2], 0};
            v = (unsigned)strtoul(h, NULL, 16), p += 2;
        }
        if (k + 1 >= n) return false;
        out[k++] = (char)v;
    }
    out[k] = 0;
    return true;
}

static void putf(snap_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void putf(snap_buf *b, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    sb_put(b, line, k < (int)sizeof line ? (size_t)k : sizeof line - 1);
}

static void put_dims(snap_buf *b, const int64_t *v, int n, char sep) {
    if (n == 0) sb_put(b, "-", 1);
    for (int d = 0; d < n; d++) {
        if (d) sb_put(b, &sep, 1);
        putf(b, "%lld", (long long)v[d]);
    }
}

/* The manifest of set s (its blocks in files s->file), as text. */
static pdde_status manifest_text(const snap_set *s, snap_buf *b) {
    const snap_meta *m = &s->meta;
    *b = (snap_buf){0};
    putf(b, "%s\ngeneration %llu\nstep %llu\noptimizer_step %llu\ndata_position %llu\nrng %llu %llu\n", SNAP_MANIFEST_HEAD,
         (unsigned long long)m->generation, (unsigned long long)m->step, (unsigned long long)m->step, (unsigned long long)m->pos,
         (unsigned long long)m->rng[0], (unsigned long long)m->rng[1]);
    putf(b, "schedule %u %.9g %.9g %lld %lld\nworld %d\n", (unsigned)m->sched.schedule, m->sched.lr, m->sched.min_lr_ratio,
         (long long)m->sched.warmup_steps, (long long)m->sched.total_steps, m->world);
    for (int i = 0; i < s->nsrc; i++) putf(b, "file %d %s %llu\n", i, s->file[i], (unsigned long long)s->file_bytes[i]);
    for (int i = 0; i < s->nt; i++) {
        const snap_tensor *t = &s->t[i];
        putf(b, "tensor %d ", i), put_escaped(b, t->name), putf(b, " %s ", pdde_dtype_name(t->dtype));
        put_dims(b, t->shape, t->ndim, 'x'), sb_put(b, " ", 1), put_escaped(b, t->attr), sb_put(b, "\n", 1);
    }
    for (int k = 0; k < s->nb; k++) {
        const snap_block *c = &s->b[k];
        int nd = s->t[c->tensor].ndim;
        putf(b, "block %d %d %llu %llu %08x ", c->tensor, c->src, (unsigned long long)c->offset, (unsigned long long)c->nbytes, c->crc);
        put_dims(b, c->box.start, nd, ','), sb_put(b, " ", 1), put_dims(b, c->box.extent, nd, ','), putf(b, " %d\n", c->rank);
    }
    putf(b, "crc %08x\n", crc32_update(0, b->p, b->n));
    return b->oom ? pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", s->what) : PDDE_OK;
}

static bool parse_u64(const char *tok, uint64_t *v) {
    if (!tok || !isdigit((unsigned char)*tok)) return false;
    char *end;
    errno = 0;
    *v = strtoull(tok, &end, 10);
    return !*end && errno == 0;
}

static bool parse_i64(const char *tok, int64_t *v) {
    if (!tok || !(isdigit((unsigned char)*tok) || *tok == '-')) return false;
    char *end;
    errno = 0;
    long long x = strtoll(tok, &end, 10);
    *v = x;
    return !*end && errno == 0;
}

/* "a<sep>b<sep>c" (or "-" for none) into exactly n values. */
static bool parse_dims(const char *tok, char sep, int64_t *v, int n) {
    if (!tok) return false;
    if (strcmp(tok, "-") == 0) return n == 0;
    int k = 0;
    const char *p = tok;
    while (k < PDDE_MAX_DIMS) {
        char part[32];
        size_t len = strcspn(p, (char[]){sep, 0});
        if (len == 0 || len >= sizeof part) return false;
        memcpy(part, p, len), part[len] = 0;
        if (!parse_i64(part, &v[k++])) return false;
        if (!p[len]) break;
        p += len + 1;
    }
    return k == n;
}

static int dtype_of_name(const char *name) {
    for (int d = 0; d < PDDE_DTYPE_COUNT; d++)
        if (strcmp(pdde_dtype_name((pdde_dtype)d), name) == 0) return d;
    return -1;
}

/* The generation a shard file name s<G>-r<R>.shard says (0: not one). */
static uint64_t shard_generation(const char *name) {
    unsigned long long g = 0;
    int r = 0, len = 0;
    if (sscanf(name, "s%llu-r%d.shard%n", &g, &r, &len) != 2 || name[len] || r < 0) return 0;
    return g;
}

/* Reads and checks dir's manifest into s (sources: its shard files). */
static const char *dir_name(const char *dir, char *buf, size_t n);
static pdde_status manifest_read(pdde_context *ctx, const char *dir_in, snap_set *s) {
    *s = (snap_set){.ctx = ctx};
    char dir_buf[4096];
    const char *dir = dir_name(dir_in, dir_buf, sizeof dir_buf);
    snprintf(s->what, sizeof s->what, "checkpoint %s", dir);
    snprintf(s->dir, sizeof s->dir, "%s", dir);
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, SNAP_MANIFEST);
    size_t size = 0;
    pdde_status st;
    char *text = read_file(ctx, path, "checkpoint", &size, &st);
    if (!text) {
        if (st != PDDE_ERR_NOT_FOUND) return st;
        /* shard files without a manifest: a save that did not finish, or a manifest lost; a caller that took
         * this for "nothing saved here" would start over and its next save would delete them */
        int shards = 0;
        uint64_t newest = 0;
        DIR *d = opendir(dir);
        for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
            uint64_t g = shard_generation(e->d_name);
            shards += g > 0, newest = g > newest ? g : newest;
        }
        if (d) closedir(d);
        if (shards)
            return pdde_error(ctx, PDDE_ERR_CORRUPT, "checkpoint %s: %d shard file%s (the newest s%llu-r*.shard) but no manifest (%s): a save that did "
                              "not finish, or its manifest removed; they cannot be loaded. Remove them (or the directory) to start from step 0",
                              dir, shards, shards == 1 ? "" : "s", (unsigned long long)newest, path);
        return pdde_error(ctx, PDDE_ERR_NOT_FOUND, "checkpoint %s: a directory without a manifest (no sharded checkpoint was completed there): %s is missing",
                          dir, path);
    }
    text[size] = 0;
    /* the last line: crc of what comes before it */
    size_t last = size;
    if (last && text[last - 1] == '\n') last--;
    while (last && text[last - 1] != '\n') last--;
    unsigned crc = 0;
    char tail[32] = "";
    if (size - last < sizeof tail) memcpy(tail, text + last, size - last), tail[size - last] = 0;
    if (sscanf(tail, "crc %8x", &crc) != 1 || crc32_update(0, text, last) != crc || memchr(text, 0, size)) {
        free(text);
        return pdde_error(ctx, PDDE_ERR_CORRUPT, "checkpoint %s: its manifest %s fails its CRC (damaged or cut short)", dir, path);
    }
    text[last] = 0;
    int line = 0, files = 0, tensors = 0;
    char *save = NULL;
    bool head = false;
    st = PDDE_OK;
    for (char *l = strtok_r(text, "\n", &save); l && !st; l = strtok_r(NULL, "\n", &save)) {
        line++;
        if (line == 1) {
            head = strcmp(l, SNAP_MANIFEST_HEAD) == 0;
            if (!head) break;
            continue;
        }
        char *tok[16], *ts = NULL;
        int n = 0;
        for (char *w = strtok_r(l, " ", &ts); w && n < 16; w = strtok_r(NULL, " ", &ts)) tok[n++] = w;
        for (int i = n; i < 16; i++) tok[i] = NULL;
        bool ok = n > 0;
        snap_meta *m = &s->meta;
        uint64_t u = 0, v = 0;
        if (!ok) {
        } else if (!strcmp(tok[0], "generation")) ok = n == 2 && parse_u64(tok[1], &m->generation);
        else if (!strcmp(tok[0], "step")) ok = n == 2 && parse_u64(tok[1], &m->step);
        else if (!strcmp(tok[0], "optimizer_step")) ok = n == 2 && parse_u64(tok[1], &u) && u == m->step;
        else if (!strcmp(tok[0], "data_position")) ok = n == 2 && parse_u64(tok[1], &m->pos);
        else if (!strcmp(tok[0], "rng")) ok = n == 3 && parse_u64(tok[1], &m->rng[0]) && parse_u64(tok[2], &m->rng[1]);
        else if (!strcmp(tok[0], "world")) ok = n == 2 && parse_u64(tok[1], &u) && u >= 1 && u <= 1u << 24, m->world = (int)u;
        else if (!strcmp(tok[0], "schedule")) {
            char *e1 = NULL, *e2 = NULL;
            ok = n == 6 && parse_u64(tok[1], &u) && u <= PDDE_LR_COSINE && parse_i64(tok[4], &m->sched.warmup_steps) &&
                 parse_i64(tok[5], &m->sched.total_steps);
            if (ok) m->sched.schedule = (pdde_lr_schedule)u, m->sched.lr = strtof(tok[2], &e1), m->sched.min_lr_ratio = strtof(tok[3], &e2);
            ok = ok && !*e1 && !*e2;
        } else if (!strcmp(tok[0], "file")) {
            ok = n == 4 && parse_u64(tok[1], &u) && u == (uint64_t)files && strlen(tok[2]) < 64 && !strchr(tok[2], '/') && parse_u64(tok[3], &v);
            if (ok) {
                void *a = realloc(s->file, (size_t)(files + 1) * sizeof *s->file), *b = a ? realloc(s->file_bytes, (size_t)(files + 1) * 8) : NULL;
                if (a) s->file = a;
                if (b) s->file_bytes = b;
                if (!a || !b) st = pdde_error(ctx, PDDE_ERR_OOM, "checkpoint %s: out of memory", dir);
                else snprintf(s->file[files], sizeof s->file[files], "%s", tok[2]), s->file_bytes[files++] = v;
            }
        } else if (!strcmp(tok[0], "tensor")) {
            snap_tensor t = {0};
            int dt = n == 6 ? dtype_of_name(tok[3]) : -1, idx = -1;
            ok = dt >= 0 && parse_u64(tok[1], &u) && u == (uint64_t)tensors && get_escaped(tok[2], t.name, sizeof t.name) && t.name[0] &&
                 get_escaped(tok[5], t.attr, sizeof t.attr);
            if (ok) { /* the dims: count the separators */
                t.dtype = (pdde_dtype)dt;
                t.ndim = strcmp(tok[4], "-") ? 1 : 0;
                for (const char *p = tok[4]; *p; p++) t.ndim += *p == 'x';
                ok = t.ndim <= PDDE_MAX_DIMS && parse_dims(tok[4], 'x', t.shape, t.ndim) && shape_ok(t.shape, t.ndim);
            }
            if (ok && set_find(s, t.name) >= 0) ok = false;
            if (ok) st = set_tensor(s, &t, &idx), tensors++;
        } else if (!strcmp(tok[0], "block")) {
            snap_block b = {0};
            uint64_t ti = 0, fi = 0, crc64 = 0;
            char *end = NULL;
            ok = n == 9 && parse_u64(tok[1], &ti) && ti < (uint64_t)s->nt && parse_u64(tok[2], &fi) && fi < (uint64_t)files &&
                 parse_u64(tok[3], &b.offset) && parse_u64(tok[4], &b.nbytes) && strlen(tok[5]) == 8 && parse_u64(tok[8], &u);
            if (ok) crc64 = strtoull(tok[5], &end, 16), ok = !*end;
            if (ok) {
                int nd = s->t[ti].ndim;
                b.tensor = (int)ti, b.src = (int)fi, b.crc = (uint32_t)crc64, b.rank = (int)u, b.primary = true;
                ok = parse_dims(tok[6], ',', b.box.start, nd) && parse_dims(tok[7], ',', b.box.extent, nd) &&
                     b.offset <= s->file_bytes[fi] && b.nbytes <= s->file_bytes[fi] - b.offset;
                char where[64];
                snprintf(where, sizeof where, "manifest line %d", line);
                if (ok) st = check_block(s, &b, where);
                if (ok && !st) st = set_block(s, &b);
            }
        } else {
            ok = false;
        }
        if (!ok && !st) st = pdde_error(ctx, PDDE_ERR_CORRUPT, "checkpoint %s: manifest line %d: cannot read '%s ...'", dir, line, tok[0] ? tok[0] : "");
    }
    free(text);
    if (!st && !head) st = pdde_error(ctx, PDDE_ERR_VERSION, "checkpoint %s: %s does not start with '%s'", dir, path, SNAP_MANIFEST_HEAD);
    if (!st && s->meta.world < 1) st = pdde_error(ctx, PDDE_ERR_CORRUPT, "checkpoint %s: its manifest has no world line", dir);
    if (!st) st = set_check_cover(s, false);
    if (!st) {
        s->nsrc = files;
        s->fd = malloc(((size_t)files + 1) * sizeof *s->fd);
        if (!s->fd) st = pdde_error(ctx, PDDE_ERR_OOM, "checkpoint %s: out of memory", dir);
        for (int i = 0; i < files && s->fd; i++) s->fd[i] = -1;
    }
    if (st) set_free(s);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Saving: shard files in parallel, then the manifest renamed into place */

/* A test's pause point (never set in normal use): PDDE_CHECKPOINT_PAUSE=shard:R:G makes rank R
 * stop half-way through writing its shard of generation G, =manifest:G rank 0 with the manifest
 * written but not yet renamed; it says so on stderr and waits (at most 60 s) to be killed. */
static void snap_pause(const char *what, int rank, uint64_t gen) {
    const char *e = getenv("PDDE_CHECKPOINT_PAUSE");
    char want[64];
    if (!strcmp(what, "shard")) snprintf(want, sizeof want, "shard:%d:%llu", rank, (unsigned long long)gen);
    else snprintf(want, sizeof want, "manifest:%llu", (unsigned long long)gen);
    if (!e || strcmp(e, want)) return;
    pdde_log(PDDE_LOG_INFO, "pdde: checkpoint paused at %s (pid %d)\n", want, (int)getpid());
    for (int i = 0; i < 600; i++) nanosleep(&(struct timespec){0, 100000000}, NULL);
}

static pdde_status fsync_dir(pdde_context *ctx, const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return pdde_error(ctx, PDDE_ERR_IO, "checkpoint %s: cannot open the directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    return rc == 0 ? PDDE_OK : pdde_error(ctx, PDDE_ERR_IO, "checkpoint %s: cannot fsync the directory: %s", dir, strerror(err));
}


/* One more than any generation in dir (its manifest's, or a shard file's: a save that crashed may
 * have left some), so a new save never writes over a file the current manifest names. */
static uint64_t next_generation(pdde_context *ctx, const char *dir) {
    uint64_t g = 0;
    snap_set m;
    if (manifest_read(ctx, dir, &m) == PDDE_OK) g = m.meta.generation, set_free(&m);
    DIR *d = opendir(dir);
    for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
        uint64_t x = shard_generation(e->d_name);
        if (x > g) g = x;
    }
    if (d) closedir(d);
    return g + 1;
}

/* Writes n bytes to path (created or truncated; never a FIFO or device) and fsyncs it. */
static pdde_status write_synced(pdde_context *ctx, const char *path, const void *p, size_t n, int rank, uint64_t gen) {
    FILE *f = NULL;
    pdde_status st = create_regular(ctx, path, path, &f);
    if (st) return st;
    size_t half = n / 2;
    bool ok = fwrite(p, 1, half, f) == half;
    if (ok && rank >= 0) fflush(f), snap_pause("shard", rank, gen);
    ok = ok && fwrite((const char *)p + half, 1, n - half, f) == n - half;
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = errno;
    if (fclose(f) != 0 && ok) ok = false, err = errno;
    return ok ? PDDE_OK : pdde_error(ctx, PDDE_ERR_IO, "checkpoint: cannot write %s: %s", path, strerror(err));
}

/* Rank 0's part: the manifest of every rank's index (prefix[r]: its snapshot's header and index,
 * NULL when it holds nothing), written atomically; the older generations' shards removed after. */
static pdde_status snap_commit(pdde_context *ctx, const char *dir, uint64_t gen, unsigned char **prefix, size_t *prefix_n, int world) {
    snap_set s = {.ctx = ctx};
    snprintf(s.what, sizeof s.what, "checkpoint %s", dir);
    pdde_status st = PDDE_OK;
    s.file = calloc((size_t)world, sizeof *s.file), s.file_bytes = calloc((size_t)world, 8);
    if (!s.file || !s.file_bytes) st = pdde_error(ctx, PDDE_ERR_OOM, "checkpoint %s: out of memory", dir);
    bool first = true;
    for (int r = 0; r < world && !st; r++) {
        if (!prefix[r]) continue;
        char where[128];
        snprintf(where, sizeof where, "the shard of rank %d", r);
        snap_meta m;
        st = snap_parse(&s, prefix[r], prefix_n[r], s.nsrc, true, where, &m);
        if (st) break;
        if (first) s.meta = m, first = false;
        else if (m.step != s.meta.step)
            st = pdde_error(ctx, PDDE_ERR_MISMATCH, "checkpoint %s: rank %d's snapshot is of step %llu, rank %d's of %llu", dir, r,
                            (unsigned long long)m.step, s.meta.rank, (unsigned long long)s.meta.step);
        memcpy(&s.file_bytes[s.nsrc], prefix[r] + 96, 8);
        snprintf(s.file[s.nsrc++], sizeof s.file[0], "s%llu-r%d.shard", (unsigned long long)gen, r);
    }
    if (!st && first) st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "checkpoint %s: no rank holds anything to save", dir);
    s.meta.generation = gen, s.meta.world = world;
    if (!st) st = set_check_cover(&s, true); /* every block once: a plan this code does not understand is refused here */
    snap_buf text = {0};
    if (!st) st = manifest_text(&s, &text);
    char path[4200], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, SNAP_MANIFEST), snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, SNAP_MANIFEST);
    if (!st) st = fsync_dir(ctx, dir); /* the shard files' names are durable before the manifest names them */
    if (!st) st = write_synced(ctx, tmp, text.p, text.n, -1, gen);
    if (!st) snap_pause("manifest", 0, gen);
    if (!st && rename(tmp, path) != 0) st = pdde_error(ctx, PDDE_ERR_IO, "checkpoint: cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (!st) st = fsync_dir(ctx, dir);
    if (!st) { /* the earlier generations are no longer named by the manifest */
        DIR *d = opendir(dir);
        for (struct dirent *e = d ? readdir(d) : NULL; e; e = readdir(d)) {
            uint64_t g = shard_generation(e->d_name);
            if (g && g < gen) { /* (a later save may be under way) */
                char old[4400];
                snprintf(old, sizeof old, "%s/%s", dir, e->d_name);
                unlink(old);
            }
        }
        if (d) closedir(d);
    }
    free(text.p);
    set_free(&s);
    return st;
}

/* dir without its trailing slashes (but "/"), into buf. */
static const char *dir_name(const char *dir, char *buf, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    snprintf(buf, n, "%.*s", (int)len, dir);
    return buf;
}

/* A save in progress: its snapshot, the generation rank 0 named, and this rank's shard file (written
 * here or by a thread of its own). */
struct pdde_checkpoint_writer {
    pdde_context *ctx;
    const pdde_snapshot *sn;
    pdde_snapshot *owned; /* taken by pdde_checkpoint_writer_start: freed with the writer */
    pdde_comm *world;
    char dir[4096];
    int rank, size;
    int64_t gen;
    pdde_status st;       /* this rank's outcome so far */
    char msg[1024];       /* its message, when the thread failed (errors are per thread) */
    pthread_t thread;
    bool threaded;
};

#define SNAP_WAIT_S 3600.0 /* a peer still writing a large shard: dead peers fail sooner (peer_timeout_s) */

#ifdef PDDE_HAVE_COMM
/* Waits for a receive or broadcast that may wait for the slowest rank's disk (*req: started, or NULL
 * with st its failure). */
static pdde_status snap_wait(pdde_status st, pdde_comm_request **req) {
    if (!st) st = pdde_comm_wait(*req, SNAP_WAIT_S);
    if (*req) pdde_comm_request_free(*req);
    return st;
}
#endif

/* Checks, creates the directory and agrees on the generation (collective). */
static pdde_status save_begin(pdde_checkpoint_writer *w) {
    pdde_context *ctx = w->ctx;
    w->rank = 0, w->size = 1;
#ifdef PDDE_HAVE_COMM
    if (w->world) w->rank = pdde_comm_rank(w->world), w->size = pdde_comm_size(w->world);
#else
    if (w->world) return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "checkpoint: a communicator without comm/ in this build");
#endif
    const char *dir = w->dir;
    pdde_status st = PDDE_OK;
    if (w->sn->meta.world != w->size || w->sn->meta.rank != w->rank)
        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "checkpoint %s: a snapshot of rank %d of %d saved by rank %d of %d", dir, w->sn->meta.rank,
                        w->sn->meta.world, w->rank, w->size);
    struct stat sb;
    if (!st && mkdir(dir, 0755) != 0 && errno != EEXIST) st = pdde_error(ctx, PDDE_ERR_IO, "checkpoint: cannot create the directory %s: %s", dir, strerror(errno));
    if (!st && (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))) st = pdde_error(ctx, PDDE_ERR_IO, "checkpoint: %s is not a directory", dir);
    w->gen = 0;
    if (w->rank == 0 && !st) w->gen = (int64_t)next_generation(ctx, dir);
#ifdef PDDE_HAVE_COMM
    if (w->world) { /* rank 0 names the generation; 0: it failed */
        pdde_status cs = pdde_comm_broadcast(w->world, &w->gen, 1, PDDE_I64, 0);
        if (cs) return cs;
        if (!st && w->gen == 0) st = pdde_error(ctx, PDDE_ERR_IO, "checkpoint %s: rank 0 could not start the save", dir);
    }
#endif
    w->st = st;
    return PDDE_OK;
}

/* This rank's shard file, if it holds a block no lower rank holds. */
static void *save_write(void *arg) {
    pdde_checkpoint_writer *w = arg;
    if (!w->st && (w->st = snap_ready(w->sn))) snprintf(w->msg, sizeof w->msg, "%s", pdde_last_error(w->ctx));
    if (w->st || !w->sn->n_primary) return NULL;
    char path[4200];
    snprintf(path, sizeof path, "%s/s%llu-r%d.shard", w->dir, (unsigned long long)w->gen, w->rank);
    w->st = write_synced(w->ctx, path, w->sn->data, w->sn->size, w->rank, (uint64_t)w->gen);
    if (w->st) snprintf(w->msg, sizeof w->msg, "%s", pdde_last_error(w->ctx));
    return NULL;
}

/* Every rank's outcome and index to rank 0, which commits; its outcome back to all (collective). */
static pdde_status save_commit(pdde_checkpoint_writer *w) {
    pdde_context *ctx = w->ctx;
    const pdde_snapshot *sn = w->sn;
    const char *dir = w->dir;
    int rank = w->rank, size = w->size;
    pdde_status st = w->st;
    if (st && w->msg[0]) pdde_error(ctx, st, "%s", w->msg);
    if (!st) st = snap_ready(sn); /* (a rank whose save did not start its thread) */
    size_t prefix_n = 0;
    memcpy(&prefix_n, sn->data + 88, 8), prefix_n += SNAP_HEADER + 4;
    int64_t result[2] = {st, rank};
    if (rank == 0) {
        unsigned char **prefix = calloc((size_t)size, sizeof *prefix);
        size_t *pn = calloc((size_t)size, sizeof *pn);
        if (!prefix || !pn) st = st ? st : pdde_error(ctx, PDDE_ERR_OOM, "checkpoint: out of memory");
        if (prefix && !st && sn->n_primary) prefix[0] = sn->data, pn[0] = prefix_n;
        pdde_status peer = PDDE_OK;
        int bad = 0;
#ifdef PDDE_HAVE_COMM
        for (int r = 1; r < size && prefix && pn; r++) {
            int64_t h[3];
            pdde_comm_request *req = NULL;
            pdde_status cs = pdde_comm_irecv(w->world, h, 3, PDDE_I64, r, SNAP_TAG, &req);
            cs = snap_wait(cs, &req);
            if (cs) return free(prefix), free(pn), cs; /* (a lost peer: the communication layer fails the others too) */
            if (h[0] && !peer) peer = (pdde_status)h[0], bad = r;
            if (h[1] > 0) {
                size_t words = ((size_t)h[1] + 7) / 8;
                prefix[r] = malloc(words * 8);
                if (!prefix[r]) return free(prefix), free(pn), pdde_error(ctx, PDDE_ERR_OOM, "checkpoint: out of memory");
                cs = pdde_comm_recv(w->world, prefix[r], words, PDDE_I64, r, SNAP_TAG + 1);
                if (cs) return free(prefix[r]), free(prefix), free(pn), cs;
                pn[r] = (size_t)h[1];
                if (!h[2]) free(prefix[r]), prefix[r] = NULL; /* holds only replicas: no file */
            }
        }
#endif
        if (!st && peer) st = pdde_error(ctx, peer, "checkpoint %s: rank %d could not write its shard (its own message says why); the previous checkpoint stays", dir, bad);
        if (!st) st = snap_commit(ctx, dir, (uint64_t)w->gen, prefix, pn, size);
        for (int r = 1; prefix && r < size; r++) free(prefix[r]);
        free(prefix), free(pn);
        result[0] = st, result[1] = peer && bad ? bad : 0;
    }
#ifdef PDDE_HAVE_COMM
    else {
        int64_t h[3] = {st, st ? 0 : (int64_t)prefix_n, sn->n_primary > 0};
        pdde_status cs = pdde_comm_send(w->world, h, 3, PDDE_I64, 0, SNAP_TAG);
        if (!cs && h[1] > 0) {
            size_t words = (prefix_n + 7) / 8;
            unsigned char *pad = calloc(words, 8);
            if (!pad) cs = pdde_error(ctx, PDDE_ERR_OOM, "checkpoint: out of memory");
            else memcpy(pad, sn->data, prefix_n), cs = pdde_comm_send(w->world, pad, words, PDDE_I64, 0, SNAP_TAG + 1);
            free(pad);
        }
        if (cs) return cs;
    }
    if (w->world) {
        pdde_comm_request *req = NULL;
        pdde_status cs = pdde_comm_ibroadcast(w->world, result, 2, PDDE_I64, 0, &req);
        cs = snap_wait(cs, &req);
        if (cs) return cs;
        if (!st && result[0])
            st = pdde_error(ctx, (pdde_status)result[0], "checkpoint %s: not saved (rank %d failed: its own message says why); the previous checkpoint stays",
                            dir, (int)result[1]);
    }
#else
    (void)result;
#endif
    return st;
}

static pdde_checkpoint_writer *writer_new(pdde_context *ctx, const pdde_snapshot *sn, pdde_comm *world, const char *dir) {
    pdde_checkpoint_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->ctx = ctx, w->sn = sn, w->world = world;
    dir_name(dir, w->dir, sizeof w->dir);
    return w;
}

pdde_status pdde_snapshot_save(const pdde_snapshot *sn, pdde_comm *world, const char *dir) {
    if (!sn) return PDDE_ERR_INVALID_ARG;
    if (!dir || !*dir) return pdde_error(sn->ctx, PDDE_ERR_INVALID_ARG, "snapshot_save: the directory is %s", dir ? "empty" : "NULL");
    pdde_checkpoint_writer *w = writer_new(sn->ctx, sn, world, dir);
    if (!w) return pdde_error(sn->ctx, PDDE_ERR_OOM, "checkpoint: out of memory");
    pdde_status st = save_begin(w);
    if (!st) save_write(w), st = save_commit(w);
    free(w);
    return st;
}

pdde_status pdde_checkpoint_writer_start_snapshot(const pdde_snapshot *sn, pdde_comm *world, const char *dir, pdde_checkpoint_writer **out) {
    if (!sn || !dir || !*dir || !out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    pdde_checkpoint_writer *w = writer_new(sn->ctx, sn, world, dir);
    if (!w) return pdde_error(sn->ctx, PDDE_ERR_OOM, "checkpoint: out of memory");
    pdde_status st = save_begin(w);
    if (st) { free(w); return st; }
    /* (a thread that cannot start: the file is written now) */
    w->threaded = !w->st && pthread_create(&w->thread, NULL, save_write, w) == 0;
    if (!w->threaded) save_write(w);
    *out = w;
    return PDDE_OK;
}

pdde_status pdde_checkpoint_writer_start(pdde_session *s, const char *dir, const pdde_checkpoint_extra *extra, pdde_checkpoint_writer **out) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    if (!dir || !*dir || !out)
        return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "checkpoint_writer_start: %s", !out ? "out is NULL" : dir ? "the directory is empty" : "the directory is NULL");
    *out = NULL;
    pdde_snapshot *sn = NULL;
    pdde_status st = pdde_snapshot_take(s, NULL, extra, &sn);
#ifdef PDDE_HAVE_COMM
    if (s->world) { /* a rank that could not copy its state: no rank goes on */
        float bad = st ? 1.0f : 0.0f, any = 0;
        pdde_status cs = pdde_comm_allreduce(s->world, &bad, &any, 1, PDDE_F32, PDDE_REDUCE_MAX);
        if (!st && (cs || any > 0)) st = cs ? cs : pdde_error(s->ctx, PDDE_ERR_IO, "checkpoint %s: another rank could not copy its state; not saved", dir);
    }
#endif
    if (!st) st = pdde_checkpoint_writer_start_snapshot(sn, s->world, dir, out);
    if (st) { pdde_snapshot_free(sn); return st; }
    (*out)->owned = sn;
    return PDDE_OK;
}

pdde_status pdde_checkpoint_writer_finish(pdde_checkpoint_writer *w) {
    if (!w) return PDDE_ERR_INVALID_ARG;
    if (w->threaded) pthread_join(w->thread, NULL);
    pdde_status st = save_commit(w);
    pdde_snapshot_free(w->owned);
    free(w);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * pdde_checkpoint_save/_load of a directory */

/* Whether path names a sharded checkpoint: an existing directory, or a path ending in '/'. */
static bool ckpt_is_dir(const char *path) {
    struct stat sb;
    size_t n = strlen(path);
    return (n && path[n - 1] == '/') || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
}

static pdde_status ckpt_save_dir(pdde_session *s, const char *dir, const pdde_checkpoint_extra *extra) {
    pdde_checkpoint_writer *w = NULL;
    pdde_status st = pdde_checkpoint_writer_start(s, dir, extra, &w);
    return st ? st : pdde_checkpoint_writer_finish(w);
}

static pdde_status ckpt_load_dir(pdde_session *s, const char *dir, pdde_checkpoint_extra *extra) {
    snap_set set;
    pdde_status st = manifest_read(s->ctx, dir, &set);
    if (st) return snap_agree(s->ctx, s->world, st, dir); /* (the others may have read it) */
    st = set_restore(s, &set, extra, s->world);
    set_free(&set);
    return st;
}

/* ------------------------------------------------------------------------------------------------
 * Without a session: the single-file format as a snapshot (one rank, whole tensors), conversion,
 * verification, printing */

/* Reads a single-file checkpoint (any version) into a snapshot of world size 1. */
static pdde_status single_read(pdde_context *ctx, const char *path, pdde_snapshot **out) {
    size_t size = 0;
    pdde_status st;
    char *buf = read_file(ctx, path, "checkpoint", &size, &st);
    if (!buf) return st;
    size_t header = 8 + 4 + 4 + 8 + 8 + 16;
    uint32_t version = 0, count = 0, crc = 0;
    if (size < header + 4 || memcmp(buf, CKPT_MAGIC, 8) != 0) st = pdde_error(ctx, PDDE_ERR_CORRUPT, "checkpoint %s: not a pdde checkpoint (bad magic or too short)", path);
    if (!st) memcpy(&version, buf + 8, 4), memcpy(&count, buf + 12, 4), memcpy(&crc, buf + size - 4, 4);
    if (!st && (version < 1 || version > CKPT_VERSION))
        st = pdde_error(ctx, PDDE_ERR_VERSION, "checkpoint %s: version %u, this build reads versions 1 to %u", path, version, CKPT_VERSION);
    if (!st && version >= 3) header += CKPT_SCHEDULE_BYTES;
    if (!st && (size < header + 4 || crc32_update(0, buf, size - 4) != crc))
        st = pdde_error(ctx, PDDE_ERR_CORRUPT, "checkpoint %s: checksum mismatch (truncated or damaged)", path);
    snap_meta m = {0};
    m.world = 1, m.sched = (pdde_optimizer_params)PDDE_OPTIMIZER_PARAMS_INIT;
    if (!st) {
        memcpy(&m.step, buf + 16, 8), memcpy(&m.pos, buf + 24, 8), memcpy(m.rng, buf + 32, 16);
        if (version >= 3) {
            uint32_t kind;
            memcpy(&kind, buf + 48, 4), memcpy(&m.sched.lr, buf + 52, 4), memcpy(&m.sched.min_lr_ratio, buf + 56, 4);
            memcpy(&m.sched.warmup_steps, buf + 60, 8), memcpy(&m.sched.total_steps, buf + 68, 8);
            m.sched.schedule = kind <= PDDE_LR_COSINE ? (pdde_lr_schedule)kind : PDDE_LR_CONSTANT;
        }
    }
    snap_tensor *ts = st ? NULL : calloc((size_t)count + 1, sizeof *ts);
    snap_item *it = st ? NULL : calloc((size_t)count + 1, sizeof *it);
    size_t *data_at = st ? NULL : calloc((size_t)count + 1, sizeof *data_at);
    if (!st && (!ts || !it || !data_at)) st = pdde_error(ctx, PDDE_ERR_OOM, "checkpoint %s: out of memory", path);
    snap_rd r = {(const unsigned char *)buf, size - 4, header, false};
    for (uint32_t k = 0; k < count && !st; k++) {
        snap_tensor *t = &ts[k];
        uint16_t name_len = 0, attr_len = 0;
        uint8_t dt = 0, nd = 0;
        rd_get(&r, &name_len, 2);
        if (name_len >= sizeof t->name) r.bad = true;
        rd_get(&r, t->name, r.bad ? 0 : name_len), rd_get(&r, &dt, 1), rd_get(&r, &nd, 1);
        if (dt >= PDDE_DTYPE_COUNT || nd > PDDE_MAX_DIMS) r.bad = true;
        rd_get(&r, t->shape, r.bad ? 0 : 8u * nd);
        if (version >= 2) {
            rd_get(&r, &attr_len, 2);
            if (attr_len >= sizeof t->attr) r.bad = true;
            rd_get(&r, t->attr, r.bad ? 0 : attr_len);
        }
        rd_get(&r, &it[k].nbytes, 8);
        t->dtype = (pdde_dtype)dt, t->ndim = nd;
        int64_t numel = 1;
        if (!r.bad && !shape_ok(t->shape, nd)) r.bad = true;
        for (int d = 0; d < nd && !r.bad; d++) numel *= t->shape[d], it[k].box.extent[d] = t->shape[d];
        if (r.bad || it[k].nbytes != (uint64_t)numel * pdde_dtype_size(t->dtype) || it[k].nbytes > r.n - r.at) {
            st = pdde_error(ctx, PDDE_ERR_CORRUPT, "checkpoint %s: record %u (%s) is malformed or runs past the end of the file", path, k, t->name);
            break;
        }
        it[k].t = t, it[k].primary = true, data_at[k] = r.at, r.at += (size_t)it[k].nbytes;
    }
    if (!st && r.at != r.n) st = pdde_error(ctx, PDDE_ERR_CORRUPT, "checkpoint %s: %zu bytes after the last of its %u records", path, r.n - r.at, count);
    pdde_snapshot *sn = NULL;
    if (!st) st = snap_alloc(ctx, &m, it, (int)count, &sn);
    for (uint32_t k = 0; !st && k < count; k++) memcpy(sn->data + it[k].offset, buf + data_at[k], (size_t)it[k].nbytes);
    if (!st) st = snap_seal(sn, it, (int)count);
    free(buf), free(ts), free(it), free(data_at);
    if (st) { pdde_snapshot_free(sn); return st; }
    *out = sn;
    return PDDE_OK;
}

/* The set of one snapshot (its source: it). */
static pdde_status set_of_snapshot(pdde_context *ctx, const pdde_snapshot *const *sn, const char *what, snap_set *s) {
    *s = (snap_set){.ctx = ctx};
    snprintf(s->what, sizeof s->what, "%s", what);
    pdde_status st = snap_parse(s, (*sn)->data, (*sn)->size, 0, false, "it", &s->meta);
    s->snap = sn, s->nsrc = 1;
    if (st) set_free(s);
    return st;
}

/* Reads a checkpoint of either format into a set (a single file through a snapshot, *sn). */
static pdde_status set_open(pdde_context *ctx, const char *path, snap_set *s, pdde_snapshot **sn) {
    *sn = NULL;
    if (ckpt_is_dir(path)) return manifest_read(ctx, path, s);
    pdde_status st = single_read(ctx, path, sn);
    if (st) return st;
    char what[600];
    snprintf(what, sizeof what, "checkpoint %s", path);
    st = set_of_snapshot(ctx, (const pdde_snapshot *const *)sn, what, s);
    if (st) pdde_snapshot_free(*sn), *sn = NULL;
    return st;
}

/* Writes set s as a single file at path (path.tmp, fsync'ed, renamed). */
static pdde_status single_write(snap_set *s, const char *path) {
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "checkpoint: path too long");
    ckpt_writer w = {NULL, 0, true};
    pdde_status st = create_regular(s->ctx, path, tmp, &w.f);
    if (st) return st;
    const snap_meta *m = &s->meta;
    uint32_t version = CKPT_VERSION, count = (uint32_t)s->nt, kind = (uint32_t)m->sched.schedule;
    ckpt_put(&w, CKPT_MAGIC, 8), ckpt_put(&w, &version, 4), ckpt_put(&w, &count, 4);
    ckpt_put(&w, &m->step, 8), ckpt_put(&w, &m->pos, 8), ckpt_put(&w, m->rng, 16);
    ckpt_put(&w, &kind, 4), ckpt_put(&w, &m->sched.lr, 4), ckpt_put(&w, &m->sched.min_lr_ratio, 4);
    ckpt_put(&w, &m->sched.warmup_steps, 8), ckpt_put(&w, &m->sched.total_steps, 8);
    char *buf = NULL, *scratch = NULL;
    size_t cap = 0;
    for (int i = 0; i < s->nt && !st; i++) {
        const snap_tensor *t = &s->t[i];
        snap_box all = {{0}, {0}};
        for (int d = 0; d < t->ndim; d++) all.extent[d] = t->shape[d];
        uint64_t nbytes = (uint64_t)box_numel(&all, t->ndim) * pdde_dtype_size(t->dtype);
        free(buf);
        if (!(buf = malloc((size_t)nbytes + 1))) { st = pdde_error(s->ctx, PDDE_ERR_OOM, "%s: out of memory", s->what); break; }
        st = set_assemble(s, i, &all, buf, &scratch, &cap);
        if (st) break;
        uint16_t name_len = (uint16_t)strlen(t->name), attr_len = (uint16_t)strlen(t->attr);
        uint8_t dtype = (uint8_t)t->dtype, ndim = (uint8_t)t->ndim;
        ckpt_put(&w, &name_len, 2), ckpt_put(&w, t->name, name_len), ckpt_put(&w, &dtype, 1), ckpt_put(&w, &ndim, 1);
        ckpt_put(&w, t->shape, 8 * (size_t)ndim), ckpt_put(&w, &attr_len, 2), ckpt_put(&w, t->attr, attr_len);
        ckpt_put(&w, &nbytes, 8), ckpt_put(&w, buf, nbytes);
    }
    free(buf), free(scratch);
    uint32_t crc = w.crc;
    if (w.ok) w.ok = fwrite(&crc, 1, 4, w.f) == 4;
    if (w.ok) w.ok = fflush(w.f) == 0 && fsync(fileno(w.f)) == 0;
    if (fclose(w.f) != 0) w.ok = false;
    if (!st && !w.ok) st = pdde_error(s->ctx, PDDE_ERR_IO, "checkpoint: cannot write %s: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0) st = pdde_error(s->ctx, PDDE_ERR_IO, "checkpoint: cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st) unlink(tmp);
    return st;
}

pdde_status pdde_checkpoint_convert(pdde_context *ctx, const char *from, const char *to) {
    if (!ctx || !from || !to) return PDDE_ERR_INVALID_ARG;
    if (ckpt_is_dir(from)) {
        snap_set s;
        pdde_status st = manifest_read(ctx, from, &s);
        if (st) return st;
        st = single_write(&s, to);
        set_free(&s);
        return st;
    }
    pdde_snapshot *sn = NULL;
    pdde_status st = single_read(ctx, from, &sn);
    if (!st) st = pdde_snapshot_save(sn, NULL, to);
    pdde_snapshot_free(sn);
    return st;
}

pdde_status pdde_checkpoint_verify(pdde_context *ctx, const char *path) {
    if (!ctx) return PDDE_ERR_INVALID_ARG;
    if (!path) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "checkpoint_verify: path is NULL");
    snap_set s;
    pdde_snapshot *sn = NULL;
    pdde_status st = set_open(ctx, path, &s, &sn); /* the manifest's CRC and its blocks' cover, or the file's CRC */
    if (st) return st;
    /* each shard's own header and index, and its blocks as the manifest names them */
    for (int f = 0; f < s.nsrc && !sn && !st; f++) {
        snap_set own = {.ctx = ctx};
        snprintf(own.what, sizeof own.what, "%s", s.what);
        char where[4200];
        snprintf(where, sizeof where, "shard file %s/%s", path, s.file[f]);
        int k = 0;
        while (k < s.nb && s.b[k].src != f) k++;
        if (k == s.nb) continue; /* (named but holding no block: never written) */
        char *tmp = NULL;
        size_t cap = 0;
        const char *unused;
        st = set_block_data(&s, &s.b[k], &tmp, &cap, &unused); /* opens it: missing, or of another size */
        size_t head = 0;
        unsigned char *prefix = NULL;
        if (!st) {
            uint64_t index_bytes = 0;
            unsigned char h[SNAP_HEADER];
            if (pread(s.fd[f], h, SNAP_HEADER, 0) == (ssize_t)SNAP_HEADER) memcpy(&index_bytes, h + 88, 8);
            head = SNAP_HEADER + 4 + (size_t)(index_bytes < s.file_bytes[f] ? index_bytes : 0);
            prefix = malloc(head);
            if (!prefix || pread(s.fd[f], prefix, head, 0) != (ssize_t)head) st = pdde_error(ctx, PDDE_ERR_IO, "%s: %s: cannot read its header", s.what, where);
        }
        if (!st) st = snap_parse(&own, prefix, head, 0, true, where, NULL);
        for (int b = 0; b < s.nb && !st; b++) {
            if (s.b[b].src != f) continue;
            const snap_block *x = &s.b[b];
            bool found = false;
            for (int j = 0; j < own.nb && !found; j++)
                found = !strcmp(own.t[own.b[j].tensor].name, s.t[x->tensor].name) && own.b[j].offset == x->offset && own.b[j].crc == x->crc &&
                        box_equal(&own.b[j].box, &x->box, s.t[x->tensor].ndim);
            if (!found) st = pdde_error(ctx, PDDE_ERR_CORRUPT, "%s: %s does not hold the block of tensor %s that the manifest says", s.what, where, s.t[x->tensor].name);
        }
        free(prefix), free(tmp);
        set_free(&own);
    }
    /* every block's data against its CRC */
    char *tmp = NULL;
    size_t cap = 0;
    for (int b = 0; b < s.nb && !st; b++) {
        const char *data;
        st = set_block_data(&s, &s.b[b], &tmp, &cap, &data);
    }
    free(tmp);
    set_free(&s);
    pdde_snapshot_free(sn);
    return st;
}

pdde_status pdde_checkpoint_print(pdde_context *ctx, const char *path, FILE *out) {
    if (!ctx) return PDDE_ERR_INVALID_ARG;
    if (!path || !out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "checkpoint_print: %s is NULL", !path ? "path" : "out");
    snap_set s;
    pdde_snapshot *sn = NULL;
    pdde_status st = set_open(ctx, path, &s, &sn);
    if (st) return st;
    const snap_meta *m = &s.meta;
    uint64_t bytes = 0;
    for (int b = 0; b < s.nb; b++) bytes += s.b[b].nbytes;
    fprintf(out, "%s: %s, %d tensors, %d blocks, %.3f MB\n", path, sn ? "single file" : "sharded", s.nt, s.nb, (double)bytes / 1e6);
    fprintf(out, "step %llu (the optimizer's step count), data position %llu, seed %llu, run counter %llu\n", (unsigned long long)m->step,
            (unsigned long long)m->pos, (unsigned long long)m->rng[0], (unsigned long long)m->rng[1]);
    fprintf(out, "schedule %s lr %g min_lr_ratio %g warmup %lld total %lld\n", m->sched.schedule == PDDE_LR_COSINE ? "cosine" : "constant",
            m->sched.lr, m->sched.min_lr_ratio, (long long)m->sched.warmup_steps, (long long)m->sched.total_steps);
    if (!sn) {
        fprintf(out, "generation %llu, saved by %d rank%s\n", (unsigned long long)m->generation, m->world, m->world > 1 ? "s" : "");
        for (int f = 0; f < s.nsrc; f++) fprintf(out, "file %s %llu bytes\n", s.file[f], (unsigned long long)s.file_bytes[f]);
    }
    for (int i = 0; i < s.nt; i++) {
        const snap_tensor *t = &s.t[i];
        char shape[128] = "", bs[256];
        int k = 0;
        for (int d = 0; d < t->ndim; d++) k += snprintf(shape + k, sizeof shape - (size_t)k, d ? "x%lld" : "%lld", (long long)t->shape[d]);
        fprintf(out, "tensor %s %s [%s] %s\n", t->name, pdde_dtype_name(t->dtype), shape, t->attr[0] ? t->attr : "(no dist attr)");
        for (int b = 0; b < s.nb; b++) {
            if (s.b[b].tensor != i) continue;
            box_str(&s.b[b].box, t->ndim, bs, sizeof bs);
            fprintf(out, "  block %s in %s at %llu, %llu bytes, crc %08x\n", bs, sn ? path : s.file[s.b[b].src], (unsigned long long)s.b[b].offset,
                    (unsigned long long)s.b[b].nbytes, s.b[b].crc);
        }
    }
    set_free(&s);
    pdde_snapshot_free(sn);
    return PDDE_OK;
}
