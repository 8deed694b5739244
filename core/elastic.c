/* core/elastic.c — elastic training in process: membership through the store, in-memory snapshots of a
 * session's state at step boundaries, and recovery that keeps the survivors' processes (re-form the
 * world, let the caller re-plan and rebuild its session, restore the snapshot, continue).
 * A part of pdde.c: included there in place (it reads and writes the session's private state).
 *
 * Keys, under J = "elastic/<job>", or "elastic/<job>/<run>" with PDDE_ELASTIC_RUN (pdde-run sets a run id
 * of its own for an etcd job: etcd outlives a run, and a run must not read an earlier one's notes):
 *   J/dead/<id>          a member's death notice: set by the store when its connection drops or its
 *                        lease (heartbeats every lease/4) ends, so a killed or frozen member is known
 *   J/left/<id>          a member that left at a step boundary on purpose
 *   J/exit/<id>          how the launcher saw the process end ("SIGKILL", "stopped (SIGSTOP)"; optional)
 *   J/joined             the joiners' counter: joiner k (from 1) is member id 65536 + k - 1; pdde-run takes
 *                        the ids of the ranks it starts as joiners itself (PDDE_ELASTIC_ID), so it knows
 *                        the id under which to note a rank's end however early that rank dies
 *   J/g<G>/...           generation G: its world communicator's keys (prefix J/g<G>/comm), the
 *                        survivors' announcements here/<id> ("<latest snapshot step> <previous>"), and
 *                        members: "<resume step> <n> <id0> .. <id n-1>", written once (compare-and-set)
 *                        by the lowest surviving member; rank r of generation G is member id r.
 * A member that finds itself outside the members of the generation it tries to join (it was frozen or
 * cut off while the others re-formed), or finds its own death or exit note as it forms, is fenced:
 * recover fails with PDDE_ERR_STATE and it stops; its old world's peers are gone and its store
 * connection was dropped when its lease ran out. */

#ifdef PDDE_HAVE_COMM
#include <signal.h>

#define ELASTIC_MAX_MEMBERS 4096

typedef struct {
    char name[sizeof ((pdde_tensor *)0)->name];
    size_t offset, nbytes;        /* in data (replicated) or shard (this rank's block of a split tensor) */
    int sharded;                  /* 1: split along split_dim into nblocks blocks, block `rank` here (ZeRO) */
    int split_dim, nblocks;
    int64_t gshape[PDDE_MAX_DIMS];
    int ndim;
} elastic_entry;

/* The state of a session at a step boundary, in host memory: replicated tensors whole, split ones
 * (ZeRO's optimizer state) as this rank's block, with a copy of the previous rank's blocks (peer),
 * sent and received around the ring of the world that took it (members, in its rank order). */
typedef struct {
    int64_t step;                 /* -1: empty */
    uint64_t user;
    uint32_t run_counter;
    pdde_optimizer_params schedule;
    pdde_loss_scale_stats scaler;
    elastic_entry *entries;
    int n_entries, cap_entries;
    char *data;
    size_t bytes, cap_bytes;
    char *shard, *peer;           /* this rank's blocks; the previous rank's (same layout) */
    size_t shard_bytes, cap_shard, cap_peer;
    int peer_ok;                  /* the peer's blocks arrived (and ours left): the snapshot is complete */
    int general;                  /* tensor or pipeline parallelism: shard holds a serialized pdde_snapshot
                                     (every block this rank holds), peer the previous rank's */
    size_t peer_bytes;            /* (general) the previous rank's serialized size */
    pdde_comm_request *reqs[2];   /* the exchange in flight */
    int *members, n_members, rank; /* the world that took it */
} elastic_snapshot;

#define ELASTIC_PEER_TAG 0xE1A57

typedef struct { const char *src; char *dst; size_t n; } elastic_copy;

#define ELASTIC_SLOTS 3

struct pdde_elastic {
    pdde_context *ctx;
    pdde_store *store;            /* this member's own connection: its death notice and heartbeats */
    pthread_mutex_t store_lock;   /* shared by the caller's thread and the heartbeat thread */
    pthread_t heartbeat;
    int heartbeat_started;
    _Atomic int stop;
    _Atomic int store_lost;       /* a renewal was refused after a stall: the store dropped this member (elastic_renew) */
    /* (elastic_renew) A renewal refused tells apart "this process was stalled" (fenced) from "the store did
     * not answer while this process ran" (down, frozen, cut off: it registers again and goes on) */
    _Atomic double renewed_ok_at; /* when the last renewal the store accepted was sent */
    _Atomic double stalled_at;    /* when a stall of this process was last seen (0: never) */
    _Atomic int reregister;       /* its lease ended while it ran and registering again has not worked yet */
    int etcd;                     /* the membership is in etcd (PDDE_RDZV=etcd://) */
    int withdraw_again;           /* renewals left that withdraw its own death notice once more (a reader may set it late) */
    _Atomic int mute;             /* (tests: the heartbeat pauses, PDDE_TEST_ELASTIC_STALL) */
    double lease_s;
    _Atomic double heard_at;      /* when the store last answered a call on store (el_heard; read without store_lock,
                                   * which a renewal waiting on a silent store holds) */
    char job[160];                /* J */
    int id;                       /* this member's id: its rank at the start (stable) */
    int *members, n_members;      /* of this generation: rank r is member members[r] */
    int rank, generation, restarts;
    int joined;                   /* members new to this generation: restore hands them the state */
    int left;                     /* this member left at a step boundary on purpose */
    int min_ranks, max_ranks, max_restarts, snapshot_every;
    double peer_timeout_s, timeout_s;
    pdde_comm *world;
    pdde_store *world_store;      /* the world's own connection (its death notice is the world's) */
    char store_addr[256];
    elastic_snapshot snap[ELASTIC_SLOTS]; /* the last boundaries: survivors may be a step apart, and the
                                             newest may lack its peer copy */
    int latest;                   /* the newest filled slot, -1 none */
    /* the change in progress (between a failure or boundary and the restore) */
    int changing, planned;
    double change_t0;             /* when it was noticed */
    int64_t change_step;          /* the step in progress then */
    int old_size;
    int64_t resume_step;
    char what[400];               /* "rank 3 lost (SIGKILL) at step 412" */
    char line[700];               /* the last transition's log line */
    char leave[256];              /* planned departures: "id@step,..." (PDDE_ELASTIC_LEAVE) */
    _Atomic int leave_asked;      /* pdde_elastic_request_leave (set from a signal handler): leave at the next boundary */
    _Atomic int leave_signal;     /* the signal it was asked for (pdde_elastic_request_leave; 0: none) */
    int stop_signal, stop_below_min; /* at PDDE_ELASTIC_STOP: the largest signal a member left for; departures
                                        would have left fewer than min_ranks */
    pdde_elastic_stats stats;
    /* the snapshot being copied while a step runs (elastic_copier) */
    int async;                    /* copy in the background (PDDE_ELASTIC_SYNC_SNAPSHOT=1: in step_begin) */
    pthread_t copier;
    int copier_started, copy_pending, copy_stop;
    pthread_mutex_t copy_lock;
    pthread_cond_t copy_cv;
    elastic_copy *copies;
    int n_copies, cap_copies;
    int pending_slot;             /* the slot being filled (-1: none) */
    int64_t pending_step;
    pdde_session *hooked;         /* the session whose update hook is set */
    size_t general_peer_bytes;    /* (general snapshots) the previous rank's size in this generation */
    int general_peer_gen;         /* the generation it is for (-1: not yet known) */
    pdde_status hook_status;
};

static double elastic_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void elastic_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* ---- the store, under this member's lock ---- */

/* Notes the outcome of a call on e->store (store_lock held) and returns it. Any status the store sent
 * (OK, NOT_FOUND, a refusal) means it answered; PDDE_ERR_TIMEOUT (no reply in time, or one still owed
 * from an earlier call), PDDE_ERR_PEER_LOST (the connection closed) and PDDE_ERR_COMM (etcd out of
 * reach, a connection refused) mean it did not. */
static pdde_status el_heard(pdde_elastic *e, pdde_status st) {
    if (st != PDDE_ERR_TIMEOUT && st != PDDE_ERR_PEER_LOST && st != PDDE_ERR_COMM) atomic_store(&e->heard_at, elastic_now());
    return st;
}

static pdde_status el_get(pdde_elastic *e, const char *key, char **val) {
    void *v = NULL;
    size_t n = 0;
    pthread_mutex_lock(&e->store_lock);
    pdde_status st = el_heard(e, e->store->iface->get(e->store->impl, NULL, key, &v, &n));
    pthread_mutex_unlock(&e->store_lock);
    if (st) { free(v); v = NULL; }
    *val = v;
    return st;
}

static pdde_status el_set(pdde_elastic *e, const char *key, const char *val) {
    pthread_mutex_lock(&e->store_lock);
    pdde_status st = el_heard(e, pdde_store_set(e->store, key, val, strlen(val)));
    pthread_mutex_unlock(&e->store_lock);
    return st;
}

static pdde_status el_cas(pdde_elastic *e, const char *key, const char *val, int *swapped) {
    pthread_mutex_lock(&e->store_lock);
    pdde_status st = el_heard(e, pdde_store_compare_set(e->store, key, "", 0, val, strlen(val), swapped));
    pthread_mutex_unlock(&e->store_lock);
    return st;
}

static int el_exists(pdde_elastic *e, const char *key) {
    char *v = NULL;
    pdde_status st = el_get(e, key, &v);
    free(v);
    return st == PDDE_OK;
}

/* A stall of this process seen from the heartbeat: a gap in it longer than it can take while the process
 * runs (a tick of its sleep, waiting for the caller's store call, or for its own renewal's reply, each
 * bounded; a loaded machine delays a tick by milliseconds, a stopped or starved process by seconds). */
static void elastic_note_gap(pdde_elastic *e, double from, double to, double bound) {
    if (to - from > bound) atomic_store(&e->stalled_at, to);
}

/* 1: this process was stalled since the store last accepted its renewal, or the store dropped it so. */
static int elastic_stalled(pdde_elastic *e) {
    return atomic_load(&e->store_lost) || atomic_load(&e->stalled_at) > atomic_load(&e->renewed_ok_at);
}

/* (store_lock held) A new lease for this member, the same id, and its death notice withdrawn. */
static pdde_status elastic_register_again(pdde_elastic *e) {
    char key[300], notice[32];
    snprintf(key, sizeof key, "%s/dead/%d", e->job, e->id);
    snprintf(notice, sizeof notice, "%d", (int)getpid());
    pdde_status st = el_heard(e, pdde_store_set_liveness(e->store, key, notice, strlen(notice), e->lease_s));
    if (!st) st = el_heard(e, pdde_store_remove(e->store, key));
    return st == PDDE_ERR_NOT_FOUND ? PDDE_OK : st;
}

/* Renews the lease. A renewal refused (PDDE_ERR_PEER_LOST: the store ended this member's lease) means its
 * death notice is set. When this process was stalled past it (elastic_stalled), the others leave it out
 * of the next world: it keeps no membership to come back to, so it stops at its next step boundary
 * (pdde_elastic_step_begin) rather than train on until the next change fences it, which may be a planned
 * one that then fails for everyone. When it ran all along and the store did not answer (etcd frozen:
 * resumed, it ends the leases overdue), the store was at fault, as when it restarts: it registers again
 * (a new lease, the same member), withdraws its death notice and goes on. */
