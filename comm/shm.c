/* comm/shm.c — the shared-memory channel of a communicator whose ranks all live on one host, and the
 * collectives that run on it instead of the transport: allreduce, reduce-scatter, allgather, broadcast.
 *
 * Every member maps one segment (created by comm rank 0, named through the store, unlinked as soon
 * as everyone has it mapped). It holds one flag per rank and, per rank, two sets of staging areas
 * ("in": a chunk of the message, "res": the rank's reduced part of it). A flag counts the barriers
 * its rank has reached; a barrier is "publish my count, wait until every flag has reached it", one
 * cache line each way, no tag matching, no requests, no system call.
 *
 *  - up to SHM_WHOLE_BYTES: copy the message into my "in", barrier, every rank reduces all of them
 *    (in rank order, so the ranks agree bit for bit); one barrier per operation;
 *  - above, per chunk: copy the parts the others reduce into my "in", barrier, reduce my part from
 *    everybody's "in" straight into my buffer and my "res", barrier, copy the others' parts from their
 *    "res" (a reduce-scatter and an allgather through memory the caches share). A chunk stays in cache,
 *    so the message itself is read and written once from memory.
 *
 * Reduce-scatter, allgather and broadcast take one barrier per chunk: copy into my "in" what the others
 * read (reduce-scatter: their blocks' parts; allgather: my block's part; broadcast: the root's part),
 * barrier, then read from the others' "in" (reduce my block's part from everybody's, in rank order
 * after my own; copy each rank's part; copy the root's part).
 *
 * All-to-all(v) starts with a table: each rank writes the bytes it sends to and expects from every
 * rank, its send buffer's address and its process id into the segment, barrier; now every rank knows
 * the largest message and finds counts that disagree (the same error on all of them, at once, instead
 * of a timeout). Small messages (every pair's fits one chunk slot, chunk / n bytes, and at most 16 KiB,
 * 64 KiB where the ranks outnumber the cores) go into the chunk slots described below before that
 * barrier and are copied out after it: one barrier in all, no system call (two copies that stay in the
 * caches beat a cross-memory read's system call and page pinning up to there). A rank with a core of
 * its own copies its own block while it waits at that barrier (where its buffers do not overlap; from
 * 256 KiB with stores that bypass the caches). Then, where the messages are larger and the kernel lets a process read its
 * peers' memory (cross-memory attach, process_vm_readv: the same user, no ptrace restriction), each rank
 * reads what every peer sends it straight from the peer's send buffer into its receive buffer (one
 * copy, the pairs at once), barrier (the send buffers may be reused after it). Where a sender's blocks
 * for the others lie in one registered buffer (buffer.c), its readers copy them through their mapping
 * of it instead, a plain memcpy (with PDDE_COMM_CMA=0 too), and such a sender offers the table only up
 * to 4 KiB pairs (16 KiB where the ranks outnumber the cores). Elsewhere (small
 * messages, PDDE_COMM_CMA=0, or a read refused: then every rank stops trying it on this channel) one
 * barrier per chunk: a chunk gives every ordered pair a slot of chunk / n bytes in the sender's "in";
 * the sender copies its next piece for each peer into that peer's slot, barrier, each rank copies its
 * slots out of every peer's "in" (through the caches the ranks share).
 *
 * Buffer sets alternate per chunk (or small operation). Reusing a set is safe without a wait: before
 * unit u writes set u % 2, every peer has reached the first barrier of unit u - 1, so it has finished
 * reading everything of unit u - 2 (every kind reads a unit's areas before it arrives at a barrier of
 * the unit after next).
 *
 * Waiting: a rank that waits past the spinning and yielding (and has a core of its own) sleeps on a
 * futex word of the rank it waits for (the low half of that rank's barrier count), which wakes it when
 * it arrives; the sleep has a timeout, so the deadline and the failure state are still checked. Where
 * the ranks outnumber the cores, the waits of a blocking all-to-all with messages of 256 KiB or more
 * sleep so after 100 us of yielding (its own block is copied after the table's barrier there, from 2 MiB
 * bypassing the caches).
 *
 * Failures: every wait has the communicator's timeout and watches the world's failure state, which the
 * service thread takes from the store (a dead rank's death notice) within ~50 ms; the service thread is
 * kept polling while a rank waits here. */

#ifndef PDDE_COMM_SHM_C
#define PDDE_COMM_SHM_C

#include "util.c"
#include "store.c"
#include "world.c"
#include "buffer.c"
#include "schedule.c"
#include "progress.c"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

#define SHM_CHUNK_BYTES (512u << 10) /* a chunk of a large message (1 MiB did worse: the L2 size here) */
#define SHM_WHOLE_BYTES (16u << 10)  /* at or below: every rank reduces the whole message */
#define SHM_A2A_SMALL_MAX (16u << 10)        /* all-to-all: the largest message with the table (see shm_a2a_small) */
#define SHM_A2A_SMALL_MAX_SHARED (64u << 10) /* ... where the ranks outnumber the cores */
#define SHM_A2A_SMALL_REG (4u << 10)         /* ... from a registered send buffer (read through a mapping above) */
#define SHM_A2A_SMALL_REG_SHARED (16u << 10) /* ... and where the ranks outnumber the cores */
#define SHM_MAX_RANKS 64
#define SHM_SLEEP_S 1e-3             /* a futex sleep's longest: how often a sleeping wait checks the failure state */
#define SHM_LINE 128                 /* a flag per 128 bytes: adjacent-line prefetch would pair 64 */

