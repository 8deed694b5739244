/* comm/world.c — the state every communicator shares: the world (transport connections, store,
 * failure state), the communicator struct, recording a failure and reporting it with its root cause,
 * and the backoff every wait uses. The bottom of comm/'s upper half: it calls only the parts below
 * (util, store, transport). */

#ifndef PDDE_COMM_WORLD_C
#define PDDE_COMM_WORLD_C

#include "util.c"
#include "store.c"
#include "env.c"

#include <pthread.h>
#include <stdatomic.h>

/* Tag layout (PDDE_TRANSPORT_TAG_BITS = 40): collectives [39]=0 [38..28] communicator id [27..16]
 * operation sequence [15..8] program [7..0] round; point to point [39]=1 [38..28] communicator id
 * [27..8] user tag. Communicator id 0 is the world's bootstrap, 1 the world. */
#define COMM_TAG_P2P (UINT64_C(1) << 39)
#define COMM_ID_BITS 11
#define COMM_WORLD_ID 1

typedef struct comm_world {
    pdde_context *ctx;
    const pdde_transport_iface *tp;
    void *tr, *listen;
    int rank, size;
    void **send, **recv;          /* per world rank (NULL for self) */
    int *host_of;                 /* world rank -> host index */
    char (*host_names)[COMM_HOST_ID_MAX];
    pdde_store *store;
    int own_store;
    pdde_store_server *server;    /* rank 0 hosts the store under launchers other than pdde-run */
    comm_launch launch;           /* under mpirun/srun without PDDE_STORE_ADDR: where the store is */
    int secret_file;              /* rank 0 left the job secret in a file for the others (env.c) */
    pthread_mutex_t store_lock;   /* the store is shared by the caller's thread and the service thread */
    char prefix[200];             /* this world's keys: <params.prefix>/<generation> */
    double timeout_s, peer_timeout_s;
    int no_progress_thread;
    pdde_mem_kind mem_kind;
    double spin_s;                /* busy-poll this long before yielding: 0 when ranks outnumber cores */

    pthread_mutex_t lock;         /* guards everything below and every transport call */
    pthread_cond_t cv;            /* wakes the service thread */
    pthread_t thread;
    int thread_started, stop;
    _Atomic int failed;           /* 0 or the status that poisoned the world */
    int published;                /* the failure is in the store (or came from there) */
    char fail_msg[400];
    pdde_comm_request *active;    /* running operations of every communicator */
    int waiters;                  /* caller threads inside a wait: the service thread stays out */
    int watching;                 /* the service thread polls the failure key (wakes within 50 ms) */
    unsigned long started;        /* operations started so far: activity the service thread may have missed */
    int refs;                     /* communicators using the world */
    _Atomic(struct pdde_comm_request *) spare; /* a released request kept for reuse (schedule.c) */
} comm_world;

struct pdde_comm {
    comm_world *w;
    int rank, size;
    int *ranks;                   /* comm rank -> world rank */
    int id;
    uint32_t seq;
    pdde_comm_algo algo;
    const char *last_algo;
    /* topology: hosts in order of first appearance */
    int n_hosts;
    int local_equal;              /* every host has the same number of this comm's ranks */
    int *local_group, local_n, local_me;  /* world ranks on my host */
    int *cross_group, cross_n, cross_me;  /* world ranks with my local index, one per host */
    struct comm_shm *shm;         /* shared-memory channel when every rank is on this host (shm.c) */
    struct comm_a2a_hier *a2a;    /* the hierarchical all-to-all's sub-communicators (alltoall_hier.c), made at
                                     its first use, freed with the comm (comm.c) */
};

/* The hierarchical all-to-all's state of a communicator: its ranks' host and local indices, the
 * communicators of this rank's host and of the ranks with its local index on every host. */
typedef struct comm_a2a_hier {
    int mode;                     /* PDDE_COMM_A2A_HIER: -1 unset (auto), 0 off, 1 on */
    int hosts, local;             /* H hosts of L ranks each */
    int *host_idx, *local_idx;    /* per comm rank */
    int *rank_at;                 /* [h * L + j]: the comm rank of host h's j-th */
    struct pdde_comm *local_comm, *cross_comm;
} comm_a2a_hier;

typedef struct comm_shm comm_shm;
/* The collectives the shared-memory channel runs (shm.c). */
typedef enum { SHM_ALLREDUCE, SHM_REDUCE_SCATTER, SHM_ALLGATHER, SHM_BROADCAST, SHM_ALLTOALLV } comm_shm_kind;
/* A shared-memory collective in progress (shm.c); non-blocking ones live inside their request.
 * count is per rank where the collective has blocks (reduce-scatter: recvcount, allgather: sendcount). */