static void elastic_renew(pdde_elastic *e) {
    double asked = elastic_now();
    pthread_mutex_lock(&e->store_lock);
    double sent = elastic_now();
    elastic_note_gap(e, asked, sent, 4 * e->lease_s + 1);
    pdde_status st = atomic_load(&e->reregister) ? PDDE_ERR_PEER_LOST : el_heard(e, pdde_store_ping(e->store));
    double done = elastic_now();
    elastic_note_gap(e, sent, done, 2 * e->lease_s + e->lease_s / 2);
    if (st == PDDE_OK) {
        atomic_store(&e->renewed_ok_at, sent);
        if (e->withdraw_again > 0) {
            char key[300];
            snprintf(key, sizeof key, "%s/dead/%d", e->job, e->id);
            e->withdraw_again--;
            el_heard(e, pdde_store_remove(e->store, key));
        }
    } else if (st == PDDE_ERR_PEER_LOST && e->etcd && !elastic_stalled(e)) {
        if (!atomic_load(&e->reregister))
            pdde_log(PDDE_LOG_WARN, "elastic: member %d: the store ended its lease of %.3g s while the process ran and the store did not "
                    "answer (down, frozen or cut off): it registers again and goes on\n", e->id, e->lease_s);
        st = elastic_register_again(e);
        if (st == PDDE_OK) atomic_store(&e->renewed_ok_at, elastic_now()), e->withdraw_again = 4;
        atomic_store(&e->reregister, st != PDDE_OK); /* (tried again at the next heartbeat) */
    } else if (st == PDDE_ERR_PEER_LOST) {
        atomic_store(&e->store_lost, 1);
    }
    pthread_mutex_unlock(&e->store_lock);
}

/* A member whose process is frozen stops renewing its lease, and the store then sets its death notice. */
static void *elastic_heartbeat(void *arg) {
    pdde_elastic *e = arg;
    double period = e->lease_s / 4;
    while (!atomic_load(&e->stop)) {
        for (double tick = elastic_now(), until = tick + period; tick < until && !atomic_load(&e->stop);) {
            elastic_sleep(0.01);
            double now = elastic_now();
            elastic_note_gap(e, tick, now, e->lease_s / 2);
            tick = now;
        }
        if (atomic_load(&e->stop)) break;
        if (!atomic_load(&e->mute)) elastic_renew(e);
    }
    return NULL;
}

/* The variable's value, or dflt where it is unset or, said on stderr, not a whole number >= lo */
static int elastic_env_int(const char *name, int dflt, int lo) {
    long x;
    pdde_env_int(name, dflt, lo, INT_MAX, &x);
    return (int)x;
}

/* ...a number of seconds, at least a millisecond */
static double elastic_env_seconds(const char *name, double dflt) {
    double x;
    pdde_env_double(name, dflt, 1e-3, INFINITY, &x);
    return x;
}

static int elastic_parse_members(const char *v, int64_t *step, int *n, int *ids, int *n_joined, int cap);
#define ELASTIC_JOINER_ID0 65536

/* A joiner that has had no reply from the store for over twice its lease is cut off from it, or the
 * store is down: the store drops a client it has not heard from for a lease, so by then it surely
 * dropped this one, and no generation will take it in. (Its client gives up on a reply after twice the
 * lease and then fails at once until one comes, so only the time since the last reply tells.) Members
 * in a world do not stop so: a store slow for everyone must not fence them all. 1: cut off. */
static int elastic_joiner_cut_off(pdde_elastic *e, double *silent_s) {
    *silent_s = elastic_now() - atomic_load(&e->heard_at);
    return *silent_s > 2 * e->lease_s;
}

static pdde_status elastic_joiner_cut_off_error(pdde_elastic *e, double silent_s) {
    return pdde_error(e->ctx, PDDE_ERR_PEER_LOST, "elastic: member %d asked to join job %s and has had no reply from the store "
                      "for %.3g s (its lease is %.3g s): cut off or the store is down", e->id, e->job, silent_s, e->lease_s);
}

/* A rank started later (PDDE_ELASTIC_JOIN=1): it asks to join and waits until a generation takes it
 * in (the members notice it at their next step boundary), or stops once cut off from the store. */
static pdde_status elastic_wait_admitted(pdde_elastic *e) {
    char key[300], *v = NULL;
    double give_up = elastic_now() + e->timeout_s, silent_s = 0;
    int *ids = malloc((size_t)ELASTIC_MAX_MEMBERS * sizeof *ids);
    if (!ids) return pdde_error(e->ctx, PDDE_ERR_OOM, "elastic: out of memory");
    for (int g = 1; elastic_now() < give_up && !atomic_load(&e->store_lost);) {
        snprintf(key, sizeof key, "%s/g%d/members", e->job, g);
        if (el_get(e, key, &v) != PDDE_OK) {
            /* (judged after a call, not before: a process resumed after a stall asks the store first;
             * and before the next call, which on a silent store waits up to twice the lease again) */
            if (elastic_joiner_cut_off(e, &silent_s)) { free(ids); return elastic_joiner_cut_off_error(e, silent_s); }
            snprintf(key, sizeof key, "%s/done", e->job);
            if (el_exists(e, key)) break; /* (the members finished before taking it in) */
            elastic_sleep(0.01);
            continue;
        }
        int n = 0, joined = 0, rank = -1;
        int64_t step;
        int bad = elastic_parse_members(v, &step, &n, ids, &joined, ELASTIC_MAX_MEMBERS);
        free(v);
        for (int i = 0; !bad && i < n; i++)
            if (ids[i] == e->id) rank = i;
        if (rank < 0) { g++; continue; }
        free(e->members);
        e->members = ids, e->n_members = n, e->rank = rank, e->generation = g, e->resume_step = step, e->joined = joined;
        e->changing = 1, e->planned = 1, e->change_t0 = elastic_now(), e->change_step = step, e->old_size = n - joined;
        snprintf(e->what, sizeof e->what, "%d rank%s joined at step %lld", joined, joined > 1 ? "s" : "", (long long)step);
        return PDDE_OK;
    }
    free(ids);
    if (atomic_load(&e->store_lost))
        return pdde_error(e->ctx, PDDE_ERR_STATE, "elastic: member %d asked to join job %s and the store dropped it while it waited "
                          "(its lease of %.3g s ran out: the process was stalled or cut off)", e->id, e->job, e->lease_s);
    snprintf(key, sizeof key, "%s/done", e->job);
    if (el_exists(e, key))
        return pdde_error(e->ctx, PDDE_ERR_ABORTED, "elastic: member %d asked to join job %s, which finished before it was taken in",
                          e->id, e->job);
    return pdde_error(e->ctx, PDDE_ERR_TIMEOUT, "elastic: member %d asked to join job %s and was not taken in within %.3g s (is the job "
                      "running, below its --max?)", e->id, e->job, e->timeout_s);
}

/* While a world forms: a member whose death notice appears (it died or froze after it registered) or
 * whose end the launcher noted (J/exit/<id>: it ended before it could register, so no lease of its
 * ever ends) is reported as the world's failure in the world's store, which the others' world setup
 * watches, so they give up at once instead of at the timeout. The membership may live in etcd and the
 * world in the built-in store: the notices are read from the first, the failure written to the second
 * (through a connection of its own: the setup uses the world's). */
typedef struct { pdde_elastic *e; pdde_store *world; const char *failed_key; _Atomic int stop; } elastic_watch;

static void *elastic_watch_forming(void *arg) {
    elastic_watch *w = arg;
    pdde_elastic *e = w->e;
    char key[300], *how = NULL;
    while (!atomic_load(&w->stop)) {
        for (int r = 0; r < e->n_members && !atomic_load(&w->stop); r++) {
            if (e->members[r] == e->id) continue;
            snprintf(key, sizeof key, "%s/dead/%d", e->job, e->members[r]);
            int dead = el_exists(e, key);
            snprintf(key, sizeof key, "%s/exit/%d", e->job, e->members[r]);
            if (!dead && el_get(e, key, &how) != PDDE_OK) continue;
            char msg[300];
            if (dead)
                snprintf(msg, sizeof msg, "%d|rank %d (member %d) died or stopped answering while the world formed", PDDE_ERR_PEER_LOST,
                         r, e->members[r]);
            else
                snprintf(msg, sizeof msg, "%d|rank %d (member %d) ended (%.60s, as its launcher saw it) before the world formed",
                         PDDE_ERR_PEER_LOST, r, e->members[r], how ? how : "?");
            free(how);
            int swapped;
            pdde_store_compare_set(w->world, w->failed_key, "", 0, msg, strlen(msg), &swapped);
            return NULL;
        }
        elastic_sleep(0.05);
    }
    return NULL;
}

static pdde_status elastic_join_world(pdde_elastic *e) {
    pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
    char prefix[200], failed[240];
    snprintf(prefix, sizeof prefix, "%s/g%d/comm", e->job, e->generation);
    snprintf(failed, sizeof failed, "%s/1/failed", prefix); /* (a fresh prefix: the world's first generation) */
    p.rank = e->rank, p.world_size = e->n_members, p.prefix = prefix;
    p.timeout_s = e->timeout_s, p.peer_timeout_s = e->peer_timeout_s;
    /* the membership's notices and the launcher's notes count while the world forms */
    pdde_store *watch_conn = NULL;
    pdde_status st = pdde_store_connect(e->ctx, e->store_addr, e->timeout_s, &watch_conn);
    elastic_watch watch = {e, watch_conn, failed, 0};
    pthread_t watcher;
    int watching = !st && !pthread_create(&watcher, NULL, elastic_watch_forming, &watch);
    if (!st) st = pdde_store_connect(e->ctx, e->store_addr, e->timeout_s, &e->world_store);
    if (!st) p.store = e->world_store, st = pdde_comm_init(e->ctx, &p, &e->world);
    if (watching) {
        atomic_store(&watch.stop, 1);
        pthread_join(watcher, NULL);
    }
    pdde_store_close(watch_conn);
    if (st) return pdde_error(e->ctx, st, "elastic: generation %d: cannot form the world of %d ranks: %s", e->generation, e->n_members,
                              pdde_last_error(e->ctx));
    return PDDE_OK;
}