struct comm_shm {
    char *base;
    size_t size, chunk, res;  /* segment bytes; bytes of an "in" and of a "res" area */
    int n, me;
    uint64_t phase;           /* barriers this rank has reached: the value of its flag */
    uint64_t unit;            /* chunks and small operations so far: unit % 2 is the buffer set */
    uint64_t next_ticket, serving; /* non-blocking operations started and finished (world lock) */
    int behind;               /* a rank the last unfinished barrier waits for */
    uint64_t behind_phase;    /* ... and the barriers it had reached then */
    int cma_off;              /* all-to-all: no cross-memory reads (PDDE_COMM_CMA=0, or one was refused) */
    int reg_off;              /* all-to-all: no reads of registered buffers through a mapping (one was refused) */
    size_t a2a_small_reg;     /* all-to-all: the largest message with the table from a registered send buffer (SHM_A2A_SMALL_REG*) */
    size_t a2a_small;         /* all-to-all: the largest message that goes with the table (SHM_A2A_SMALL_MAX*) */
    int a2a_sleep;            /* all-to-all: a large one's waits sleep soon (ranks outnumber cores; PDDE_COMM_A2A_SLEEP=0: no) */
    uint64_t pid;             /* this process's id, for the others' cross-memory reads (no system call per operation) */
    char name[64];            /* the segment's name until it is unlinked */
};

/* Rank r's line: the barriers it reached, and the CPU it last ran on when it reached one; the low 32
 * bits of phase again as a futex word, and how many ranks sleep on it (then arriving wakes them). */
typedef struct {
    _Atomic uint64_t phase;
    _Atomic int cpu;
    _Atomic uint32_t wake;
    _Atomic uint32_t sleepers;
} shm_line;

static shm_line *shm_flag(const comm_shm *s, int r) { return (shm_line *)(void *)(s->base + SHM_LINE * (size_t)r); }
static char *shm_in(const comm_shm *s, int r, int set) {
    return s->base + SHM_LINE * (size_t)s->n + ((size_t)r * 2 + (size_t)set) * (s->chunk + s->res);
}
static char *shm_res(const comm_shm *s, int r, int set) { return shm_in(s, r, set) + s->chunk; }
/* All-to-all(v)'s table of a buffer set, rank r's row: the bytes it sends to each rank, those it expects
 * from each, the address of its block for each, then (at 3n + SHM_A2A_*) its pid, whether the others may
 * read its send buffer directly (by cross-memory reads, or through a mapping where it is registered),
 * whether one of its reads failed, the largest message it sends with the table, and the registered
 * buffer its sends lie in (serial 0: none; buffer.c). */
#define SHM_ROW(n) (3 * (size_t)(n) + 8)
enum { SHM_A2A_PID, SHM_A2A_CMA, SHM_A2A_FAILED, SHM_A2A_SMALL, SHM_A2A_REG_SERIAL, SHM_A2A_REG_FD, SHM_A2A_REG_BASE, SHM_A2A_REG_SIZE };
static uint64_t *shm_table(const comm_shm *s, int r, int set) {
    return (uint64_t *)(void *)(shm_in(s, s->n, 0) + ((size_t)set * (size_t)s->n + (size_t)r) * SHM_ROW(s->n) * 8);
}

static void shm_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void comm_shm_detach(comm_shm *s) {
    if (!s) return;
    if (s->base) munmap(s->base, s->size);
    if (s->name[0]) shm_unlink(s->name);
    free(s);
}

/* Reads a store key the creator will set, polling (the store lock is not held while waiting: the
 * service thread needs the store for heartbeats). */
static pdde_status shm_store_wait(comm_world *w, const char *key, void **val, size_t *len) {
    double deadline = comm_now() + w->timeout_s, pause = 2e-4;
    for (;;) {
        pthread_mutex_lock(&w->store_lock);
        pdde_status st = w->store->iface->get(w->store->impl, NULL, key, val, len);
        pthread_mutex_unlock(&w->store_lock);
        if (st != PDDE_ERR_NOT_FOUND) return st;
        if (w->failed) return w->failed;
        double left = deadline - comm_now();
        if (left <= 0) return PDDE_ERR_TIMEOUT;
        comm_sleep(pause < left ? pause : left);
        pause = pause * 2 < 0.02 ? pause * 2 : 0.02;
    }
}

/* Collective over c (called by comm_new): when all its ranks are on this host, rank 0 makes a
 * segment and names it through the store, and every rank maps it; *out is the segment (its base NULL
 * where mapping failed), or NULL when c gets no channel. comm_new then makes the ranks agree (all
 * use it, or none) and calls comm_shm_unlink. serial is unique among the world's communicators (it
 * names the store key). */
static pdde_status comm_shm_map(pdde_comm *c, int64_t serial, comm_shm **out) {
    comm_world *w = c->w;
    *out = NULL;
    if (c->n_hosts != 1 || c->size < 2 || c->size > SHM_MAX_RANKS) return PDDE_OK;
    if (!pdde_env_bool("PDDE_COMM_SHM", 1)) return PDDE_OK;
    comm_shm *s = calloc(1, sizeof *s);
    if (!s) return pdde_error(w->ctx, PDDE_ERR_OOM, "comm: out of memory");
    s->n = c->size;
    s->me = c->rank;
    s->chunk = SHM_CHUNK_BYTES;
    s->res = ((s->chunk / (size_t)s->n + 63) & ~(size_t)63) + 64; /* a part, rounded up, plus an element */
    s->size = SHM_LINE * (size_t)s->n + 2 * (size_t)s->n * (s->chunk + s->res) + 2 * (size_t)s->n * SHM_ROW(s->n) * 8;
    s->cma_off = !pdde_env_bool("PDDE_COMM_CMA", 1);
    s->a2a_small = w->spin_s > 0 ? SHM_A2A_SMALL_MAX : SHM_A2A_SMALL_MAX_SHARED;
    s->a2a_small_reg = w->spin_s > 0 ? SHM_A2A_SMALL_REG : SHM_A2A_SMALL_REG_SHARED;
    s->a2a_sleep = w->spin_s == 0 && pdde_env_bool("PDDE_COMM_A2A_SLEEP", 1);
    s->pid = (uint64_t)getpid();
    char key[300];
    snprintf(key, sizeof key, "%s/shm/%lld", w->prefix, (long long)serial);
    pdde_status st = PDDE_OK;
    int fd = -1;
    if (c->rank == 0) {
        static _Atomic unsigned segments;
        snprintf(s->name, sizeof s->name, "/pdde-%d-%u", (int)getpid(), atomic_fetch_add(&segments, 1));
        fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR, 0600);
        if (fd >= 0 && ftruncate(fd, (off_t)s->size)) { close(fd); fd = -1; }
        if (fd < 0) { shm_unlink(s->name); s->name[0] = 0; }
        /* an empty name tells the others at once that there is no segment */
        pthread_mutex_lock(&w->store_lock);
        st = pdde_store_set(w->store, key, s->name, strlen(s->name) + 1);
        pthread_mutex_unlock(&w->store_lock);
    } else {
        void *val = NULL;
        size_t len = 0;
        st = shm_store_wait(w, key, &val, &len);
        if (!st && len > 1 && ((char *)val)[len - 1] == 0) fd = shm_open(val, O_RDWR, 0);
        free(val);
    }
    if (fd >= 0) {
        void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        s->base = p == MAP_FAILED ? NULL : p;
    }
    *out = s; /* mapped or not (s->base NULL): comm_new makes every rank agree */
    return st;
}

