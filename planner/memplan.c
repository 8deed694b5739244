/* planner/memplan.c — the memory plan of a local program: where each tensor of one rank's program
 * lives and how big each device's buffers are. Persistent tensors (parameters, gradients, optimizer
 * state, inputs: the leaves) are laid out one after the other in a device's persistent buffer, inputs
 * once per micro-batch; every other tensor gets bytes of the device's activation arena for its
 * lifetime (best fit; freed blocks merge), and the arena is allocated once per micro-batch alive.
 *
 * It is a pure function of the program, so the executor allocates exactly what it says (pdde.c,
 * session_plan_memory) and the cost model predicts a rank's memory from the same plan without a
 * session (pdde_predict_memory): prediction and allocation cannot drift apart. Included by pdde.c after
 * lower.c. */
#include "planner_impl.h"

typedef struct { size_t offset, size; } arena_block;

/* Arena planning: a sorted list of free blocks; best fit; freed blocks merge with their neighbours. */
typedef struct { arena_block *free; int n, cap; size_t top; } arena_plan;

PDDE_PRIVATE size_t program_aligned_bytes(const pdde_tensor *t) {
    return (pdde_tensor_nbytes(t) + PDDE_ARENA_ALIGN - 1) / PDDE_ARENA_ALIGN * PDDE_ARENA_ALIGN;
}

static void arena_alloc(arena_plan *a, size_t size, size_t *offset) {
    size = (size + PDDE_ARENA_ALIGN - 1) / PDDE_ARENA_ALIGN * PDDE_ARENA_ALIGN;
    if (size == 0) size = PDDE_ARENA_ALIGN;
    int best = -1;
    for (int i = 0; i < a->n; i++)
        if (a->free[i].size >= size && (best < 0 || a->free[i].size < a->free[best].size)) best = i;
    if (best >= 0) {
        *offset = a->free[best].offset;
        a->free[best].offset += size, a->free[best].size -= size;
        if (a->free[best].size == 0) memmove(&a->free[best], &a->free[best + 1], (size_t)(--a->n - best) * sizeof *a->free);
        return;
    }
    /* grow the top; a free block touching the top is extended rather than wasted */
    if (a->n > 0 && a->free[a->n - 1].offset + a->free[a->n - 1].size == a->top) {
        *offset = a->free[a->n - 1].offset;
        a->top = *offset + size;
        a->n--;
    } else {
        *offset = a->top;
        a->top += size;
    }
}

static bool arena_release(arena_plan *a, size_t offset, size_t size) {
    size = (size + PDDE_ARENA_ALIGN - 1) / PDDE_ARENA_ALIGN * PDDE_ARENA_ALIGN;
    if (size == 0) size = PDDE_ARENA_ALIGN;
    int i = 0;
    while (i < a->n && a->free[i].offset < offset) i++;
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 64;
        arena_block *f = realloc(a->free, (size_t)cap * sizeof *f);
        if (!f) return false;
        a->free = f, a->cap = cap;
    }
    memmove(&a->free[i + 1], &a->free[i], (size_t)(a->n - i) * sizeof *a->free);
    a->free[i] = (arena_block){offset, size};
    a->n++;
    if (i + 1 < a->n && a->free[i].offset + a->free[i].size == a->free[i + 1].offset) { /* merge right */
        a->free[i].size += a->free[i + 1].size;
        memmove(&a->free[i + 1], &a->free[i + 2], (size_t)(a->n - i - 2) * sizeof *a->free);
        a->n--;
    }
    if (i > 0 && a->free[i - 1].offset + a->free[i - 1].size == a->free[i].offset) { /* merge left */
        a->free[i - 1].size += a->free[i].size;
        memmove(&a->free[i], &a->free[i + 1], (size_t)(a->n - i - 1) * sizeof *a->free);
        a->n--;
    }
    return true;
}