typedef struct {
    comm_shm_kind kind;
    int root;                              /* broadcast */
    const char *src;
    char *dst;
    size_t count, chunk_elems, nchunks, k; /* elements; chunks; the chunk being worked on */
    pdde_dtype dtype;
    pdde_reduce_op op;
    int stage;
    uint64_t unit0;                        /* the buffer set of chunk k is (unit0 + k) % 2 */
    uint64_t barrier_a, barrier_b;         /* the barriers the next steps wait for */
    uint64_t ticket;                       /* non-blocking ones run in the order they were started */
    const size_t *scount, *sdispl, *rcount, *rdispl; /* alltoallv, in elements */
    size_t part, most, small;              /* alltoallv: bytes of one pair's slot in a chunk; the largest message; the largest with the table */
    int cma;                               /* alltoallv: by cross-memory reads (else in chunks) */
    int self_done;                         /* alltoallv: my own block moved before the table's barrier */
    int mapped;                            /* alltoallv: a peer's registered buffer was read through a mapping */
    pdde_status err;                       /* alltoallv: the ranks' counts disagree (msg says how) */
    char msg[160];
} comm_shm_op;

static void comm_fail(comm_world *w, pdde_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Records the first failure of the world (the lock is held). Running operations are ended by the
 * next world_progress; the service thread publishes the failure to the other ranks. */
static void comm_fail(comm_world *w, pdde_status st, const char *fmt, ...) {
    if (w->failed) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->fail_msg, sizeof w->fail_msg, fmt, ap);
    va_end(ap);
    w->failed = st;
    pthread_cond_broadcast(&w->cv);
}

/* ================================================================================================
 * Failures, their root cause, and backing off while waiting */

static void world_failed_key(const comm_world *w, char *key, size_t cap) { snprintf(key, cap, "%s/failed", w->prefix); }

/* Adopts the failure published in the store, if any: a lost connection is often only the echo of a
 * root cause that another rank reported (an abort, a timeout, a death), and that cause is what the
 * caller should see. Called without the world lock. */
static void world_root_cause(comm_world *w) {
    char key[256];
    void *val = NULL;
    size_t len;
    world_failed_key(w, key, sizeof key);
    pthread_mutex_lock(&w->store_lock);
    pdde_status st = w->store->iface->get(w->store->impl, NULL, key, &val, &len);
    pthread_mutex_unlock(&w->store_lock);
    char *bar = st ? NULL : strchr(val, '|');
    if (bar && atoi(val) < 0) {
        pthread_mutex_lock(&w->lock);
        w->failed = atoi(val);
        w->published = 1;
        snprintf(w->fail_msg, sizeof w->fail_msg, "%s", bar + 1);
        pthread_mutex_unlock(&w->lock);
    }
    free(val);
}

static pdde_status comm_report(comm_world *w, pdde_status st) {
    if (!st) return st;
    if ((st == PDDE_ERR_PEER_LOST || st == PDDE_ERR_TIMEOUT) && w->failed) {
        world_root_cause(w);
        st = w->failed;
    }
    char msg[sizeof w->fail_msg];
    pthread_mutex_lock(&w->lock);
    snprintf(msg, sizeof msg, "%s", w->failed ? w->fail_msg : "");
    pthread_mutex_unlock(&w->lock);
    return pdde_error(w->ctx, st, "comm: %s%s%s", pdde_status_str(st), *msg ? ": " : "", msg);
}

/* Set by the blocking forms of the operations (collectives.c) around their non-blocking start, so
 * that comm_start knows the caller will wait (and progress) right away. */
static _Thread_local int comm_blocking_call;

/* Spins for a few microseconds (latency), then yields (other ranks may share the core: with more
 * ranks than cores the peer we wait for needs it), then, past COMM_YIELD_S, sleeps with a growing
 * pause up to 1 ms, so that a long wait costs almost no CPU. The yielding stays short: yielding on an
 * idle core is spinning, and a rank under a CPU quota (a cgroup's CFS quota) that spins through a
 * pipeline bubble spends the quota it then lacks for its compute (bench_costmodel's throttled pair
 * waited in sched_yield for up to 20 ms at a time). */
#define COMM_SPIN_S 50e-6
#define COMM_YIELD_S 1e-3

static void comm_backoff(double idle, double left, double spin_s) {
    if (idle < spin_s) return;
    if (idle < COMM_YIELD_S) { sched_yield(); return; }
    double pause = idle / 16;
    if (pause > 1e-3) pause = 1e-3;
    if (pause > left) pause = left;
    if (pause > 0) comm_sleep(pause);
}

#endif /* PDDE_COMM_WORLD_C */