/* Once every rank has mapped the segment (or given up), its name can go. */
static void comm_shm_unlink(comm_shm *s) {
    if (s && s->name[0]) { shm_unlink(s->name); s->name[0] = 0; }
}

/* The world failed or the deadline passed: report it the way every other wait does. */
static const char *const SHM_KIND_NAMES[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "alltoallv"};

static pdde_status shm_give_up(pdde_comm *c, comm_shm_kind kind) {
    comm_world *w = c->w;
    comm_shm *s = c->shm;
    pthread_mutex_lock(&w->lock);
    if (!w->failed) {
        /* the ranks that have not reached this rank's last barrier: the ones to look at */
        char late[96] = "";
        size_t k = 0;
        for (int p = 0; p < s->n && k < sizeof late; p++)
            if (p != s->me && atomic_load_explicit(&shm_flag(s, p)->phase, memory_order_acquire) < s->phase)
                k += (size_t)snprintf(late + k, sizeof late - k, " %d", c->ranks[p]);
        comm_fail(w, PDDE_ERR_TIMEOUT, "rank %d: a shm %s over %d ranks did not finish within %.3g s (not there:%s)", w->rank,
                  SHM_KIND_NAMES[kind], s->n, w->timeout_s, *late ? late : " none");
        world_progress(w); /* ends the world's running operations */
    }
    pdde_status st = w->failed;
    pthread_mutex_unlock(&w->lock);
    return comm_report(w, st);
}