/* The slot of device `device` in m (added in the order devices first appear, as the session opens them). */
static int memplan_slot(program_memory *m, int device) {
    for (int i = 0; i < m->n_devs; i++)
        if (m->devs[i].device == device) return i;
    program_device_memory *d = realloc(m->devs, (size_t)(m->n_devs + 1) * sizeof *d);
    if (!d) return -1;
    m->devs = d;
    d[m->n_devs] = (program_device_memory){device, 0, 0};
    return m->n_devs++;
}

PDDE_PRIVATE void program_memory_free(program_memory *m) {
    if (m) free(m->devs), free(m->slot), free(m->overwritten);
}

/* by device slot, then the largest first, then the earliest */
static int arena_item_order(const void *a, const void *b) {
    const arena_item *x = a, *y = b;
    if (x->slot != y->slot) return x->slot - y->slot;
    if (x->size != y->size) return x->size < y->size ? 1 : -1;
    return x->from - y->from;
}

/* Offline placement (greedy by size, as TFLite's arena planner): the largest tensors first (items
 * sorted so: arena_item_order), each in the tightest gap between the tensors placed so far whose lifetimes overlap its own. It knows every
 * lifetime in advance, so a tensor freed and made again later (ZeRO-3's parameter gathered for forward
 * and again for backward) does not leave holes that smaller tensors split; the walk in step order
 * cannot. Returns the arena's size, the items their offsets; -1: out of memory. */
PDDE_PRIVATE int64_t arena_greedy(arena_item *items, int n) {
    arena_item **placed = malloc((size_t)(n ? n : 1) * sizeof *placed);
    if (!placed) return -1;
    size_t top = 0;
    int n_placed = 0;
    for (int i = 0; i < n; i++) {
        arena_item *it = &items[i];
        size_t at = 0, best = SIZE_MAX, best_gap = SIZE_MAX;
        for (int j = 0; j < n_placed; j++) { /* (placed by offset) */
            const arena_item *q = placed[j];
            if (q->to < it->from || it->to < q->from) continue;
            if (q->offset > at && q->offset - at >= it->size && q->offset - at < best_gap) best = at, best_gap = q->offset - at;
            if (q->offset + q->size > at) at = q->offset + q->size;
        }
        it->offset = best != SIZE_MAX ? best : at;
        if (it->offset + it->size > top) top = it->offset + it->size;
        int k = n_placed++;
        while (k > 0 && placed[k - 1]->offset > it->offset) placed[k] = placed[k - 1], k--;
        placed[k] = it;
    }
    free(placed);
    return (int64_t)top;
}

/* t's place in device d's persistent buffer: inputs one slot per micro-batch; a gradient accumulator that
 * its gradient's producer writes (lower_direct_grads) as many bytes as that writes, with the accumulator of
 * what it writes beside them (grad_pair) right after its values (placed with it, whichever comes first). */
static void persist_place(const pdde_program *P, program_device_memory *d, pdde_tensor *t, uint8_t *placed) {
    pdde_tensor *first = t, *second = P->info[t->id].grad_pair;
    if (second && !P->info[t->id].grad_into_bytes) first = second, second = t; /* (the one its producer writes goes first) */
    size_t aligned = program_aligned_bytes(first), written = P->info[first->id].grad_into_bytes;
    if (written > aligned || second) aligned = (written + PDDE_ARENA_ALIGN - 1) / PDDE_ARENA_ALIGN * PDDE_ARENA_ALIGN;
    /* one slot per micro-batch; a state input (pdde_mark_state) is one value for every micro-batch */
    bool per_micro = (first->flags & PDDE_TENSOR_INPUT) && !(first->flags & PDDE_TENSOR_STATE) && P->n_micro > 1;
    first->offset = d->persist_bytes, placed[first->id] = 1;
    d->persist_bytes += aligned * (per_micro ? (size_t)P->n_micro : 1);
    if (second) second->offset = d->persist_bytes, placed[second->id] = 1, d->persist_bytes += program_aligned_bytes(second);
}

/* Lifetimes and offsets. A storage root is freed after the last node that reads it or any tensor
 * sharing its memory (views, in-place writers). Losses and outputs live to the end of the step. An
 * in-place write into a tensor that someone still reads later gets its own memory instead (its
 * INPLACE flag is cleared). Writes each node's offset. */