pdde_status pdde_elastic_init(pdde_context *ctx, const pdde_elastic_params *params, pdde_elastic **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_elastic_init: out is NULL");
    *out = NULL;
    pdde_elastic_params p = PDDE_ELASTIC_PARAMS_INIT;
    if (params) p = *params;
    pdde_comm_env env;
    pdde_status st = pdde_comm_env_read(ctx, &env);
    if (st) return st;
    if (!env.store_addr[0]) return pdde_error(ctx, PDDE_ERR_ENV, "elastic: PDDE_STORE_ADDR is not set (pdde-run --elastic sets it)");
    pdde_elastic *e = calloc(1, sizeof *e);
    if (!e) return pdde_error(ctx, PDDE_ERR_OOM, "elastic: out of memory");
    e->ctx = ctx;
    e->latest = -1, e->pending_slot = -1, e->general_peer_gen = -1;
    pthread_mutex_init(&e->copy_lock, NULL);
    pthread_cond_init(&e->copy_cv, NULL);
    e->async = !pdde_env_bool("PDDE_ELASTIC_SYNC_SNAPSHOT", 0);
    for (int k = 0; k < ELASTIC_SLOTS; k++) e->snap[k].step = -1;
    pthread_mutex_init(&e->store_lock, NULL);
    const char *job = p.job ? p.job : getenv("PDDE_ELASTIC_JOB"), *run = getenv("PDDE_ELASTIC_RUN");
    if (run && *run) /* (this run's keys apart from those an earlier run of the job's name left in etcd) */
        snprintf(e->job, sizeof e->job, "elastic/%.100s/%.40s", job && *job ? job : "job", run);
    else
        snprintf(e->job, sizeof e->job, "elastic/%.100s", job && *job ? job : "job");
    e->min_ranks = p.min_ranks > 0 ? p.min_ranks : elastic_env_int("PDDE_ELASTIC_MIN", 1, 1);
    e->max_ranks = p.max_ranks > 0 ? p.max_ranks : elastic_env_int("PDDE_ELASTIC_MAX", env.world_size, 1);
    e->max_restarts = p.max_restarts ? p.max_restarts : elastic_env_int("PDDE_ELASTIC_MAX_RESTARTS", 10, INT_MIN);
    e->snapshot_every = p.snapshot_every > 0 ? p.snapshot_every : elastic_env_int("PDDE_ELASTIC_SNAPSHOT_EVERY", 1, 1);
    if (e->snapshot_every < 1) e->snapshot_every = 1;
    e->peer_timeout_s = p.peer_timeout_s > 0 ? p.peer_timeout_s : elastic_env_seconds("PDDE_PEER_TIMEOUT", 5);
    e->timeout_s = p.timeout_s > 0 ? p.timeout_s : elastic_env_seconds("PDDE_ELASTIC_TIMEOUT", 300);
    const char *leave = getenv("PDDE_ELASTIC_LEAVE");
    snprintf(e->leave, sizeof e->leave, "%s", leave ? leave : "");
    e->id = e->rank = env.rank;
    snprintf(e->store_addr, sizeof e->store_addr, "%s", env.store_addr);
    e->n_members = env.world_size;
    if (env.world_size < e->min_ranks) {
        int min = e->min_ranks;
        free(e);
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "elastic: %d ranks started, fewer than the minimum %d", env.world_size, min);
    }
    char key[300], notice[64];
    e->members = malloc((size_t)env.world_size * sizeof *e->members);
    if (!e->members) { free(e); return pdde_error(ctx, PDDE_ERR_OOM, "elastic: out of memory"); }
    for (int i = 0; i < env.world_size; i++) e->members[i] = i;
    /* the membership: etcd (PDDE_RDZV=etcd://host:port) or the built-in store */
    const char *rdzv = getenv("PDDE_RDZV");
    e->etcd = rdzv && !strncmp(rdzv, "etcd://", 7);
    if (e->etcd) st = pdde_store_etcd_connect(ctx, rdzv, e->timeout_s, &e->store);
    else st = pdde_store_connect(ctx, env.store_addr, e->timeout_s, &e->store);
    if (st) goto fail;
    int joiner = pdde_env_bool("PDDE_ELASTIC_JOIN", 0) == 1;
    if (joiner) { /* an id of its own, after those of the ranks started and of earlier joiners */
        const char *given = getenv("PDDE_ELASTIC_ID");
        if (given && *given) { /* (its launcher took it from the counter before starting it, to note its end however early) */
            char *end;
            long id = strtol(given, &end, 10);
            if (*end || id < ELASTIC_JOINER_ID0 || id > INT_MAX) {
                st = pdde_error(ctx, PDDE_ERR_ENV, "elastic: PDDE_ELASTIC_ID=%.40s is not a joiner's member id (an integer from %d "
                                "up, taken from the job's counter %s/joined: pdde-run sets it)", given, ELASTIC_JOINER_ID0, e->job);
                goto fail;
            }
            e->id = (int)id;
        } else {
            int64_t k = 0;
            snprintf(key, sizeof key, "%s/joined", e->job);
            if ((st = pdde_store_add(e->store, key, 1, &k))) goto fail;
            e->id = ELASTIC_JOINER_ID0 + (int)k - 1;
        }
    }
    const char *hold = getenv("PDDE_TEST_ELASTIC_HOLD"); /* (tests: a member killed before it registers; up to 60 s) */
    if (hold && *hold && atoi(hold) == e->id && !joiner) {
        pdde_log(PDDE_LOG_INFO, "elastic: member %d holds before it registers (PDDE_TEST_ELASTIC_HOLD)\n", e->id);
        for (double until = elastic_now() + 60; elastic_now() < until;) elastic_sleep(0.05);
    }
    snprintf(key, sizeof key, "%s/dead/%d", e->job, e->id);
    snprintf(notice, sizeof notice, "%d", (int)getpid());

    double margin = e->peer_timeout_s / 4 < 0.25 ? e->peer_timeout_s / 4 : 0.25;
    e->lease_s = e->peer_timeout_s - margin;
    /* (before the heartbeat thread starts) The registration waits for its reply at most twice the lease
     * (the store's clients bound it so): a joiner whose store falls silent right then is cut off. */
    atomic_store(&e->heard_at, elastic_now());
    st = el_heard(e, pdde_store_set_liveness(e->store, key, notice, strlen(notice), e->lease_s));
    double silent_s = 0;
    if (st && joiner && (st == PDDE_ERR_TIMEOUT || elastic_joiner_cut_off(e, &silent_s)))
        st = elastic_joiner_cut_off_error(e, elastic_now() - atomic_load(&e->heard_at));
    if (st) goto fail;
    if (pthread_create(&e->heartbeat, NULL, elastic_heartbeat, e)) { st = pdde_error(ctx, PDDE_ERR_OOM, "elastic: no heartbeat thread"); goto fail; }
    e->heartbeat_started = 1;
    char maxv[32];
    snprintf(key, sizeof key, "%s/max", e->job);
    snprintf(maxv, sizeof maxv, "%d", e->max_ranks);
    if (!joiner && e->id == 0 && (st = el_set(e, key, maxv))) goto fail; /* (every member must agree on it) */
    if (joiner) {
        char *v = NULL;
        for (double until = elastic_now() + e->timeout_s; el_get(e, key, &v) != PDDE_OK && elastic_now() < until;) {
            if (elastic_joiner_cut_off(e, &silent_s)) { st = elastic_joiner_cut_off_error(e, silent_s); goto fail; }
            elastic_sleep(0.01);
        }
        if (v) e->max_ranks = atoi(v);
        free(v);
        snprintf(key, sizeof key, "%s/join/%d", e->job, e->id);
        if ((st = el_set(e, key, notice)) || (st = elastic_wait_admitted(e))) goto fail;
    }
    if ((st = elastic_join_world(e))) goto fail;
    *out = e;
    return PDDE_OK;
fail:
    pdde_elastic_free(e);
    return st;
}

static void snapshot_clear(elastic_snapshot *sn) {
    free(sn->entries), free(sn->data), free(sn->shard), free(sn->peer), free(sn->members);
    memset(sn, 0, sizeof *sn);
    sn->step = -1;
}

static void elastic_leave_world(pdde_elastic *e) {
    pdde_comm_free(e->world);
    pdde_store_close(e->world_store);
    e->world = NULL, e->world_store = NULL;
}

void pdde_elastic_free(pdde_elastic *e) {
    if (!e) return;
    if (e->copier_started) {
        pthread_mutex_lock(&e->copy_lock);
        while (e->copy_pending) pthread_cond_wait(&e->copy_cv, &e->copy_lock);
        e->copy_stop = 1;
        pthread_cond_broadcast(&e->copy_cv);
        pthread_mutex_unlock(&e->copy_lock);
        pthread_join(e->copier, NULL);
    }
    free(e->copies);
    pthread_mutex_destroy(&e->copy_lock);
    pthread_cond_destroy(&e->copy_cv);
    if (e->world && e->rank == 0 && !e->left && !e->changing) { /* the job is over: ranks still waiting to join stop */
        char key[300];
        snprintf(key, sizeof key, "%s/done", e->job);
        el_set(e, key, "done");
    }
    elastic_leave_world(e);
    if (e->heartbeat_started) {
        atomic_store(&e->stop, 1);
        pthread_join(e->heartbeat, NULL);
    }
    pdde_store_close(e->store); /* a clean goodbye: no death notice */
    for (int k = 0; k < ELASTIC_SLOTS; k++) snapshot_clear(&e->snap[k]);
    pthread_mutex_destroy(&e->store_lock);
    free(e->members);
    free(e);
}

pdde_status pdde_elastic_request_leave(pdde_elastic *e, int sig) {
    if (!e || sig < 0 || sig > 255) return PDDE_ERR_INVALID_ARG; /* (no pdde_error: a signal handler may call it) */
    atomic_store(&e->leave_signal, sig);
    atomic_store(&e->leave_asked, 1);
    return PDDE_OK;
}

pdde_status pdde_elastic_stop_reason(const pdde_elastic *e, int *sig, int *below_min) {
    if (!e) return PDDE_ERR_INVALID_ARG;
    if (sig) *sig = e->stop_signal;
    if (below_min) *below_min = e->stop_below_min;
    return PDDE_OK;
}

pdde_comm *pdde_elastic_world(const pdde_elastic *e) { return e ? e->world : NULL; }
int pdde_elastic_generation(const pdde_elastic *e) { return e ? e->generation : -1; }
const char *pdde_elastic_last_change(const pdde_elastic *e) { return e ? e->line : ""; }
pdde_status pdde_elastic_stats_get(const pdde_elastic *e, pdde_elastic_stats *out) {
    if (!e || !out) return PDDE_ERR_INVALID_ARG;
    *out = e->stats;
    return PDDE_OK;
}

/* ---- snapshots ---- */

/* The state a snapshot holds: parameters and optimizer state (as a checkpoint does). */
static bool elastic_saved(const pdde_tensor *t) {
    return t->op == PDDE_OP_NONE && (t->flags & (PDDE_TENSOR_PARAM | PDDE_TENSOR_STATE)) &&
           !(t->flags & (PDDE_TENSOR_GRAD | PDDE_TENSOR_SPARSE));
}


/* Finishes (wait) or drops the peer exchange of a snapshot; 1 when it completed. The wait is bounded:
 * the copy has been in flight since the step's first update, so a peer alive and in step sends it
 * well within twice the failure-detection bound plus 5 s (and the bytes at 100 MB/s); one that does not is
 * out of step (the members disagree on the snapshot steps), never worth the world's timeout: the
 * world is aborted (the others, waiting for this rank in a collective, learn it at once) and the
 * caller re-forms it, which makes every member's snapshots agree again. */
static int elastic_exchange_end(pdde_elastic *e, elastic_snapshot *sn, int wait) {
    int ok = 1;
    double bound = 2 * e->peer_timeout_s + 5 + (double)sn->shard_bytes / 1e8, t0 = elastic_now();
    for (int k = 0; k < 2; k++) {
        if (!sn->reqs[k]) continue;
        int done = 0;
        pdde_status st = PDDE_OK;
        if (wait) {
            double left = bound - (elastic_now() - t0);
            st = pdde_comm_wait(sn->reqs[k], left > 0.001 ? left : 0.001);
            done = 1;
            if (st == PDDE_ERR_TIMEOUT) {
                pdde_log(PDDE_LOG_WARN, "elastic: rank %d: the peer copy of step %lld's snapshot %s rank %d did not complete within %.3g s "
                        "while no member was known lost: the members are out of step; the world re-forms\n", e->rank,
                        (long long)sn->step, k ? "to" : "from", k ? (e->rank + 1) % e->n_members : (e->rank + e->n_members - 1) % e->n_members,
                        bound);
                pdde_comm_abort(e->world);
            }
        } else {
            st = pdde_comm_test(sn->reqs[k], &done);
        }
        ok &= done && !st;
        pdde_comm_request_free(sn->reqs[k]);
        sn->reqs[k] = NULL;
    }
    return ok;
}

/* The step a slot can restore everywhere it is needed (-1: none): a split snapshot needs its peer copy. */
static int64_t elastic_complete_step(const elastic_snapshot *sn) {
    return sn->step >= 0 && (!sn->shard_bytes || sn->peer_ok) ? sn->step : -1;
}

static pdde_status elastic_grow(pdde_context *ctx, char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return PDDE_OK;
    size_t c = *cap ? *cap : 1 << 20;
    while (c < need) c *= 2;
    char *d = realloc(*buf, c + 4);
    if (!d) return pdde_error(ctx, PDDE_ERR_OOM, "elastic: no memory for a snapshot of %zu bytes", c);
    *buf = d, *cap = c;
    return PDDE_OK;
}

/* The copier thread: copies the snapshot's tensors while the step's forward and backward run (they
 * read the parameters and the optimizer state, the updates write them: the session's update hook waits
 * for the copy before its first update). */