/* Publishes that this rank reached its next barrier; returns the barrier's number. */
static uint64_t shm_arrive(comm_shm *s) {
    shm_line *l = shm_flag(s, s->me);
    atomic_store_explicit(&l->cpu, sched_getcpu(), memory_order_relaxed);
    atomic_store_explicit(&l->phase, ++s->phase, memory_order_release);
    /* (sequentially consistent with shm_sleep's count and read: a sleeper sees the new word, or is seen) */
    atomic_store(&l->wake, (uint32_t)s->phase);
    if (atomic_load(&l->sleepers)) syscall(SYS_futex, &l->wake, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
    return s->phase;
}

/* Has every rank reached barrier target? If not, s->behind is one that has not (at s->behind_phase). */
static int shm_reached(comm_shm *s, uint64_t target) {
    for (int p = 0; p < s->n; p++) {
        uint64_t ph;
        if (p != s->me && (ph = atomic_load_explicit(&shm_flag(s, p)->phase, memory_order_acquire)) < target) {
            s->behind = p, s->behind_phase = ph;
            return 0;
        }
    }
    return 1;
}

/* Sleeps until the rank the last unfinished barrier waits for arrives anywhere, or for up to pause
 * seconds: the CPU goes to whoever has work (ranks that outnumber the cores), and a long wait ends as
 * soon as the peer comes, not at the end of a sleep. */
static void shm_sleep(comm_shm *s, double pause) {
    shm_line *l = shm_flag(s, s->behind);
    atomic_fetch_add(&l->sleepers, 1);
    if (atomic_load(&l->wake) == (uint32_t)s->behind_phase) { /* else it arrived meanwhile */
        struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
        syscall(SYS_futex, &l->wake, FUTEX_WAIT, (uint32_t)s->behind_phase, &ts, NULL, 0);
    }
    atomic_fetch_sub(&l->sleepers, 1);
}

/* Is the rank we wait for queued on our own CPU? Then spinning only keeps it from running: yield at
 * once. (With other work on the machine, the scheduler may put both ranks on one core.) */
static int shm_peer_on_my_cpu(const comm_shm *s) {
    return atomic_load_explicit(&shm_flag(s, s->behind)->cpu, memory_order_relaxed) == sched_getcpu();
}

enum { SHM_START, SHM_WHOLE_REDUCE, SHM_COPY_IN, SHM_COPY_OUT, SHM_REDUCE, SHM_UNIT_IN, SHM_UNIT_OUT, SHM_A2A_TABLE, SHM_A2A_READ,
       SHM_DONE };

/* Reduce-scatter, allgather, broadcast: what chunk k (elements [at, at + m) of each block) puts into my
 * "in" before the barrier. A reduce-scatter lays its chunk out as n parts of chunk_elems, part p for
 * rank p; my own block's part stays in my buffer. */
static void shm_unit_in(comm_shm *s, const comm_shm_op *o, size_t at, size_t m, int set) {
    size_t esz = pdde_dtype_size(o->dtype);
    char *in = shm_in(s, s->me, set);
    switch (o->kind) {
    case SHM_REDUCE_SCATTER:
        for (int p = 0; p < s->n; p++)
            if (p != s->me) memcpy(in + (size_t)p * o->chunk_elems * esz, o->src + ((size_t)p * o->count + at) * esz, m * esz);
        break;
    case SHM_ALLGATHER: /* mine goes straight to my block too (memmove: in place, src is that block) */
        memcpy(in, o->src + at * esz, m * esz);
        memmove(o->dst + ((size_t)s->me * o->count + at) * esz, o->src + at * esz, m * esz);
        break;
    case SHM_BROADCAST:
        if (s->me == o->root) memcpy(in, o->src + at * esz, m * esz);
        break;
    case SHM_ALLTOALLV: /* at and m count bytes here: my next piece for every peer, into its slot */
        for (int p = 0; p < s->n; p++) {
            size_t b = o->scount[p] * esz, len = p == s->me || b <= at ? 0 : b - at < m ? b - at : m;
            if (len) memcpy(in + (size_t)p * o->part, o->src + o->sdispl[p] * esz + at, len);
        }
        break;
    default:
        break;
    }
}

/* ... and what it reads after the barrier, from the others' "in". */
static void shm_unit_out(comm_shm *s, const comm_shm_op *o, size_t at, size_t m, int set) {
    size_t esz = pdde_dtype_size(o->dtype);
    int n = s->n, me = s->me;
    switch (o->kind) {
    case SHM_REDUCE_SCATTER: { /* mine first (it may be dst itself: in place), then the others in rank order */
        char *out = o->dst + at * esz;
        memmove(out, o->src + ((size_t)me * o->count + at) * esz, m * esz);
        for (int p = 0; p < n; p++)
            if (p != me) comm_reduce(out, shm_in(s, p, set) + (size_t)me * o->chunk_elems * esz, m, o->dtype, o->op);
        if (o->op == PDDE_REDUCE_AVG) comm_divide(out, m, o->dtype, n);
        break;
    }
    case SHM_ALLGATHER:
        for (int p = 0; p < n; p++)
            if (p != me) memcpy(o->dst + ((size_t)p * o->count + at) * esz, shm_in(s, p, set), m * esz);
        break;
    case SHM_BROADCAST:
        if (me != o->root) memcpy(o->dst + at * esz, shm_in(s, o->root, set), m * esz);
        break;
    case SHM_ALLTOALLV:
        for (int p = 0; p < n; p++) {
            size_t b = o->rcount[p] * esz, len = p == me || b <= at ? 0 : b - at < m ? b - at : m;
            if (len) memcpy(o->dst + o->rdispl[p] * esz + at, shm_in(s, p, set) + (size_t)me * o->part, len);
        }
        break;
    default:
        break;
    }
}

/* The largest message (bytes) that goes with the table: one chunk's slot (chunk / n), at most 16 KiB.
 * Two copies through the caches beat one cross-memory read up to there (its system call and page
 * pinning cost more than copies that stay in L2); above, the one read wins: lines the receiver reads
 * from a peer's send buffer may stay in its cache, lines a peer just wrote into the segment must cross
 * (2 ranks, 8 KiB pairs: 1.5 us against 2.6; 32 KiB pairs: 4.4 us against 5.4). Where the ranks
 * outnumber the cores, at most 64 KiB: a peer that reads my copy often runs on the core I ran on, so
 * the copies stay in its caches (4 ranks on 2 cores, 64 KiB pairs: 34 us against 41). The ranks use
 * the smallest of theirs (each writes its own into the table). SHM_A2A_SMALL_MAX(_SHARED) are above.
 * A rank whose sends lie in a registered buffer offers less: its blocks are read with a plain copy
 * through the reader's mapping, no system call, which beats the table's two copies from 4 KiB pairs
 * (2 ranks, 8 KiB pairs: 1.4 against 7-100 us, under load 15) and from 16 KiB where the ranks
 * outnumber the cores (4 ranks, 64 KiB pairs: 116 against 392 us, under load 16); the smallest
 * offer wins, so mixed ranks agree. */
static size_t shm_a2a_small(const comm_shm *s, const comm_shm_op *o) { return o->part < s->a2a_small ? o->part : s->a2a_small; }

/* My own block of an all-to-all at or above this many bytes is copied with stores that bypass the
 * caches: no read of the destination lines first, and the caches keep what the peers' reads use (2
 * ranks: 512 KiB 12% faster, 8 MiB 1.5x). */
#define SHM_A2A_STREAM_MIN (256u << 10)
/* ... and where the ranks outnumber the cores (it is copied after that barrier, when the rank has its
 * core): from 2 MiB, where the ranks' buffers outgrow the caches (4 ranks on 2 cores, 16 MiB a rank:
 * 9.9 against 11.8 ms under load; 1 MiB a rank: no better) */
#define SHM_A2A_STREAM_MIN_SHARED (2u << 20)
/* Copies len bytes that do not overlap, with stores that bypass the caches where the CPU has them. */
static void shm_copy_nt(char *dst, const char *src, size_t len) {
#if defined(__x86_64__)
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
    if (head > len) head = len;
    memcpy(dst, src, head);
    dst += head, src += head, len -= head;
    size_t body = len & ~(size_t)63;
    for (size_t i = 0; i < body; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(src + i)), b = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 32)), d = _mm_loadu_si128((const __m128i *)(const void *)(src + i + 48));
        _mm_stream_si128((__m128i *)(void *)(dst + i), a), _mm_stream_si128((__m128i *)(void *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(dst + i + 32), c), _mm_stream_si128((__m128i *)(void *)(dst + i + 48), d);
    }
    _mm_sfence();
    memcpy(dst + body, src + body, len - body);
#else
    memcpy(dst, src, len);
#endif
}

/* All-to-all(v), after the table's barrier: do the ranks' counts agree? Then my own block, the chunk
 * count (the largest message decides) and the way (cross-memory reads or chunks); else the error, the
 * same on every rank. Returns 1 on that error. */