PDDE_PRIVATE pdde_status program_plan_memory(pdde_context *ctx, pdde_program *P, bool reuse, program_memory *m) {
    memset(m, 0, sizeof *m);
    int n = P->n, end = P->n_order;
    int *last = malloc((size_t)(n ? n : 1) * sizeof *last);
    m->slot = malloc((size_t)(n ? n : 1) * sizeof *m->slot);
    int **release_at = calloc((size_t)end + 1, sizeof *release_at);
    int *n_release = calloc((size_t)end + 1, sizeof *n_release);
    arena_plan *plans = NULL;
    arena_item *items = malloc((size_t)(end ? end : 1) * sizeof *items); /* the arena's tensors, for arena_greedy */
    int n_items = 0;
    uint8_t *placed = calloc((size_t)n + 1, 1); /* persistent tensors given their offsets (persist_place) */
    pdde_status st = last && m->slot && release_at && n_release && items && placed ? PDDE_OK : PDDE_ERR_OOM;
    for (int i = 0; i < end && !st; i++)
        if ((m->slot[P->order[i]->id] = memplan_slot(m, P->order[i]->device)) < 0) st = PDDE_ERR_OOM;
    if (!st && !(plans = calloc((size_t)m->n_devs + 1, sizeof *plans))) st = PDDE_ERR_OOM;
    if (st) goto done;
    for (int i = 0; i < n; i++) last[i] = -1;
    for (int i = 0; i < end; i++) {
        pdde_tensor *t = P->order[i];
        for (int k = 0; k < t->nsrc; k++) last[t->src[k]->id] = i > last[t->src[k]->id] ? i : last[t->src[k]->id];
        /* a collective started early reads its inputs until its wait completes it (a two-axis
         * gather's second step reads the first's result) */
        const pdde_tensor *c = t->op == PDDE_OP_COMM_WAIT ? t->src[0] : NULL;
        for (int k = 0; c && k < c->nsrc; k++) last[c->src[k]->id] = i > last[c->src[k]->id] ? i : last[c->src[k]->id];
    }
    for (int i = 0; i < end; i++) {
        pdde_tensor *t = P->order[i];
        if ((t->flags & PDDE_TENSOR_INPLACE) && !is_persistent(storage_root(t->src[0])) && last[t->src[0]->id] > i)
            t->flags &= ~(uint32_t)PDDE_TENSOR_INPLACE;
    }
    /* group lifetimes on the storage roots */
    for (int i = 0; i < end; i++) {
        pdde_tensor *t = P->order[i];
        int l = last[t->id] > i ? last[t->id] : i;
        if (t->flags & (PDDE_TENSOR_LOSS | PDDE_TENSOR_OUTPUT)) l = end;
        pdde_tensor *r = storage_root(t);
        if (l > last[r->id]) last[r->id] = l;
    }
    /* what a read after the run cannot see: arena memory released before the step's end */
    if (!(m->overwritten = calloc((size_t)(n ? n : 1), 1))) { st = PDDE_ERR_OOM; goto done; }
    for (int i = 0; i < end && reuse; i++) {
        pdde_tensor *t = P->order[i], *r = storage_root(t);
        m->overwritten[t->id] = !is_persistent(r) && !P->info[r->id].own_buffer && last[r->id] < end;
    }
    /* walk the schedule: allocate roots when made, release them after their last reader */
    pdde_memory_stats *s = &m->stats;
    size_t exchange = 0; /* the expert exchange's buffer */
    size_t live = 0; /* activation bytes alive (activation_peak_bytes: their most, fragmentation aside) */
    for (int i = 0; i < end && !st; i++) {
        pdde_tensor *t = P->order[i];
        program_device_memory *d = &m->devs[m->slot[t->id]];
        size_t bytes = node_alloc_bytes(t);
        if (is_root_sharing(t)) {
            /* shares its root's memory */
        } else if (P->info[t->id].own_buffer) {
            s->transfer_bytes += bytes + 1; /* the session's staging buffer, pinned where it can be */
        } else if (is_persistent(t)) {
            if (!placed[t->id]) persist_place(P, d, t, placed);
            if (t->flags & (PDDE_TENSOR_PARAM | PDDE_TENSOR_SHADOW)) s->param_bytes += bytes; /* (and their bf16 copies) */
            else if (t->flags & PDDE_TENSOR_GRAD) s->grad_bytes += bytes;
            else if ((t->flags & PDDE_TENSOR_STATE) && !(t->flags & PDDE_TENSOR_INPUT)) s->optimizer_bytes += bytes; /* (a state input: an input's) */
            else s->input_bytes += bytes;
        } else {
            s->activation_bytes += bytes;
            live += bytes;
            if (live > s->activation_peak_bytes) s->activation_peak_bytes = live;
            arena_alloc(&plans[m->slot[t->id]], bytes, &t->offset);
            int at = reuse ? last[t->id] : end;
            size_t size = (bytes + PDDE_ARENA_ALIGN - 1) / PDDE_ARENA_ALIGN * PDDE_ARENA_ALIGN;
            items[n_items++] = (arena_item){size ? size : PDDE_ARENA_ALIGN, i, at, t->id, m->slot[t->id], 0};
            int *list = realloc(release_at[at], (size_t)(n_release[at] + 1) * sizeof *list);
            if (!list) { st = PDDE_ERR_OOM; break; }
            release_at[at] = list;
            list[n_release[at]++] = t->id;
        }
        for (int k = 0; k < n_release[i]; k++) {
            pdde_tensor *r = P->nodes[release_at[i][k]];
            live -= node_alloc_bytes(r);
            if (!arena_release(&plans[m->slot[r->id]], r->offset, node_alloc_bytes(r))) st = PDDE_ERR_OOM;
        }
        /* host copies of what leaves this rank or crosses devices (not in the buffers above) */
        if (t->op == PDDE_OP_SEND) s->transfer_bytes += bytes * (size_t)P->n_live + 1;
        if (t->op == PDDE_OP_COPY && !registry_device_is_host(ctx->registry, t->device)) s->transfer_bytes += bytes + 1;
        /* the expert exchange's rows out and in: one buffer for the largest (core/session.c) */
        if (t->op == PDDE_OP_ALLTOALL && t->nsrc > 1 && pdde_tensor_nbytes(t->src[0]) + bytes + 1 > exchange)
            exchange = pdde_tensor_nbytes(t->src[0]) + bytes + 1;
    }
    s->transfer_bytes += exchange;
    /* each device's arena: the offline placement where it is smaller than the walk's */
    if (!st && reuse) {
        qsort(items, (size_t)n_items, sizeof *items, arena_item_order);
        for (int i = 0, j; i < n_items && !st; i = j) {
            int d = items[i].slot;
            for (j = i; j < n_items && items[j].slot == d; j++) {}
            int64_t top = arena_greedy(items + i, j - i);
            if (top < 0) st = PDDE_ERR_OOM;
            else if ((size_t)top < plans[d].top) {
                plans[d].top = (size_t)top;
                for (int k = i; k < j; k++) P->nodes[items[k].id]->offset = items[k].offset;
            }
        }
    }
    int staging_device = -1; /* (collectives and receives on device memory: the session's one bounce buffer) */
    s->transfer_bytes += program_comm_staging_bytes(ctx, P, &staging_device);
    /* ZeRO-3's prefetched gathers on device memory: their host regions; and the blocks' scratch */
    s->transfer_bytes += P->prefetch_staging_bytes + program_gather_scratch_bytes(P);
    /* the buffers the session allocates: n_live arenas and a persistent buffer per device (at least
     * one alignment unit each) */
    for (int d = 0; d < m->n_devs && !st; d++) {
        program_device_memory *pd = &m->devs[d];
        pd->arena_bytes = plans[d].top;
        s->arena_bytes += plans[d].top * (size_t)P->n_live;
        size_t arena = pd->arena_bytes ? pd->arena_bytes : PDDE_ARENA_ALIGN, persist = pd->persist_bytes ? pd->persist_bytes : PDDE_ARENA_ALIGN;
        s->allocated_bytes += arena * (size_t)P->n_live + persist;
        s->persistent_allocated_bytes += persist;
    }
    s->n_nodes = end;
done:
    for (int d = 0; plans && d < m->n_devs; d++) free(plans[d].free);
    for (int i = 0; release_at && i <= end; i++) free(release_at[i]);
    free(release_at), free(n_release), free(plans), free(last), free(items), free(placed);
    if (st) {
        program_memory_free(m);
        memset(m, 0, sizeof *m);
        return pdde_error(ctx, st, "memory plan: out of memory");
    }
    return PDDE_OK;
}