static void *elastic_copier(void *arg) {
    pdde_elastic *e = arg;
    pthread_mutex_lock(&e->copy_lock);
    for (;;) {
        while (!e->copy_pending && !e->copy_stop) pthread_cond_wait(&e->copy_cv, &e->copy_lock);
        if (e->copy_stop) break;
        pthread_mutex_unlock(&e->copy_lock);
        double t0 = elastic_now();
        for (int i = 0; i < e->n_copies; i++) memcpy(e->copies[i].dst, e->copies[i].src, e->copies[i].n);
        pthread_mutex_lock(&e->copy_lock);
        e->stats.copy_s += elastic_now() - t0;
        e->copy_pending = 0;
        pthread_cond_broadcast(&e->copy_cv);
    }
    pthread_mutex_unlock(&e->copy_lock);
    return NULL;
}

/* Completes the snapshot in progress (waits for the copier), and starts the copy of this rank's blocks
 * to the next rank when `exchange`. */
static pdde_status elastic_snapshot_finish(pdde_elastic *e, int exchange) {
    if (e->pending_slot < 0) return PDDE_OK;
    double t0 = elastic_now();
    pthread_mutex_lock(&e->copy_lock);
    while (e->copy_pending) pthread_cond_wait(&e->copy_cv, &e->copy_lock);
    pthread_mutex_unlock(&e->copy_lock);
    elastic_snapshot *sn = &e->snap[e->pending_slot];
    sn->step = e->pending_step;
    e->latest = e->pending_slot, e->pending_slot = -1;
    pdde_status st = PDDE_OK;
    if (sn->shard_bytes && e->n_members > 1 && exchange) { /* my blocks to the next rank, the previous rank's to me */
        sn->peer_bytes = sn->general ? e->general_peer_bytes : sn->shard_bytes;
        st = elastic_grow(e->ctx, &sn->peer, &sn->cap_peer, sn->peer_bytes);
        int n = e->n_members, next = (e->rank + 1) % n, prev = (e->rank + n - 1) % n;
        if (!st) st = pdde_comm_irecv(e->world, sn->peer, (sn->peer_bytes + 3) / 4, PDDE_I32, prev, ELASTIC_PEER_TAG, &sn->reqs[0]);
        if (!st) st = pdde_comm_isend(e->world, sn->shard, (sn->shard_bytes + 3) / 4, PDDE_I32, next, ELASTIC_PEER_TAG, &sn->reqs[1]);
    } else {
        sn->peer_ok = !sn->shard_bytes || e->n_members == 1;
    }
    e->stats.snapshots++, e->stats.snapshot_bytes = sn->bytes + sn->shard_bytes, e->stats.snapshot_s += elastic_now() - t0;
    return st;
}

/* The session's update hook: the copy must be whole before the first update. */
static void elastic_update_hook(void *arg) {
    pdde_elastic *e = arg;
    if (e->hooked) e->hooked->update_hook = NULL, e->hooked = NULL;
    e->hook_status = elastic_snapshot_finish(e, 1);
}

/* Whether s holds state that the replicated-or-ZeRO layout does not describe: a tensor split another way
 * than over the data-parallel ranks alone (tensor parallelism, ZeRO over tp), or held by another
 * pipeline stage. */
static int elastic_needs_general(pdde_elastic *e, pdde_session *s) {
    for (int i = 0; i < s->g->n; i++) {
        pdde_tensor *t = s->g->nodes[i];
        if (!elastic_saved(t)) continue;
        pdde_tensor *lt = local_of(s, t);
        if (!lt) {
            if (held_elsewhere(s, t)) return 1;
            continue;
        }
        int split = -1, nsplit = 0;
        for (int d = 0; lt->dist.mesh && d < lt->ndim; d++)
            if (lt->dist.dims_mapping[d] >= 0) split = d, nsplit++;
        if (split < 0) continue;
        int axis = program_axis(s->prog, lt->dist.mesh, lt->dist.dims_mapping[split]);
        if (nsplit > 1 || lt->dtype != PDDE_F32 || lt->dist.mesh->shape[lt->dist.dims_mapping[split]] != e->n_members ||
            s->prog->coords[axis] != e->rank)
            return 1;
    }
    return 0;
}

/* The general snapshot (tensor or pipeline parallelism): every block this rank holds, serialized
 * (pdde_snapshot_take with replicas), copied now; its bytes go to the next rank as ZeRO's blocks do.
 * The sizes may differ between ranks: the first snapshot of a generation tells each rank its
 * previous rank's (an allgather: every member takes it at the same boundary). */
static pdde_status elastic_snapshot_take_general(pdde_elastic *e, pdde_session *s, elastic_snapshot *sn, int slot, uint64_t user, double t0) {
    pdde_snapshot_params sp = PDDE_SNAPSHOT_PARAMS_INIT;
    sp.replicas = 1;
    pdde_checkpoint_extra ex = {.data_position = user};
    pdde_snapshot *g = NULL;
    pdde_status st = pdde_snapshot_take(s, &sp, &ex, &g);
    if (st) return st;
    size_t n = 0;
    const void *d = pdde_snapshot_data(g, &n);
    if (!d) { pdde_snapshot_free(g); return pdde_error(s->ctx, PDDE_ERR_OOM, "elastic: no memory to serialize a snapshot"); }
    st = elastic_grow(s->ctx, &sn->shard, &sn->cap_shard, n);
    if (!st) memcpy(sn->shard, d, n), memset(sn->shard + n, 0, 4);
    pdde_snapshot_free(g);
    if (st) return st;
    int *m = realloc(sn->members, (size_t)e->n_members * sizeof *m);
    if (!m) return pdde_error(s->ctx, PDDE_ERR_OOM, "elastic: out of memory");
    memcpy(m, e->members, (size_t)e->n_members * sizeof *m);
    sn->members = m, sn->n_members = e->n_members, sn->rank = e->rank, sn->general = 1, sn->shard_bytes = n;
    sn->user = user, sn->run_counter = s->run_counter, sn->schedule = s->schedule, sn->scaler = s->scaler;
    if (e->n_members > 1 && e->general_peer_gen != e->generation) {
        int64_t *sizes = malloc((size_t)e->n_members * sizeof *sizes), mine = (int64_t)n;
        if (!sizes) return pdde_error(s->ctx, PDDE_ERR_OOM, "elastic: out of memory");
        st = pdde_comm_allgather(e->world, &mine, sizes, 1, PDDE_I64);
        if (!st) e->general_peer_bytes = (size_t)sizes[(e->rank + e->n_members - 1) % e->n_members], e->general_peer_gen = e->generation;
        free(sizes);
        if (st) return st;
    }
    e->pending_slot = slot, e->pending_step = s->step;
    e->stats.snapshot_s += elastic_now() - t0;
    return elastic_snapshot_finish(e, 1);
}

static pdde_status elastic_snapshot_take(pdde_elastic *e, pdde_session *s, uint64_t user) {
    double t0 = elastic_now();
    pdde_status st = elastic_snapshot_finish(e, 0); /* (one left by a run without updates) */
    if (st) return st;
    int slot = -1; /* the oldest (an empty one first), never the newest */
    for (int k = 0; k < ELASTIC_SLOTS; k++)
        if (k != e->latest && (slot < 0 || e->snap[k].step < e->snap[slot].step)) slot = k;
    elastic_snapshot *sn = &e->snap[slot];
    elastic_exchange_end(e, sn, 0);
    sn->n_entries = 0, sn->bytes = 0, sn->shard_bytes = 0, sn->peer_ok = 0, sn->step = -1, sn->general = 0;
    e->n_copies = 0;
    if (elastic_needs_general(e, s)) return elastic_snapshot_take_general(e, s, sn, (int)(sn - e->snap), user, t0);
    int async = 1;
    for (int i = 0; i < s->g->n; i++) {
        pdde_tensor *t = s->g->nodes[i];
        if (!elastic_saved(t)) continue;
        pdde_tensor *lt = local_of(s, t);
        if (!lt && !held_elsewhere(s, t)) continue; /* not in the step */
        int split = -1, nsplit = 0;
        for (int d = 0; lt && lt->dist.mesh && d < lt->ndim; d++) /* (no mesh: a session of one process, all whole) */
            if (lt->dist.dims_mapping[d] >= 0) split = d, nsplit++;
        int axis = split >= 0 ? program_axis(s->prog, lt->dist.mesh, lt->dist.dims_mapping[split]) : -1;
        if (!lt || nsplit > 1 || (split >= 0 && (lt->dtype != PDDE_F32 || lt->dist.mesh->shape[lt->dist.dims_mapping[split]] != e->n_members ||
                                                  s->prog->coords[axis] != e->rank)))
            return pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "elastic: %s is %s on this rank: in-memory snapshots hold replicated "
                              "state and state split over the data-parallel ranks (ZeRO), not tensor or pipeline parallelism",
                              t->name, lt ? "split another way" : "held by another pipeline stage");
        size_t nb = pdde_tensor_nbytes(lt);
        if (sn->n_entries == sn->cap_entries) {
            int cap = sn->cap_entries ? 2 * sn->cap_entries : 64;
            elastic_entry *en = realloc(sn->entries, (size_t)cap * sizeof *en);
            if (!en) return pdde_error(s->ctx, PDDE_ERR_OOM, "elastic: out of memory for a snapshot");
            sn->entries = en, sn->cap_entries = cap;
        }
        if (e->n_copies == e->cap_copies) {
            int cap = e->cap_copies ? 2 * e->cap_copies : 64;
            elastic_copy *c = realloc(e->copies, (size_t)cap * sizeof *c);
            if (!c) return pdde_error(s->ctx, PDDE_ERR_OOM, "elastic: out of memory for a snapshot");
            e->copies = c, e->cap_copies = cap;
        }
        elastic_entry *en = &sn->entries[sn->n_entries++];
        snprintf(en->name, sizeof en->name, "%s", t->name);
        en->nbytes = nb, en->sharded = split >= 0, en->split_dim = split, en->ndim = t->ndim;
        en->nblocks = split >= 0 ? lt->dist.mesh->shape[lt->dist.dims_mapping[split]] : 1;
        memcpy(en->gshape, t->shape, sizeof en->gshape);
        en->offset = en->sharded ? sn->shard_bytes : sn->bytes;
        *(en->sharded ? &sn->shard_bytes : &sn->bytes) += nb;
        const session_device *sd = &s->devs[s->slot[lt->id]];
        async &= sd->host;
        e->copies[e->n_copies] = (elastic_copy){sd->host ? (const char *)lt->data + lt->offset : NULL, NULL, nb};
        e->n_copies++;
    }
    if ((st = elastic_grow(s->ctx, &sn->data, &sn->cap_bytes, sn->bytes)) || (st = elastic_grow(s->ctx, &sn->shard, &sn->cap_shard, sn->shard_bytes)))
        return st;
    for (int k = 0; k < sn->n_entries; k++) e->copies[k].dst = (sn->entries[k].sharded ? sn->shard : sn->data) + sn->entries[k].offset;
    int *m = realloc(sn->members, (size_t)e->n_members * sizeof *m);
    if (!m) return pdde_error(s->ctx, PDDE_ERR_OOM, "elastic: out of memory");
    memcpy(m, e->members, (size_t)e->n_members * sizeof *m);
    sn->members = m, sn->n_members = e->n_members, sn->rank = e->rank;
    sn->user = user, sn->run_counter = s->run_counter, sn->schedule = s->schedule, sn->scaler = s->scaler;
    e->pending_slot = slot, e->pending_step = s->step;
    if (async && e->async && !e->copier_started) {
        if (pthread_create(&e->copier, NULL, elastic_copier, e)) e->async = 0;
        else e->copier_started = 1;
    }
    if (async && e->async) { /* copied while the step runs; the session's update hook waits for it */
        pthread_mutex_lock(&e->copy_lock);
        e->copy_pending = 1;
        pthread_cond_signal(&e->copy_cv);
        pthread_mutex_unlock(&e->copy_lock);
        s->update_hook = elastic_update_hook, s->update_hook_arg = e, e->hooked = s;
        e->stats.snapshot_s += elastic_now() - t0;
        return PDDE_OK;
    }
    for (int k = 0; k < sn->n_entries; k++) {
        pdde_tensor *t = pdde_graph_find(s->g, sn->entries[k].name);
        if ((st = read_local(s, local_of(s, t), e->copies[k].dst, sn->entries[k].nbytes))) { e->pending_slot = -1; return st; }
    }
    e->stats.snapshot_s += elastic_now() - t0;
    return elastic_snapshot_finish(e, 1);
}