static int shm_a2a_agree(comm_shm *s, comm_shm_op *o, int set) {
    int n = s->n, me = s->me, cma = 1; /* (each row says whether its sends may be read directly) */
    size_t esz = pdde_dtype_size(o->dtype);
    uint64_t most = 0, small = UINT64_MAX;
    for (int i = 0; i < n; i++) {
        const uint64_t *ri = shm_table(s, i, set);
        cma &= ri[3 * n + SHM_A2A_CMA] == 1;
        small = ri[3 * n + SHM_A2A_SMALL] < small ? ri[3 * n + SHM_A2A_SMALL] : small;
        for (int j = 0; j < n; j++) {
            uint64_t sent = ri[j], expected = shm_table(s, j, set)[n + i];
            if (sent != expected) {
                o->err = PDDE_ERR_INVALID_ARG;
                snprintf(o->msg, sizeof o->msg, "alltoallv: rank %d sends %llu elements to rank %d, which expects %llu",
                         i, (unsigned long long)(sent / esz), j, (unsigned long long)(expected / esz));
                return 1;
            }
            if (i != j && sent > most) most = sent;
        }
    }
    if (o->rcount[me] && !o->self_done) {
        size_t len = o->rcount[me] * esz;
        char *to = o->dst + o->rdispl[me] * esz;
        const char *from = o->src + o->sdispl[me] * esz;
        if (len >= SHM_A2A_STREAM_MIN_SHARED && (to + len <= from || from + len <= to)) shm_copy_nt(to, from, len);
        else memmove(to, from, len);
    }
    o->nchunks = most ? (size_t)((most + o->part - 1) / o->part) : 0;
    o->most = most;
    o->small = (size_t)small;
    o->cma = cma && most > small; /* the way, the same on every rank */
    return 0;
}

/* Reads what every peer sends me straight from its send buffer (the table of set gives where);
 * returns 0 when all of it came. */
static int shm_a2a_read(comm_shm *s, comm_shm_op *o, int set) {
    int n = s->n, me = s->me;
    size_t esz = pdde_dtype_size(o->dtype);
    for (int k = 1; k < n; k++) {
        int p = (me + k) % n; /* everybody starts with a different peer */
        const uint64_t *rp = shm_table(s, p, set);
        size_t len = o->rcount[p] * esz, done = 0;
        if (!len) continue;
        if (rp[3 * n + SHM_A2A_REG_SERIAL]) { /* registered: a plain copy through my mapping of it */
            comm_buffer_ref ref = {rp[3 * n + SHM_A2A_PID], rp[3 * n + SHM_A2A_REG_SERIAL], rp[3 * n + SHM_A2A_REG_FD],
                                   rp[3 * n + SHM_A2A_REG_BASE], rp[3 * n + SHM_A2A_REG_SIZE]};
            const char *at = comm_buffer_map(&ref);
            if (at) {
                memcpy(o->dst + o->rdispl[p] * esz, at + (rp[2 * n + me] - ref.base), len);
                comm_buffer_release(at);
                o->mapped = 1;
                continue;
            }
        }
        if (s->cma_off) return -1; /* refused, or (PDDE_COMM_CMA=0 here alone) not allowed: everybody goes on in chunks */
        while (done < len) {
            struct iovec l = {o->dst + o->rdispl[p] * esz + done, len - done};
            struct iovec r = {(void *)(uintptr_t)(rp[2 * n + me] + done), len - done};
            ssize_t got = process_vm_readv((pid_t)rp[3 * n + SHM_A2A_PID], &l, 1, &r, 1, 0);
            if (got <= 0) return -1;
            done += (size_t)got;
        }
    }
    return 0;
}

/* Runs o as far as it goes without waiting for another rank; returns 1 when it is finished.
 * Large messages, per chunk k: copy in (the parts the others reduce), barrier A_k; [wait for B_{k-1},
 * copy out chunk k - 1]; wait for A_k, reduce my part, barrier B_k. Copying chunk k in before waiting
 * for B_{k-1} hides that wait when the ranks keep pace. */