PDDE_PRIVATE size_t program_comm_staging_bytes(pdde_context *ctx, const pdde_program *P, int *device) {
    size_t most = 0;
    for (int i = 0; i < P->n_order; i++) {
        const pdde_tensor *t = P->order[i];
        const pdde_program_node *in = &P->info[t->id];
        size_t need = 0;
        if (t->op >= PDDE_OP_ALLREDUCE && t->op <= PDDE_OP_ALLGATHER && in->axis >= 0 && !in->bucket && !in->bucket_members) {
            const pdde_tensor *x = t->src[t->op == PDDE_OP_ALLGATHER ? t->nsrc - 1 : 0]; /* (what it sends: core/session.c run_reshard) */
            if (!registry_device_is_host(ctx->registry, x->device) || !registry_device_is_host(ctx->registry, t->device))
                need = pdde_tensor_nbytes(x) + pdde_tensor_nbytes(t);
        } else if (t->op == PDDE_OP_RECV && !registry_device_is_host(ctx->registry, t->device)) {
            need = pdde_tensor_nbytes(t);
        }
        if (need > most) most = need, *device = t->device;
    }
    return most;
}

PDDE_PRIVATE size_t program_gather_scratch_bytes(const pdde_program *P) {
    size_t most = 0;
    for (int i = 0; i < P->n_order; i++) {
        const pdde_tensor *t = P->order[i];
        const pdde_program_node *in = &P->info[t->id];
        if ((t->op != PDDE_OP_ALLGATHER && t->op != PDDE_OP_REDUCE_SCATTER) || in->axis < 0 || in->dim <= 0 || in->bucket || in->bucket_members) continue;
        size_t need = pdde_tensor_nbytes(t->op == PDDE_OP_ALLGATHER ? t : t->src[0]); /* (the whole side) */
        if (need > most) most = need;
    }
    return most;
}