static const elastic_snapshot *elastic_snapshot_at(const pdde_elastic *e, int64_t step) {
    for (int k = 0; k < ELASTIC_SLOTS; k++)
        if (e->snap[k].step == step) return &e->snap[k];
    return NULL;
}

/* ---- the step protocol ---- */

/* Whether member id leaves at step (PDDE_ELASTIC_LEAVE "id@step,..."). */
static int elastic_leaves(const pdde_elastic *e, int id, int64_t step) {
    for (const char *p = e->leave; *p;) {
        char *end;
        long who = strtol(p, &end, 10);
        if (end == p || *end != '@') return 0;
        long long at = strtoll(end + 1, &end, 10);
        if (who == id && at == step) return 1;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return 0;
    }
    return 0;
}


/* Whether joiner `id` (not a member) waits to be taken in: it asked, and neither its death notice nor
 * its launcher's note of its end is there (a joiner killed while it waits holds its lease a while
 * longer: taken in, it would fail the world that forms with it). */
static int elastic_joiner_asks(pdde_elastic *e, int id) {
    char key[300];
    snprintf(key, sizeof key, "%s/join/%d", e->job, id);
    if (!el_exists(e, key)) return 0;
    snprintf(key, sizeof key, "%s/dead/%d", e->job, id);
    if (el_exists(e, key)) return 0;
    snprintf(key, sizeof key, "%s/exit/%d", e->job, id);
    return !el_exists(e, key);
}

/* The joiners waiting to be taken in (rank 0 asks the store; everyone learns it by broadcast). */
static int elastic_joiners_waiting(pdde_elastic *e, int cap) {
    char key[300], *v = NULL;
    snprintf(key, sizeof key, "%s/joined", e->job);
    if (el_get(e, key, &v) != PDDE_OK) return 0;
    int count = atoi(v), waiting = 0;
    free(v);
    for (int k = 0; k < count && waiting < cap; k++) {
        int id = ELASTIC_JOINER_ID0 + k, member = 0;
        for (int r = 0; r < e->n_members; r++) member |= e->members[r] == id;
        if (!member) waiting += elastic_joiner_asks(e, id);
    }
    return waiting;
}

/* Tests only: whether the hook `name` ("id@step") names this member at the boundary before `step` of
 * the first world. */
static bool elastic_test_hook_at(const pdde_elastic *e, const char *name, int64_t step) {
    const char *v = getenv(name), *at = v ? strchr(v, '@') : NULL;
    return at && e->generation == 0 && atoi(v) == e->id && atoll(at + 1) == step;
}

/* Tests only (PDDE_TEST_ELASTIC_LAG="id@step"): member id, at the boundary before `step` of the first
 * world, waits (up to 10 s) for a member's death notice before it snapshots; when one appears, the
 * failure has reached it before it began the step, while the others began it (and took its snapshot):
 * the race of a survivor a step behind the others, made certain. 1: treat it as a failure. */
static int elastic_test_lag(pdde_elastic *e, int64_t step) {
    if (!elastic_test_hook_at(e, "PDDE_TEST_ELASTIC_LAG", step)) return 0;
    char key[300];
    for (double until = elastic_now() + 10; elastic_now() < until; elastic_sleep(0.005))
        for (int r = 0; r < e->n_members; r++) {
            snprintf(key, sizeof key, "%s/dead/%d", e->job, e->members[r]);
            if (e->members[r] != e->id && el_exists(e, key)) return 1;
        }
    return 0;
}

/* Tests only (PDDE_TEST_ELASTIC_STALL="id@step"): member id, at the boundary before `step` of the first
 * world, stalls as a process starved of the CPU does: its heartbeat pauses and it waits twice its lease
 * and 0.5 s (the store drops it once the lease ends; its world, whose connection renews on its own
 * thread, stays up), then renews, which the store refuses. */
static void elastic_test_stall(pdde_elastic *e, int64_t step) {
    if (!elastic_test_hook_at(e, "PDDE_TEST_ELASTIC_STALL", step)) return;
    pdde_log(PDDE_LOG_INFO, "elastic: member %d stalls %.3g s at step %lld (PDDE_TEST_ELASTIC_STALL)\n", e->id, 2 * e->lease_s + 0.5,
            (long long)step);
    atomic_store(&e->mute, 1);
    elastic_sleep(2 * e->lease_s + 0.5);
    atomic_store(&e->stalled_at, elastic_now()); /* (its heartbeat ticked meanwhile: the stall is said here) */
    atomic_store(&e->mute, 0);
    elastic_renew(e);
}

/* Tests only (PDDE_TEST_ELASTIC_ADMIT=X): ranks waiting to join are taken in at step boundaries from X
 * on, never before (*admit); at X itself, when `wait`, the members wait (up to 30 s) until one has
 * asked to join. A failure-free reference of a run whose replica came back at X, and that run itself
 * (so that steps run without the replica before it is back). 0: not set. */
static int elastic_test_admit(pdde_elastic *e, int64_t step, int wait, int *admit) {
    const char *v = getenv("PDDE_TEST_ELASTIC_ADMIT");
    if (!v || !*v) return 0;
    *admit = step >= atoll(v);
    for (double until = elastic_now() + 30; wait && step == atoll(v) && !elastic_joiners_waiting(e, 1) && elastic_now() < until;)
        elastic_sleep(0.005);
    return 1;
}

/* Whether a status of a collective says a member is gone (the world changes), not a local error. */
static int elastic_lost_status(pdde_status st) {
    return st == PDDE_ERR_PEER_LOST || st == PDDE_ERR_COMM || st == PDDE_ERR_ABORTED || st == PDDE_ERR_TIMEOUT;
}

/* A member found gone at the boundary before `step`: the world re-forms (a failure, not planned). */
static void elastic_boundary_lost(pdde_elastic *e, int64_t step, int *change) {
    e->changing = 1, e->planned = 0, e->change_t0 = elastic_now(), e->change_step = step, e->old_size = e->n_members;
    *change = PDDE_ELASTIC_CHANGE;
}

pdde_status pdde_elastic_step_begin(pdde_elastic *e, pdde_session *s, uint64_t user, int *change) {
    if (!e || !s || !change) return PDDE_ERR_INVALID_ARG;
    *change = 0;
    int64_t step = s->step;
    elastic_test_stall(e, step);
    if (atomic_load(&e->store_lost)) { /* the others learn it from the aborted world at once, not at their timeout */
        if (e->world) pdde_comm_abort(e->world);
        return pdde_error(e->ctx, PDDE_ERR_STATE, "elastic: member %d was dropped by the store at step %lld: its lease of %.3g s ran out "
                          "while the process was stalled or cut off, so the others leave it out: fenced, it stops", e->id,
                          (long long)step, e->lease_s);
    }
    if (elastic_test_lag(e, step)) {
        elastic_boundary_lost(e, step, change);
        return PDDE_OK;
    }
    int have_snapshot = elastic_snapshot_at(e, step) != NULL;
    if (!have_snapshot && (e->latest < 0 || step - e->snap[e->latest].step >= e->snapshot_every)) {
        pdde_status st = elastic_snapshot_take(e, s, user);
        if (elastic_lost_status(st)) {
            e->pending_slot = -1; /* (a general snapshot's size exchange failed: a member is gone) */
            elastic_boundary_lost(e, step, change);
            return PDDE_OK;
        }
        if (st) return st;
        have_snapshot = 1;
    }
    /* Who leaves here: the planned departures (known to all) and the members that asked
     * (pdde_elastic_request_leave). One sum over the world at every boundary carries how many asked and
     * (rank 0's word, when there is room) how many ranks wait to join, so every member learns both at
     * the same boundary and all change together; who asked, and for which signal, takes a second
     * exchange, only then. */
    int n = e->n_members, leaving = 0, me = 0, admit_now = 0, largest_signal = 0;
    for (int r = 0; r < n; r++)
        if (elastic_leaves(e, e->members[r], step)) leaving++, me |= r == e->rank;
    if (leaving) elastic_test_admit(e, step, 1, &admit_now); /* (a joiner taken in with the leave: it is waiting before it) */
    /* (a planned leaver asked too still sends its signal: the others may stop for it) */
    int32_t asked = atomic_load(&e->leave_asked) ? 1 + atomic_load(&e->leave_signal) : 0;
    int64_t agree[2] = {0, asked > 0};
    if (!leaving && n < e->max_ranks) { /* room to grow: are ranks waiting to join? (rank 0 asks the store) */
        int admit = 1;
        elastic_test_admit(e, step, 1, &admit);
        if (e->rank == 0 && admit) agree[0] = elastic_joiners_waiting(e, e->max_ranks - n);
    }
    pdde_status st = pdde_comm_allreduce(e->world, agree, agree, 2, PDDE_I64, PDDE_REDUCE_SUM);
    int32_t *asks = !st && agree[1] > 0 ? malloc((size_t)n * sizeof *asks) : NULL;
    if (!st && agree[1] > 0 && !asks) return pdde_error(e->ctx, PDDE_ERR_OOM, "elastic: out of memory");
    if (asks) st = pdde_comm_allgather(e->world, &asked, asks, 1, PDDE_I32);
    for (int r = 0; !st && asks && r < n; r++) {
        if (asks[r] && !elastic_leaves(e, e->members[r], step)) leaving++, me |= r == e->rank;
        if (asks[r] - 1 > largest_signal) largest_signal = asks[r] - 1;
    }
    free(asks);
    if (st) { /* a member is gone: the copy in flight ends here, before the caller frees the session */
        if (e->hooked) e->hooked->update_hook = NULL, e->hooked = NULL;
        elastic_snapshot_finish(e, 0);
        elastic_boundary_lost(e, step, change);
        return PDDE_OK;
    }
    if (!leaving) {
        if (agree[0] > 0) {
            if (e->hooked) e->hooked->update_hook = NULL, e->hooked = NULL;
            if ((st = elastic_snapshot_finish(e, 1))) return st;
            if (e->latest >= 0 && (e->snap[e->latest].reqs[0] || e->snap[e->latest].reqs[1]))
                e->snap[e->latest].peer_ok = elastic_exchange_end(e, &e->snap[e->latest], 1);
            e->changing = 1, e->planned = 1, e->change_t0 = elastic_now(), e->change_step = step, e->old_size = e->n_members;
            *change = PDDE_ELASTIC_CHANGE;
        }
        return PDDE_OK;
    }
    /* departures that would leave fewer than min_ranks stop every member here, as when all leave: the
     * world is still whole, so the program can save (the re-form would only fail, unsaved) */
    int below_min = leaving < n && n - leaving < e->min_ranks, stop = leaving == n || below_min;
    /* those who stay resume from this boundary's snapshot, due or not: a departure loses no step (every
     * member knows of the departure here, so all take it) */
    if (!have_snapshot && !stop) {
        st = elastic_snapshot_take(e, s, user);
        if (elastic_lost_status(st)) { e->pending_slot = -1; elastic_boundary_lost(e, step, change); return PDDE_OK; }
        if (st) return st;
    }
    if (e->hooked) e->hooked->update_hook = NULL, e->hooked = NULL;
    pdde_status fs = elastic_snapshot_finish(e, 1);
    if (fs) return fs;
    if (e->latest >= 0 && (e->snap[e->latest].reqs[0] || e->snap[e->latest].reqs[1])) /* (everyone is here: finish the copies) */
        e->snap[e->latest].peer_ok = elastic_exchange_end(e, &e->snap[e->latest], 1);
    char key[300];
    if (stop) { /* every member leaves (a whole job preempted), or too few would stay: no one re-forms, the job ends here */
        snprintf(key, sizeof key, "%s/left/%d", e->job, e->id);
        if ((st = el_set(e, key, below_min ? "below-min" : "left"))) return st; /* (pdde-run's summary says which) */
        snprintf(key, sizeof key, "%s/done", e->job); /* (ranks waiting to join stop) */
        if (e->rank == 0 && (st = el_set(e, key, "done"))) return st;
        e->left = 1, e->stop_signal = largest_signal, e->stop_below_min = below_min;
        if (below_min)
            snprintf(e->line, sizeof e->line, "elastic: %d of %d ranks leave at step %lld; fewer than --min %d would remain: every rank "
                     "stops there", leaving, n, (long long)step, e->min_ranks);
        else
            snprintf(e->line, sizeof e->line, "elastic: every rank leaves at step %lld: the job stops there", (long long)step);
        if (e->rank == 0) pdde_log(PDDE_LOG_INFO, "%s\n", e->line);
        *change = PDDE_ELASTIC_STOP;
        return PDDE_OK;
    }
    e->changing = 1, e->planned = 1, e->change_t0 = elastic_now(), e->change_step = step, e->old_size = e->n_members;
    if (me) {
        snprintf(key, sizeof key, "%s/left/%d", e->job, e->id);
        if ((st = el_set(e, key, "left"))) return st;
        e->left = 1;
        *change = PDDE_ELASTIC_LEAVE;
        return PDDE_OK;
    }
    *change = PDDE_ELASTIC_CHANGE;
    return PDDE_OK;
}