static int shm_step(comm_shm *s, comm_shm_op *o) {
    size_t esz = pdde_dtype_size(o->dtype), po, pl;
    int n = s->n, me = s->me;
    for (;;) {
        size_t at = o->k * o->chunk_elems, m = at < o->count && o->count - at < o->chunk_elems ? o->count - at : o->chunk_elems;
        int set = (int)((o->unit0 + o->k) & 1);
        switch (o->stage) {
        case SHM_START:
            o->unit0 = s->unit;
            if (o->kind == SHM_ALLTOALLV) { /* the table first (its unit is unit0); at and m count bytes */
                uint64_t *row = shm_table(s, me, (int)(o->unit0 & 1));
                size_t send_end = 0, recv_end = 0, others_start = SIZE_MAX, others_end = 0;
                for (int p = 0; p < n; p++) {
                    row[p] = o->scount[p] * esz, row[n + p] = o->rcount[p] * esz;
                    row[2 * n + p] = (uint64_t)(uintptr_t)(o->src + o->sdispl[p] * esz);
                    if (o->scount[p] && (o->sdispl[p] + o->scount[p]) * esz > send_end) send_end = (o->sdispl[p] + o->scount[p]) * esz;
                    if (o->scount[p] && p != me && o->sdispl[p] * esz < others_start) others_start = o->sdispl[p] * esz;
                    if (o->scount[p] && p != me && (o->sdispl[p] + o->scount[p]) * esz > others_end) others_end = (o->sdispl[p] + o->scount[p]) * esz;
                    if (o->rcount[p] && (o->rdispl[p] + o->rcount[p]) * esz > recv_end) recv_end = (o->rdispl[p] + o->rcount[p]) * esz;
                }
                /* in place (the buffers overlap): in chunks, which read each piece before they write over it */
                int overlap = send_end && recv_end && o->src < o->dst + recv_end && o->dst < o->src + send_end;
                /* what the others read of my send buffer (my blocks for them) in a registered buffer:
                 * they copy it through a mapping, no cross-memory read needed */
                comm_buffer_ref ref = {0};
                int reg = !s->reg_off && others_start < others_end && comm_buffer_find(o->src + others_start, others_end - others_start, &ref);
                row[3 * n + SHM_A2A_REG_SERIAL] = reg ? ref.serial : 0;
                row[3 * n + SHM_A2A_REG_FD] = ref.fd, row[3 * n + SHM_A2A_REG_BASE] = ref.base, row[3 * n + SHM_A2A_REG_SIZE] = ref.size;
                row[3 * n + SHM_A2A_PID] = s->pid;
                row[3 * n + SHM_A2A_CMA] = (!s->cma_off || reg) && !overlap;
                row[3 * n + SHM_A2A_FAILED] = 0;
                o->chunk_elems = o->part = (s->chunk / (size_t)n) & ~(size_t)63;
                o->count = SIZE_MAX;
                /* small: the one chunk goes with the table (then every rank's sends are small: see
                 * SHM_A2A_TABLE), so that the operation takes one barrier */
                size_t most = 0;
                for (int p = 0; p < n; p++) most = p != me && row[p] > most ? row[p] : most;
                size_t small = shm_a2a_small(s, o);
                if (reg && small > s->a2a_small_reg) small = s->a2a_small_reg;
                row[3 * n + SHM_A2A_SMALL] = small;
                if (most <= small) shm_unit_in(s, o, 0, o->part, (int)(o->unit0 & 1));
                s->unit = o->unit0 + 1;
                o->barrier_a = shm_arrive(s);
                /* my own block while the others arrive: nobody reads my receive buffer, and where it
                 * does not overlap my send buffer the move changes nothing a peer reads. Not where the
                 * ranks outnumber the cores: there a rank that arrived should hand its core to one that
                 * has not (4 ranks on 2 cores: 256 KiB 37 us after the barrier, 141 us before it) */
                o->self_done = !overlap && o->scount[me] == o->rcount[me] && s->a2a_small == SHM_A2A_SMALL_MAX;
                if (o->self_done && o->rcount[me]) {
                    size_t len = o->rcount[me] * esz;
                    char *to = o->dst + o->rdispl[me] * esz;
                    const char *from = o->src + o->sdispl[me] * esz;
                    if (len >= SHM_A2A_STREAM_MIN) shm_copy_nt(to, from, len);
                    else memcpy(to, from, len);
                }
                o->stage = SHM_A2A_TABLE;
            } else if (o->kind != SHM_ALLREDUCE) { /* a reduce-scatter's chunk holds a part for every rank */
                o->chunk_elems = s->chunk / esz / (o->kind == SHM_REDUCE_SCATTER ? (size_t)n : 1);
                o->nchunks = (o->count + o->chunk_elems - 1) / o->chunk_elems;
                s->unit += o->nchunks;
                o->stage = SHM_UNIT_IN;
            } else if (o->count * esz <= SHM_WHOLE_BYTES) {
                s->unit++;
                memcpy(shm_in(s, me, (int)(o->unit0 & 1)), o->src, o->count * esz);
                o->barrier_a = shm_arrive(s);
                o->stage = SHM_WHOLE_REDUCE;
            } else {
                o->chunk_elems = s->chunk / esz;
                o->nchunks = (o->count + o->chunk_elems - 1) / o->chunk_elems;
                s->unit += o->nchunks;
                o->stage = SHM_COPY_IN;
            }
            break;
        case SHM_WHOLE_REDUCE:
            if (!shm_reached(s, o->barrier_a)) return 0;
            if (n == 2) { /* a op b == b op a bit for bit: no order to keep */
                if (o->dst != o->src) memcpy(o->dst, o->src, o->count * esz);
                comm_reduce(o->dst, shm_in(s, 1 - me, set), o->count, o->dtype, o->op);
            } else { /* in rank order, so that every rank gets the same bits */
                memcpy(o->dst, shm_in(s, 0, set), o->count * esz);
                for (int p = 1; p < n; p++) comm_reduce(o->dst, shm_in(s, p, set), o->count, o->dtype, o->op);
            }
            if (o->op == PDDE_REDUCE_AVG) comm_divide(o->dst, o->count, o->dtype, n);
            o->stage = SHM_DONE;
            return 1;
        case SHM_COPY_IN: {
            char *in = shm_in(s, me, set);
            for (int p = 0; p < n; p++) {
                if (p == me) continue;
                comm_part(m, n, p, &po, &pl);
                memcpy(in + po * esz, o->src + (at + po) * esz, pl * esz);
            }
            o->barrier_a = shm_arrive(s);
            o->stage = SHM_COPY_OUT;
            break;
        }
        case SHM_COPY_OUT:
            if (o->k > 0) { /* chunk k - 1: the others' reduced parts */
                if (!shm_reached(s, o->barrier_b)) return 0;
                size_t pat = at - o->chunk_elems, pm = o->count - pat < o->chunk_elems ? o->count - pat : o->chunk_elems;
                int pset = set ^ 1;
                for (int p = 0; p < n; p++) {
                    if (p == me) continue;
                    comm_part(pm, n, p, &po, &pl);
                    memcpy(o->dst + (pat + po) * esz, shm_res(s, p, pset), pl * esz);
                }
                if (o->k == o->nchunks) {
                    o->stage = SHM_DONE;
                    return 1;
                }
            }
            o->stage = SHM_REDUCE;
            break;
        case SHM_REDUCE: {
            if (!shm_reached(s, o->barrier_a)) return 0;
            comm_part(m, n, me, &po, &pl);
            char *mine = o->dst + (at + po) * esz;
            if (o->dst != o->src) memcpy(mine, o->src + (at + po) * esz, pl * esz);
            for (int p = 0; p < n; p++)
                if (p != me) comm_reduce(mine, shm_in(s, p, set) + po * esz, pl, o->dtype, o->op);
            if (o->op == PDDE_REDUCE_AVG) comm_divide(mine, pl, o->dtype, n);
            memcpy(shm_res(s, me, set), mine, pl * esz);
            o->barrier_b = shm_arrive(s);
            o->k++;
            o->stage = o->k < o->nchunks ? SHM_COPY_IN : SHM_COPY_OUT;
            break;
        }
        case SHM_UNIT_IN:
            shm_unit_in(s, o, at, m, set);
            o->barrier_a = shm_arrive(s);
            o->stage = SHM_UNIT_OUT;
            break;
        case SHM_UNIT_OUT:
            if (!shm_reached(s, o->barrier_a)) return 0;
            shm_unit_out(s, o, at, m, set);
            if (++o->k == o->nchunks) {
                o->stage = SHM_DONE;
                return 1;
            }
            o->stage = SHM_UNIT_IN;
            break;
        case SHM_A2A_TABLE:
            if (!shm_reached(s, o->barrier_a)) return 0;
            if (shm_a2a_agree(s, o, set)) {
                o->stage = SHM_DONE;
                return 1;
            }
            if (o->nchunks <= 1 && o->most <= o->small) { /* every rank sent its one chunk with the table */
                shm_unit_out(s, o, 0, o->part, set);
                o->stage = SHM_DONE;
                return 1;
            }
            if (o->cma) { /* one copy, then a barrier: my send buffer is free once everybody has passed it */
                if (shm_a2a_read(s, o, set)) shm_table(s, me, set)[3 * n + SHM_A2A_FAILED] = 1;
                s->unit += 2; /* the next table goes to the other set: this one's flags are read after the barrier */
                o->barrier_a = shm_arrive(s);
                o->stage = SHM_A2A_READ;
                break;
            }
        chunks: /* chunk k's buffer set is (unit0 + k) % 2: unit0 is the first unit after the table */
            o->unit0 = s->unit;
            o->k = 0;
            s->unit += o->nchunks;
            if (!o->nchunks) {
                o->stage = SHM_DONE;
                return 1;
            }
            o->stage = SHM_UNIT_IN;
            break;
        case SHM_A2A_READ: {
            if (!shm_reached(s, o->barrier_a)) return 0;
            int tset = (int)((s->unit - 3) & 1), failed = 0; /* the table's set */
            for (int p = 0; p < n; p++) failed |= shm_table(s, p, tset)[3 * n + SHM_A2A_FAILED] != 0;
            if (!failed) {
                o->stage = SHM_DONE;
                return 1;
            }
            s->cma_off = s->reg_off = 1; /* on every rank: the kernel refused a read (ptrace rules, a container's filter) */
            o->mapped = 0;
            goto chunks;
        }
        default:
            return 1;
        }
    }
}