PDDE_PRIVATE bool program_device_bucket_served(pdde_context *ctx, const pdde_program *P, const pdde_tensor *b, const pdde_device_collectives_iface *dc) {
    const pdde_program_node *bi = &P->info[b->id];
    bool rs = dc->struct_size >= offsetof(pdde_device_collectives_iface, reduce_scatter) + sizeof dc->reduce_scatter && dc->reduce_scatter;
    bool ag = dc->struct_size >= offsetof(pdde_device_collectives_iface, allgather) + sizeof dc->allgather && dc->allgather;
    bool served = b->op == PDDE_OP_ALLREDUCE || (b->op == PDDE_OP_REDUCE_SCATTER && rs) || (b->op == PDDE_OP_ALLGATHER && ag);
    if (!bi->own_buffer || !served || !bi->bucket_next || !dc->backend) return false;
    const pdde_registry *r = ctx->registry;
    int d = bi->bucket_next->src[bi->bucket_next->nsrc - 2]->device; /* (a member's input: core/session.c bucket_member_input) */
    if (d < 0 || d >= r->n_devices || registry_device_is_host(r, d)) return false;
    const pdde_backend_iface *f = r->families[r->devices[d].family].iface;
    if (!f || !IFACE_HAS(f, copy) || !f->name || strcmp(f->name, dc->backend)) return false;
    for (const pdde_tensor *m = bi->bucket_next; m; m = P->info[m->id].bucket_next)
        if (m->src[m->nsrc - 2]->device != d || m->device != d) return false;
    return true;
}