pdde_status pdde_elastic_step_end(pdde_elastic *e, pdde_session *s, pdde_status run_status) {
    if (!e) return PDDE_ERR_INVALID_ARG;
    /* a copy the run did not wait for (it failed, or updated nothing) ends here: the state it copied
     * did not change before an update */
    if (e->hooked) e->hooked->update_hook = NULL, e->hooked = NULL;
    pdde_status hs = elastic_snapshot_finish(e, run_status == PDDE_OK);
    if (run_status == PDDE_OK && (hs || e->hook_status)) run_status = hs ? hs : e->hook_status;
    e->hook_status = PDDE_OK;
    elastic_snapshot *sn = e->latest >= 0 ? &e->snap[e->latest] : NULL;
    if (run_status == PDDE_OK && sn && (sn->reqs[0] || sn->reqs[1]) && !(sn->peer_ok = elastic_exchange_end(e, sn, 1)))
        run_status = PDDE_ERR_PEER_LOST; /* the copy to the next rank failed: a peer is gone */
    if (run_status == PDDE_OK) return PDDE_OK;
    if (run_status == PDDE_ERR_PEER_LOST || run_status == PDDE_ERR_TIMEOUT || run_status == PDDE_ERR_ABORTED ||
        run_status == PDDE_ERR_COMM) {
        e->changing = 1, e->planned = 0, e->change_t0 = elastic_now(), e->old_size = e->n_members;
        e->change_step = s ? s->step : (e->latest >= 0 ? e->snap[e->latest].step : 0);
        return PDDE_ERR_PEER_LOST;
    }
    if (run_status == PDDE_ERR_NONFINITE)
        return pdde_error(e->ctx, run_status, "elastic: the loss or the gradients are not finite at step %lld: that repeats "
                          "after a restart, so the job stops (%s)", (long long)(s ? s->step : -1), pdde_last_error(e->ctx));
    return pdde_error(e->ctx, run_status, "elastic: %s: not a lost peer, so a restart would repeat it: the job stops",
                      pdde_last_error(e->ctx));
}

/* ---- recovery ---- */

/* "<resume step> <n> <id>... <joined> <id>...": the members in rank order, then those new to it. */
static int elastic_parse_members(const char *v, int64_t *step, int *n, int *ids, int *n_joined, int cap) {
    char *end;
    *step = strtoll(v, &end, 10);
    long k = strtol(end, &end, 10);
    if (k < 1 || k > cap) return -1;
    for (long i = 0; i < k; i++) {
        char *p = end;
        ids[i] = (int)strtol(p, &end, 10);
        if (end == p) return -1;
    }
    *n = (int)k;
    *n_joined = (int)strtol(end, &end, 10);
    return *n_joined < 0 || *n_joined > k ? -1 : 0;
}

/* How the launcher saw member id end, or what the store knows. */
static void elastic_cause(pdde_elastic *e, int id, char *buf, size_t cap) {
    char key[300], *v = NULL;
    snprintf(key, sizeof key, "%s/left/%d", e->job, id);
    if (el_exists(e, key)) { snprintf(buf, cap, "left"); return; }
    snprintf(key, sizeof key, "%s/exit/%d", e->job, id);
    /* (the launcher writes it as it reaps, or for a stopped rank within 0.1 s of its death notice) */
    for (int k = 0; k < 80 && el_get(e, key, &v) != PDDE_OK; k++) elastic_sleep(0.005);
    if (v) { snprintf(buf, cap, "lost (%s)", v); free(v); return; }
    snprintf(key, sizeof key, "%s/dead/%d", e->job, id);
    snprintf(buf, cap, el_exists(e, key) ? "lost (died or stopped answering)" : "lost (cut off)");
}

/* Agrees on generation `next`'s members with the others (see the top of this file): fills ids (rank
 * order), *n, *n_joined and the step to resume at. */
static pdde_status elastic_agree(pdde_elastic *e, int next, int *ids, int *n, int *n_joined, int64_t *resume) {
    pdde_context *ctx = e->ctx;
    int n_old = e->n_members;
    char key[300], val[64], *v = NULL;
    /* the steps this member can restore (each slot's, -1 for none) */
    snprintf(key, sizeof key, "%s/g%d/here/%d", e->job, next, e->id);
    snprintf(val, sizeof val, "%lld %lld %lld", (long long)elastic_complete_step(&e->snap[0]),
             (long long)elastic_complete_step(&e->snap[1]), (long long)elastic_complete_step(&e->snap[2]));
    pdde_status st = el_set(e, key, val);
    /* (a silent etcd, this member having run all along, is etcd down or frozen, as a refused connection is) */
    if (st == PDDE_ERR_PEER_LOST || (st == PDDE_ERR_TIMEOUT && (!e->etcd || elastic_stalled(e))))
        return pdde_error(ctx, PDDE_ERR_STATE, "elastic: member %d lost its connection to the store (%s): its lease ran out while it "
                          "was frozen or cut off, and the others went on without it: fenced, it stops", e->id, pdde_last_error(ctx));
    if (st) return pdde_error(ctx, st, "elastic: cannot reach the store to re-form the world (%s): the job stops", pdde_last_error(ctx));
    int *here = calloc((size_t)n_old, sizeof *here), *gone = calloc((size_t)n_old, sizeof *gone);
    int64_t *have = calloc((size_t)n_old * ELASTIC_SLOTS, sizeof *have);
    char *list = malloc((size_t)(n_old + e->max_ranks) * 12 + 64);
    if (!here || !gone || !have || !list) { st = pdde_error(ctx, PDDE_ERR_OOM, "elastic: out of memory"); goto done; }
    /* the members not heard from after this long are left out (a frozen one's lease ends sooner) */
    double deadline = elastic_now() + 2 * e->peer_timeout_s + 2, give_up = elastic_now() + e->timeout_s;
    char members_key[300];
    snprintf(members_key, sizeof members_key, "%s/g%d/members", e->job, next);
    for (;;) {
        if (el_get(e, members_key, &v) == PDDE_OK) {
            int bad = elastic_parse_members(v, resume, n, ids, n_joined, ELASTIC_MAX_MEMBERS);
            free(v);
            if (bad) st = pdde_error(ctx, PDDE_ERR_CORRUPT, "elastic: generation %d's member list is malformed", next);
            goto done;
        }
        int pending = 0, lead = -1, me_exited = 0;
        for (int r = 0; r < n_old; r++) {
            int id = e->members[r];
            /* gone: its death notice, its leaving, or its end as the launcher saw it (at once, where etcd's
             * notice waits for the lease to end); read again each time: a member whose lease the store
             * ended while it ran (etcd frozen) registers again and withdraws its notice */
            snprintf(key, sizeof key, "%s/dead/%d", e->job, id);
            gone[r] = el_exists(e, key);
            snprintf(key, sizeof key, "%s/left/%d", e->job, id);
            if (!gone[r]) gone[r] = el_exists(e, key);
            snprintf(key, sizeof key, "%s/exit/%d", e->job, id);
            if (!gone[r] && el_exists(e, key)) gone[r] = 1, me_exited = id == e->id;
            if (!here[r]) {
                snprintf(key, sizeof key, "%s/g%d/here/%d", e->job, next, id);
                if (el_get(e, key, &v) == PDDE_OK) {
                    char *end;
                    const char *p = v;
                    for (int k = 0; k < ELASTIC_SLOTS; k++) have[ELASTIC_SLOTS * r + k] = strtoll(p, &end, 10), p = end;
                    here[r] = 1;
                    free(v);
                }
            }
            if (here[r] && !gone[r] && lead < 0) lead = r;
            pending += !here[r] && !gone[r];
        }
        /* its own death notice: the others leave it out. Stalled past its lease (or written off by its
         * launcher), it is fenced at once; else the store ended its lease while it ran, and its
         * heartbeat registers it again, withdrawing the notice, within a few renewals: it waits that long */
        int me_gone = e->rank >= 0 && e->rank < n_old && gone[e->rank];
        if (me_gone && (me_exited || elastic_stalled(e) || elastic_now() > deadline)) {
            st = pdde_error(ctx, PDDE_ERR_STATE, "elastic: member %d finds its own %s in the store while generation %d forms: its "
                            "lease ran out while the process was stalled or cut off, so the others leave it out: fenced, it stops",
                            e->id, me_exited ? "exit note (its launcher wrote it off)" : "death notice", next);
            goto done;
        }
        /* every old member dead or gone: no leader can exist; the notices of members that ran on are
         * withdrawn within a few renewals, so past the deadline none will */
        if (lead < 0 && !pending && elastic_now() > deadline) {
            st = pdde_error(ctx, PDDE_ERR_STATE, "elastic: generation %d cannot form: the store holds every member of generation %d "
                            "dead or gone: the job stops", next, e->generation);
            goto done;
        }
        double now = elastic_now();
        if (lead >= 0 && e->members[lead] == e->id && (!pending || now > deadline)) {
            /* the lowest survivor decides: the newest step every survivor can restore (-1: none, the
             * members then stop with that), the survivors in their order, then the ranks waiting to
             * join (up to max_ranks) */
            int64_t step = -1;
            int count = 0, joined = 0;
            for (int k = 0; k < ELASTIC_SLOTS; k++) {
                int64_t cand = have[ELASTIC_SLOTS * lead + k], all = cand >= 0;
                for (int r = 0; r < n_old && all; r++) {
                    if (!here[r] || gone[r]) continue;
                    int has = 0;
                    for (int j = 0; j < ELASTIC_SLOTS; j++) has |= have[ELASTIC_SLOTS * r + j] == cand;
                    all = has;
                }
                if (all && cand > step) step = cand;
            }
            for (int r = 0; r < n_old; r++) count += here[r] && !gone[r];
            int len = 0;
            char ids_text[64];
            for (int r = 0; r < n_old; r++)
                if (here[r] && !gone[r]) {
                    snprintf(ids_text, sizeof ids_text, " %d", e->members[r]);
                    len += sprintf(list + len, "%s", ids_text);
                }
            snprintf(key, sizeof key, "%s/joined", e->job);
            int waiting = el_get(e, key, &v) == PDDE_OK ? atoi(v) : 0, admit = 1;
            if (elastic_test_admit(e, e->change_step, 0, &admit) && !admit) waiting = 0;
            free(v), v = NULL;
            char joiners[ELASTIC_MAX_MEMBERS > 0 ? 1024 : 1] = "";
            int jl = 0;
            for (int k = 0; k < waiting && count < e->max_ranks && jl < (int)sizeof joiners - 16; k++) {
                int id = ELASTIC_JOINER_ID0 + k, member = 0;
                for (int r = 0; r < n_old; r++) member |= e->members[r] == id;
                if (member || !elastic_joiner_asks(e, id)) continue;
                len += sprintf(list + len, " %d", id);
                jl += snprintf(joiners + jl, sizeof joiners - (size_t)jl, " %d", id);
                count++, joined++;
            }
            char *text = malloc((size_t)len + 64);
            if (!text) { st = pdde_error(ctx, PDDE_ERR_OOM, "elastic: out of memory"); goto done; }
            snprintf(text, (size_t)len + 64, "%lld %d%s %d", (long long)step, count, list, joined);
            int swapped = 0;
            st = el_cas(e, members_key, text, &swapped);
            free(text);
            if (st) goto done;
            continue; /* read back what was decided (ours, or an earlier leader's) */
        }
        if (now > give_up) {
            st = pdde_error(ctx, PDDE_ERR_TIMEOUT, "elastic: generation %d was not formed within %.3g s", next, e->timeout_s);
            goto done;
        }
        elastic_sleep(0.002);
    }
done:
    free(here), free(gone), free(have), free(list);
    return st;
}