/* The largest message (bytes) a rank of o sends to or receives from another rank. */
static size_t shm_a2a_largest(const comm_shm *s, const comm_shm_op *o) {
    size_t most = 0, esz = pdde_dtype_size(o->dtype);
    for (int p = 0; p < s->n; p++) {
        if (p == s->me) continue;
        most = o->scount[p] * esz > most ? o->scount[p] * esz : most;
        most = o->rcount[p] * esz > most ? o->rcount[p] * esz : most;
    }
    return most;
}

/* Where the ranks outnumber the cores, the waits of an all-to-all with a message of at least this many
 * bytes (one that does not go with the table) sleep on the futex after SHM_A2A_YIELD_S of yielding
 * (the others: COMM_YIELD_S, then timed sleeps): a rank that keeps yielding keeps its core busy passing
 * it back and forth with other waiting ranks while the ranks with work share the other core; one that
 * sleeps leaves its core idle, so the scheduler moves a rank with work onto it, and wakes when the rank
 * it waits for arrives (4 ranks on 2 cores, under heavy load: 1 MiB a rank 823 -> 292 us, 4 MiB 4.5 ->
 * 1.4 ms sleeping at once). The yielding first: at lighter load sleeping at once cost 1 MiB a rank
 * 17% (248 -> 290 us), after 100 us of yields nothing. */
#define SHM_A2A_SLEEP_MIN (256u << 10)
#define SHM_A2A_YIELD_S 100e-6

/* The request form: runs from the world's progress (the caller's wait, or the service thread in the
 * background), after the communicator's earlier shared-memory operations. */
static int comm_shm_advance(pdde_comm_request *r) {
    comm_shm *s = r->comm->shm;
    if (r->shm.ticket != s->serving) return 0;
    uint64_t before = s->phase;
    if (shm_step(s, &r->shm)) {
        s->serving++;
        if (r->shm.err) snprintf(r->msg, sizeof r->msg, "comm: %s", r->shm.msg);
        req_finish(r, r->shm.err);
        return 1;
    }
    return s->phase != before;
}

/* Does c run a collective of count elements (per rank, where it has blocks) on its channel? The
 * others (no channel, a forced algorithm, nothing to move, arguments the general path refuses by
 * name) take the transport. */
static int comm_shm_takes(const pdde_comm *c, size_t count, int buffers_given, pdde_dtype t, pdde_reduce_op op) {
    return c && c->shm && c->algo == PDDE_ALGO_AUTO && count && buffers_given && (unsigned)t < PDDE_DTYPE_COUNT &&
           (unsigned)op <= PDDE_REDUCE_MIN;
}

/* The operations, as the public calls describe them. */
static comm_shm_op comm_shm_allreduce_op(const void *sendbuf, void *recvbuf, size_t count, pdde_dtype t, pdde_reduce_op op) {
    return (comm_shm_op){.kind = SHM_ALLREDUCE, .src = sendbuf, .dst = recvbuf, .count = count, .dtype = t, .op = op};
}
static comm_shm_op comm_shm_reduce_scatter_op(const void *sendbuf, void *recvbuf, size_t recvcount, pdde_dtype t,
                                              pdde_reduce_op op) {
    return (comm_shm_op){.kind = SHM_REDUCE_SCATTER, .src = sendbuf, .dst = recvbuf, .count = recvcount, .dtype = t, .op = op};
}
static comm_shm_op comm_shm_allgather_op(const void *sendbuf, void *recvbuf, size_t sendcount, pdde_dtype t) {
    return (comm_shm_op){.kind = SHM_ALLGATHER, .src = sendbuf, .dst = recvbuf, .count = sendcount, .dtype = t};
}
static comm_shm_op comm_shm_alltoallv_op(const void *sendbuf, const size_t *sendcounts, const size_t *sdispls, void *recvbuf,
                                         const size_t *recvcounts, const size_t *rdispls, pdde_dtype t) {
    return (comm_shm_op){.kind = SHM_ALLTOALLV, .src = sendbuf, .dst = recvbuf, .dtype = t, .scount = sendcounts,
                         .sdispl = sdispls, .rcount = recvcounts, .rdispl = rdispls};
}
static comm_shm_op comm_shm_broadcast_op(void *buf, size_t count, pdde_dtype t, int root) {
    return (comm_shm_op){.kind = SHM_BROADCAST, .root = root, .src = buf, .dst = buf, .count = count, .dtype = t};
}

/* The non-blocking form of every shm collective. */
static pdde_status comm_shm_istart(pdde_comm *c, comm_shm_op o, pdde_comm_request **req) {
    pdde_comm_request *r = NULL;
    pdde_status st = req_alloc(c, 0, o.dtype, o.op, &r);
    if (st) return st;
    r->msg[0] = 0;
    if (o.kind == SHM_ALLTOALLV) { /* the caller's count arrays need not outlive the call */
        size_t n = (size_t)c->size, *a;
        if ((st = req_scratch(r, 4 * n * sizeof *a))) return req_abandon(r, st);
        a = r->scratch;
        memcpy(a, o.scount, n * sizeof *a), memcpy(a + n, o.sdispl, n * sizeof *a);
        memcpy(a + 2 * n, o.rcount, n * sizeof *a), memcpy(a + 3 * n, o.rdispl, n * sizeof *a);
        o.scount = a, o.sdispl = a + n, o.rcount = a + 2 * n, o.rdispl = a + 3 * n;
    }
    o.stage = SHM_START;
    r->advance = comm_shm_advance;
    r->shm = o;
    pthread_mutex_lock(&c->w->lock);
    r->shm.ticket = c->shm->next_ticket++;
    pthread_mutex_unlock(&c->w->lock);
    /* no tags, so no operation sequence number: a blocking call that runs directly takes none either,
     * and the communicator's sequence must stay the same on every rank whichever way each one went */
    c->last_algo = "shm";
    r->kind = SHM_KIND_NAMES[o.kind];
    return comm_start(c, r, NULL, req);
}

/* The blocking form: with no non-blocking operation ahead of it on the channel, it runs right here,
 * without a request or the world lock (nothing else touches the channel meanwhile: only the caller
 * starts operations on it); the wait is that of every other blocking operation. */
static pdde_status comm_shm_run(pdde_comm *c, comm_shm_op o) {
    comm_world *w = c->w;
    comm_shm *s = c->shm;
    pthread_mutex_lock(&w->lock);
    pdde_status st = w->failed;
    int queued = s->next_ticket != s->serving;
    if (!st && !queued) {
        w->started++;
        if (!w->watching) pthread_cond_signal(&w->cv); /* the service thread polls for failures meanwhile */
    }
    pthread_mutex_unlock(&w->lock);
    if (st) return comm_report(w, st);
    if (queued) {
        pdde_comm_request *r = NULL;
        comm_blocking_call = 1;
        st = comm_shm_istart(c, o, &r);
        return comm_finish(c, st, r);
    }
    c->last_algo = "shm";
    o.stage = SHM_START;
    int spin = w->spin_s > 0 ? 64 : 0; /* polls before the first clock read (and backoff decision) */
    double start = 0, deadline = 0, idle_since = 0, last_nudge = 0;
    uint64_t seen = s->phase;
    int sleep_soon = s->a2a_sleep && o.kind == SHM_ALLTOALLV && shm_a2a_largest(s, &o) >= SHM_A2A_SLEEP_MIN;
    for (int tries = 0; !shm_step(s, &o); tries++) {
        int shared_cpu = shm_peer_on_my_cpu(s);
        if (tries < spin && !shared_cpu) { shm_cpu_relax(); continue; }
        if (w->failed) return shm_give_up(c, o.kind);
        double now = comm_now();
        if (!start) { start = idle_since = last_nudge = now; deadline = now + w->timeout_s; }
        if (s->phase != seen) { seen = s->phase; idle_since = now; }
        if (now >= deadline) return shm_give_up(c, o.kind);
        if (now - last_nudge > 20e-3) {
            /* a long wait: keep the service thread polling the store's failure key (it stops a while
             * after the last operation it saw start) */
            last_nudge = now;
            pthread_mutex_lock(&w->lock);
            w->started++;
            if (!w->watching) pthread_cond_signal(&w->cv);
            pthread_mutex_unlock(&w->lock);
        }
        double idle = now - idle_since, left = deadline - now;
        /* a long wait: sleep until the peer arrives (not until a pause ends). Where the ranks
         * outnumber the cores only in a large all-to-all (SHM_A2A_SLEEP_MIN): elsewhere there futex
         * sleeps measured no better than yields and short sleeps (4 ranks on 2 cores; sleeping at
         * once: better medians under load from elsewhere, worse best times) */
        if (idle >= (sleep_soon ? SHM_A2A_YIELD_S : COMM_YIELD_S) && (sleep_soon || w->spin_s > 0))
            shm_sleep(s, left < SHM_SLEEP_S ? left : SHM_SLEEP_S);
        else
            comm_backoff(idle, left, shared_cpu ? 0 : w->spin_s);
    }
    if (o.err) return pdde_error(w->ctx, o.err, "comm: %s", o.msg);
    if (o.mapped) c->last_algo = "shm_registered";
    return PDDE_OK;
}

#endif /* PDDE_COMM_SHM_C */