/* The log line's account of what changed from the old members to ids. */
static void elastic_describe(pdde_elastic *e, const int *ids, int n, int n_joined) {
    int len = 0;
    size_t cap = sizeof e->what;
    e->what[0] = 0;
    for (int r = 0; r < e->n_members; r++) {
        int kept = 0;
        for (int i = 0; i < n; i++) kept |= ids[i] == e->members[r];
        if (kept) continue;
        char cause[160];
        elastic_cause(e, e->members[r], cause, sizeof cause);
        len += snprintf(e->what + len, cap - (size_t)len, "%srank %d %s", len ? ", " : "", r, cause);
        if (len >= (int)cap) len = (int)cap - 1;
    }
    if (n_joined) len += snprintf(e->what + len, cap - (size_t)len, "%s%d rank%s joined", len ? ", " : "", n_joined, n_joined > 1 ? "s" : "");
    if (!len) len = snprintf(e->what, cap, "no rank lost (the members were out of step)");
    if (len >= (int)cap) len = (int)cap - 1;
    snprintf(e->what + len, cap - (size_t)len, " at step %lld", (long long)e->change_step);
}

pdde_status pdde_elastic_recover(pdde_elastic *e, pdde_elastic_change *out) {
    if (!e) return PDDE_ERR_INVALID_ARG;
    pdde_context *ctx = e->ctx;
    if (!e->changing) {
        e->changing = 1, e->planned = 0, e->change_t0 = elastic_now(), e->old_size = e->n_members;
        e->change_step = e->latest >= 0 ? e->snap[e->latest].step : 0;
    }
    if (!e->planned && ++e->restarts > e->max_restarts && e->max_restarts >= 0)
        return pdde_error(ctx, PDDE_ERR_ABORTED, "elastic: %d failures, more than --max-restarts %d: the job stops", e->restarts,
                          e->max_restarts);
    /* a copy still in flight (the caller skipped step_end): let it end; its session is the caller's */
    e->hooked = NULL;
    elastic_snapshot_finish(e, 0);
    /* exchanges of peer copies that completed count; the others are dropped with the old world */
    for (int k = 0; k < ELASTIC_SLOTS; k++)
        if (e->snap[k].reqs[0] || e->snap[k].reqs[1]) e->snap[k].peer_ok |= elastic_exchange_end(e, &e->snap[k], 0);
    /* the old world first: its sessions and sub-communicators are the caller's to free before */
    elastic_leave_world(e);
    e->what[0] = 0;
    for (;;) { /* once per generation tried: a member lost while forming one means forming the next */
        int next = e->generation + 1, n = 0, n_joined = 0;
        int64_t resume = -1;
        int *ids = malloc((size_t)ELASTIC_MAX_MEMBERS * sizeof *ids);
        if (!ids) return pdde_error(ctx, PDDE_ERR_OOM, "elastic: out of memory");
        pdde_status st = elastic_agree(e, next, ids, &n, &n_joined, &resume);
        int rank = -1;
        for (int i = 0; !st && i < n; i++)
            if (ids[i] == e->id) rank = i;
        if (!st && rank < 0)
            st = pdde_error(ctx, PDDE_ERR_STATE, "elastic: member %d was left out of generation %d (it stopped answering or came "
                            "late): fenced, it stops", e->id, next);
        if (!st && n < e->min_ranks)
            st = pdde_error(ctx, PDDE_ERR_NO_PLAN, "elastic: %d rank%s left, fewer than the minimum %d (--min): the job stops", n,
                            n == 1 ? "" : "s", e->min_ranks);
        const elastic_snapshot *have = elastic_snapshot_at(e, resume);
        if (!st && (!have || elastic_complete_step(have) != resume))
            st = pdde_error(ctx, PDDE_ERR_STATE, "elastic: no snapshot of step %lld here (the survivors hold no common step)",
                            (long long)resume);
        if (st) { free(ids); return st; }
        char before[sizeof e->what];
        snprintf(before, sizeof before, "%s", e->what);
        elastic_describe(e, ids, n, n_joined);
        if (before[0]) { /* a second change while forming: say both */
            char both[sizeof e->what];
            snprintf(both, sizeof both, "%.190s; then %.190s", before, e->what);
            snprintf(e->what, sizeof e->what, "%s", both);
        }
        free(e->members);
        e->members = ids;
        e->n_members = n, e->rank = rank, e->generation = next, e->resume_step = resume, e->joined = n_joined;
        const char *die = getenv("PDDE_TEST_ELASTIC_DIE_FORMING");
        if (die && atoi(die) == e->id && e->id != 0) raise(SIGKILL); /* (tests: a member lost while the next world forms) */
        st = elastic_join_world(e);
        if (!st) break;
        if (st != PDDE_ERR_TIMEOUT && st != PDDE_ERR_PEER_LOST && st != PDDE_ERR_COMM && st != PDDE_ERR_ABORTED) return st;
        elastic_leave_world(e); /* a member did not make it: form the next generation without it */
        if (!e->planned && ++e->restarts > e->max_restarts && e->max_restarts >= 0)
            return pdde_error(ctx, PDDE_ERR_ABORTED, "elastic: %d failures, more than --max-restarts %d: the job stops", e->restarts,
                              e->max_restarts);
    }
    if (out) {
        memset(out, 0, sizeof *out);
        out->generation = e->generation, out->rank = e->rank, out->world_size = e->n_members, out->old_world_size = e->old_size;
        out->resume_step = e->resume_step, out->planned = e->planned;
        snprintf(out->what, sizeof out->what, "%s", e->what);
    }
    return PDDE_OK;
}

/* Broadcasts nbytes of buf from rank 0 of the world (as 4-byte words: buffers are padded to them). */
static pdde_status elastic_bcast(pdde_elastic *e, void *buf, size_t nbytes) {
    return nbytes ? pdde_comm_broadcast(e->world, buf, (nbytes + 3) / 4, PDDE_I32, 0) : PDDE_OK;
}

/* Ranks new to the world get the snapshot from rank 0 (a survivor): the others hold it already. */
static pdde_status elastic_share_snapshot(pdde_elastic *e) {
    int slot = e->latest >= 0 ? e->latest : 0;
    const elastic_snapshot *have = elastic_snapshot_at(e, e->resume_step);
    if (have) slot = (int)(have - e->snap);
    else if (e->latest >= 0) slot = (e->latest + 1) % ELASTIC_SLOTS;
    elastic_snapshot *sn = &e->snap[slot];
    int64_t head[6] = {sn->step, (int64_t)sn->user, sn->run_counter, sn->n_entries, (int64_t)sn->bytes, (int64_t)sn->shard_bytes};
    pdde_status st = pdde_comm_broadcast(e->world, head, 6, PDDE_I64, 0);
    if (st) return st;
    if (head[5]) { /* split state (ZeRO): the joiners take part in making it whole, from the world that took it */
        int32_t nm = have ? sn->n_members : 0;
        if ((st = pdde_comm_broadcast(e->world, &nm, 1, PDDE_I32, 0))) return st;
        if (!have) { /* (it holds no block: its slot describes the layout; nothing of it is awaited) */
            int *m = nm > 0 ? realloc(sn->members, (size_t)nm * sizeof *m) : NULL;
            if (!m) return pdde_error(e->ctx, PDDE_ERR_OOM, "elastic: out of memory");
            sn->members = m, sn->n_members = nm, sn->rank = -1, sn->shard_bytes = (size_t)head[5], sn->peer_ok = 1, sn->general = 0;
        }
        if ((st = pdde_comm_broadcast(e->world, sn->members, (size_t)nm, PDDE_I32, 0))) return st;
    }
    if (!have) { /* the joiner: make room */
        size_t cap_b = ((size_t)head[4] + 3) & ~(size_t)3;
        elastic_entry *en = realloc(sn->entries, ((size_t)head[3] + 1) * sizeof *en);
        char *d = en ? realloc(sn->data, cap_b + 4) : NULL;
        if (en) sn->entries = en, sn->cap_entries = (int)head[3] + 1;
        if (!en || !d) return pdde_error(e->ctx, PDDE_ERR_OOM, "elastic: no memory for the snapshot of %lld bytes", (long long)head[4]);
        sn->data = d, sn->cap_bytes = cap_b + 4;
        sn->step = head[0], sn->user = (uint64_t)head[1], sn->run_counter = (uint32_t)head[2];
        sn->n_entries = (int)head[3], sn->bytes = (size_t)head[4];
        e->latest = slot;
    } else if (sn->cap_bytes < ((sn->bytes + 3) & ~(size_t)3)) {
        char *d = realloc(sn->data, sn->bytes + 4);
        if (!d) return pdde_error(e->ctx, PDDE_ERR_OOM, "elastic: out of memory");
        sn->data = d, sn->cap_bytes = sn->bytes + 4;
    }
    if ((st = elastic_bcast(e, sn->entries, (size_t)sn->n_entries * sizeof *sn->entries))) return st;
    if ((st = elastic_bcast(e, sn->data, sn->bytes))) return st;
    char extra[((sizeof sn->schedule + sizeof sn->scaler) + 3) & ~(size_t)3];
    memcpy(extra, &sn->schedule, sizeof sn->schedule), memcpy(extra + sizeof sn->schedule, &sn->scaler, sizeof sn->scaler);
    if ((st = elastic_bcast(e, extra, sizeof extra))) return st;
    memcpy(&sn->schedule, extra, sizeof sn->schedule), memcpy(&sn->scaler, extra + sizeof sn->schedule, sizeof sn->scaler);
    return PDDE_OK;
}

static int elastic_is_member(const pdde_elastic *e, int id) {
    for (int r = 0; r < e->n_members; r++)
        if (e->members[r] == id) return 1;
    return 0;
}

/* A split tensor of the snapshot, whole again: block b comes from the rank that took it if it is
 * still here, else from the next rank's copy; each survivor puts in the blocks it is to give (zeros
 * elsewhere) and a sum over the new world makes the whole tensor everywhere (x + 0 is exact). */
static pdde_status elastic_restore_split(pdde_elastic *e, pdde_session *s, const elastic_snapshot *sn, const elastic_entry *en, pdde_tensor *t) {
    int nb = en->nblocks, d = en->split_dim;
    size_t total = en->nbytes * (size_t)nb;
    float *whole = calloc(1, total + 4);
    if (!whole) return pdde_error(e->ctx, PDDE_ERR_OOM, "elastic: no memory to make %s whole (%zu bytes)", en->name, total);
    int64_t outer = 1, inner = 1;
    for (int k = 0; k < d; k++) outer *= en->gshape[k];
    for (int k = d + 1; k < en->ndim; k++) inner *= en->gshape[k];
    int64_t chunk = en->gshape[d] / nb * inner; /* elements of one block per outer index */
    for (int b = 0; b < nb && b < sn->n_members; b++) {
        int owner = sn->members[b], next = sn->members[(b + 1) % sn->n_members];
        int from_owner = elastic_is_member(e, owner);
        if (!from_owner && (nb == 1 || !elastic_is_member(e, next))) {
            free(whole);
            return pdde_error(e->ctx, PDDE_ERR_STATE, "elastic: block %d of %s is lost: ranks %d and %d of the world that took the "
                              "snapshot are both gone (each block is kept by its rank and the next): the job stops", b, en->name, b,
                              (b + 1) % sn->n_members);
        }
        int holder = from_owner ? owner : next;
        if (holder != e->id) continue;
        const float *block = (const float *)((from_owner ? sn->shard : sn->peer) + en->offset);
        for (int64_t o = 0; o < outer; o++)
            memcpy(whole + o * en->gshape[d] * inner + (int64_t)b * chunk, block + o * chunk, (size_t)chunk * sizeof(float));
    }
    pdde_status st = pdde_comm_allreduce(e->world, whole, whole, total / sizeof(float), PDDE_F32, PDDE_REDUCE_SUM);
    if (!st) st = pdde_session_write_global(s, t, whole, total);
    free(whole);
    return st;
}

/* A general snapshot restored under the new plan: every member contributes its own serialized snapshot
 * and, where the previous member of the world that took it is gone, that member's copy (joiners
 * contribute nothing); all go to every member (a broadcast each), which restores its blocks from the
 * set (pdde_snapshot_restore: any layout to any other). Each member holds the whole state meanwhile. */
static pdde_status elastic_restore_general(pdde_elastic *e, pdde_session *s, const elastic_snapshot *sn, uint64_t *user) {
    int n = e->n_members;
    int64_t mine[2] = {0, 0};
    char *mine_buf[2] = {NULL, NULL};
    if (sn) {
        mine[0] = (int64_t)sn->shard_bytes, mine_buf[0] = sn->shard;
        int prev = sn->members[(sn->rank + sn->n_members - 1) % sn->n_members];
        if (sn->n_members > 1 && sn->peer_ok && !elastic_is_member(e, prev)) mine[1] = (int64_t)sn->peer_bytes, mine_buf[1] = sn->peer;
    }
    int64_t *sizes = malloc((size_t)n * 2 * sizeof *sizes);
    pdde_snapshot **set = calloc((size_t)n * 2, sizeof *set);
    if (!sizes || !set) { free(sizes), free(set); return pdde_error(e->ctx, PDDE_ERR_OOM, "elastic: out of memory"); }
    pdde_status st = n > 1 ? pdde_comm_allgather(e->world, mine, sizes, 2, PDDE_I64) : PDDE_OK;
    if (n == 1) sizes[0] = mine[0], sizes[1] = mine[1];
    int m = 0;
    for (int r = 0; !st && r < n; r++)
        for (int k = 0; !st && k < 2; k++) {
            size_t bytes = (size_t)sizes[2 * r + k];
            if (!bytes) continue;
            char *buf = r == e->rank ? mine_buf[k] : malloc(bytes + 4);
            if (!buf) { st = pdde_error(e->ctx, PDDE_ERR_OOM, "elastic: no memory for a snapshot of %zu bytes", bytes); break; }
            if (n > 1) st = pdde_comm_broadcast(e->world, buf, (bytes + 3) / 4, PDDE_I32, r);
            if (!st) st = pdde_snapshot_from_data(e->ctx, buf, bytes, &set[m]);
            if (!st) m++;
            if (r != e->rank) free(buf);
        }
    pdde_checkpoint_extra ex = {0};
    if (!st) st = pdde_snapshot_restore(s, (const pdde_snapshot *const *)set, m, &ex);
    for (int k = 0; k < m; k++) pdde_snapshot_free(set[k]);
    free(set), free(sizes);
    if (st) return pdde_error(e->ctx, st, "elastic: restoring the snapshot of step %lld under the new plan: %s", (long long)e->resume_step,
                              pdde_last_error(e->ctx));
    if (user) *user = ex.data_position;
    return PDDE_OK;
}

pdde_status pdde_elastic_restore(pdde_elastic *e, pdde_session *s, const char *plan, uint64_t *user) {
    if (!e || !s) return PDDE_ERR_INVALID_ARG;
    const elastic_snapshot *sn = elastic_snapshot_at(e, e->resume_step);
    int general = sn && sn->general;
    if (e->joined) { /* (the joiners learn from rank 0, a member from before, which kind of snapshot it is) */
        int32_t g = general;
        pdde_status st = pdde_comm_broadcast(e->world, &g, 1, PDDE_I32, 0);
        if (st) return st;
        general = g;
    }
    if (general) {
        pdde_status st = elastic_restore_general(e, s, sn, user);
        if (st) return st;
        if (!sn) { /* a joiner: an empty snapshot of the resume step (it holds no block of it), so that it skips the
                    * boundary's snapshot as the members do (they hold that step's) */
            elastic_snapshot *mine = &e->snap[0];
            mine->step = e->resume_step, mine->general = 1, mine->shard_bytes = 0, mine->bytes = 0, mine->n_entries = 0;
            mine->peer_ok = 1, mine->n_members = 0;
            sn = mine;
        }
        for (int k = 0; k < ELASTIC_SLOTS; k++)
            if (&e->snap[k] == sn) e->latest = k;
            else if (e->snap[k].step > e->resume_step) e->snap[k].step = -1, e->snap[k].peer_ok = 0;
        double dt = elastic_now() - e->change_t0;
        snprintf(e->line, sizeof e->line, "elastic: %s; re-plan %d -> %d ranks: %s; resumed at step %lld in %.2f s", e->what, e->old_size,
                 e->n_members, plan && *plan ? plan : "(same plan)", (long long)e->resume_step, dt);
        if (e->rank == 0) pdde_log(PDDE_LOG_INFO, "%s\n", e->line);
        e->changing = 0, e->joined = 0;
        e->stats.changes++, e->stats.last_recover_s = dt;
        return PDDE_OK;
    }
    if (e->joined) {
        pdde_status st = elastic_share_snapshot(e);
        if (st) return pdde_error(e->ctx, st, "elastic: handing the state to the ranks that joined failed: %s", pdde_last_error(e->ctx));
    }
    sn = elastic_snapshot_at(e, e->resume_step);
    if (!sn) return pdde_error(e->ctx, PDDE_ERR_STATE, "elastic: no snapshot of step %lld to restore", (long long)e->resume_step);
    for (int k = 0; k < sn->n_entries; k++) {
        const elastic_entry *en = &sn->entries[k];
        pdde_tensor *t = pdde_graph_find(s->g, en->name);
        if (!t) return pdde_error(e->ctx, PDDE_ERR_MISMATCH, "elastic: the snapshot's tensor %s is not in the new session's graph", en->name);
        pdde_status st = en->sharded ? elastic_restore_split(e, s, sn, en, t) : pdde_session_write_global(s, t, sn->data + en->offset, en->nbytes);
        if (st) return st;
    }
    s->step = sn->step, s->run_counter = sn->run_counter, s->schedule = sn->schedule;
    if (s->loss_scaling) {
        s->scaler = sn->scaler;
        pdde_status st = scaler_load(s);
        if (st) return st;
        s->scaler.good_steps = sn->scaler.good_steps;
    }
    if (user) *user = sn->user;
    /* The restored snapshot stays (a failure before the next one restores it again); newer ones go. A
     * survivor may have begun the step after the resume step before the failure reached it, and one
     * that kept that snapshot would skip the next, while the others take it and wait for its peer copy
     * (split state) from a rank that never sends it. */
    for (int k = 0; k < ELASTIC_SLOTS; k++)
        if (&e->snap[k] == sn) e->latest = k;
        else if (e->snap[k].step > sn->step) e->snap[k].step = -1, e->snap[k].peer_ok = 0;
    double dt = elastic_now() - e->change_t0;
    snprintf(e->line, sizeof e->line, "elastic: %s; re-plan %d -> %d ranks: %s; resumed at step %lld in %.2f s", e->what, e->old_size,
             e->n_members, plan && *plan ? plan : "(same plan)", (long long)sn->step, dt);
    if (e->rank == 0) pdde_log(PDDE_LOG_INFO, "%s\n", e->line);
    e->changing = 0, e->joined = 0;
    e->stats.changes++, e->stats.last_recover_s = dt;
    return PDDE_OK;
}

#else /* no comm/: the calls link and say so */

pdde_status pdde_elastic_init(pdde_context *ctx, const pdde_elastic_params *params, pdde_elastic **out) {
    (void)params;
    if (out) *out = NULL;
    return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "pdde_elastic_init: pdde was built without communication (comm/ needs UCX)");
}
void pdde_elastic_free(pdde_elastic *e) { (void)e; }
pdde_comm *pdde_elastic_world(const pdde_elastic *e) { (void)e; return NULL; }
int pdde_elastic_generation(const pdde_elastic *e) { (void)e; return -1; }
const char *pdde_elastic_last_change(const pdde_elastic *e) { (void)e; return ""; }
pdde_status pdde_elastic_stats_get(const pdde_elastic *e, pdde_elastic_stats *out) {
    (void)e, (void)out;
    return PDDE_ERR_UNAVAILABLE;
}
pdde_status pdde_store_etcd_connect(pdde_context *ctx, const char *endpoint, double timeout_s, pdde_store **out) {
    (void)endpoint, (void)timeout_s;
    if (out) *out = NULL;
    return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "etcd: pdde was built without communication (comm/ needs UCX)");
}
pdde_status pdde_store_etcd_set_leased(pdde_store *s, const char *key, const void *val, size_t len) {
    (void)s, (void)key, (void)val, (void)len;
    return pdde_error(NULL, PDDE_ERR_UNAVAILABLE, "etcd: pdde was built without communication (comm/ needs UCX)");
}
pdde_status pdde_elastic_step_begin(pdde_elastic *e, pdde_session *s, uint64_t user, int *change) {
    (void)e, (void)s, (void)user, (void)change;
    return PDDE_ERR_UNAVAILABLE;
}
pdde_status pdde_elastic_step_end(pdde_elastic *e, pdde_session *s, pdde_status run_status) {
    (void)e, (void)s;
    return run_status;
}
pdde_status pdde_elastic_recover(pdde_elastic *e, pdde_elastic_change *out) {
    (void)e, (void)out;
    return PDDE_ERR_UNAVAILABLE;
}
pdde_status pdde_elastic_request_leave(pdde_elastic *e, int sig) {
    (void)e, (void)sig;
    return PDDE_ERR_UNAVAILABLE;
}
pdde_status pdde_elastic_stop_reason(const pdde_elastic *e, int *sig, int *below_min) {
    (void)e, (void)sig, (void)below_min;
    return PDDE_ERR_UNAVAILABLE;
}
pdde_status pdde_elastic_restore(pdde_elastic *e, pdde_session *s, const char *plan, uint64_t *user) {
    (void)e, (void)s, (void)plan, (void)user;
    return PDDE_ERR_UNAVAILABLE;
}

#endif
