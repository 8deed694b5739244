/* comm/comm.c — the top of comm/: making worlds (store, secret, transport connections to every peer)
 * and sub-communicators, freeing them, abort. The single file pdde.c includes; it includes the other
 * parts of comm/ in layer order, each calling only the ones included before it.
 *
 * Failure detection has three paths, so a dead peer becomes an error on every rank, never a hang:
 *  1. UCX endpoints in PEER error mode fail the requests towards a dead peer (connection reset, or
 *     keepalive for shared memory);
 *  2. each rank registers a death notice with the store (<prefix>/failed), which the store sets when
 *     the rank's connection drops or its lease expires; the service thread of every rank with an
 *     operation running polls that key, and publishes there any failure it finds itself;
 *  3. every blocking wait has a timeout. */

#ifndef PDDE_COMM_COMM_C
#define PDDE_COMM_COMM_C

/* The parts in layer order: each uses only those above it in this list. */
#include "util.c"          /* clocks, byte packing, addresses, socket reads/writes */
#include "auth.c"          /* SHA-256, HMAC, the job secret */
#include "store.c"         /* the bootstrap store: server and client */
#include "etcd.c"          /* etcd as a store (membership of elastic jobs) */
#include "env.c"           /* launcher environments */
#include "transport_ucx.c" /* the transport */
#include "world.c"         /* the world's state, failures and their root cause */
#include "buffer.c"        /* registered buffers: memory the host's ranks read directly */
#include "schedule.c"      /* operations as programs of steps, run non-blocking */
#include "progress.c"      /* waiting, starting and finishing operations; the service thread */
#include "shm.c"           /* the one-host shared-memory channel */
#include "collectives.c"   /* algorithms and the public collective calls */

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>

/* ================================================================================================
 * World setup and teardown */

static void world_destroy(comm_world *w) {
    if (!w) return;
    if (w->thread_started) {
        pthread_mutex_lock(&w->lock);
        w->stop = 1;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->lock);
        pthread_join(w->thread, NULL);
    }
    if (w->failed && !w->published && w->store) {
        /* the service thread had no time to tell the others: do it now */
        char key[256], msg[sizeof w->fail_msg + 16];
        world_failed_key(w, key, sizeof key);
        snprintf(msg, sizeof msg, "%d|%s", (int)w->failed, w->fail_msg);
        w->store->iface->compare_set(w->store->impl, NULL, key, "", 0, msg, strlen(msg), NULL);
    }
    pthread_mutex_lock(&w->lock);
    while (w->active) req_finish(w->active, PDDE_ERR_ABORTED);
    pthread_mutex_unlock(&w->lock);
    if (w->tr) {
        if (w->failed && w->tp->abort) w->tp->abort(w->tr);
        for (int i = 0; i < w->size; i++) {
            if (w->send && w->send[i]) w->tp->close_send(w->send[i]);
            if (w->recv && w->recv[i]) w->tp->close_recv(w->recv[i]);
        }
        if (w->listen) w->tp->close_listen(w->listen);
        w->tp->fini(w->tr);
    }
    if (w->store) {
        if (!w->own_store && w->store->iface->set_liveness) /* a clean exit is no death: withdraw the notice */
            w->store->iface->set_liveness(w->store->impl, NULL, "", "", 0, 0);
        if (w->own_store) pdde_store_close(w->store);
    }
    if (w->secret_file) comm_launch_secret_done(&w->launch);
    if (w->server) {
        /* rank 0 hosts the store: keep it up until the others are gone (bounded) */
        double deadline = comm_now() + 10;
        while (atomic_load(&w->server->n_live) > 0 && comm_now() < deadline) comm_sleep(0.01);
        pdde_store_server_free(w->server);
    }
    pdde_comm_request *spare = atomic_exchange(&w->spare, NULL);
    if (spare) req_free_mem(spare);
    free(w->send); free(w->recv); free(w->host_of); free(w->host_names);
    pthread_mutex_destroy(&w->lock);
    pthread_mutex_destroy(&w->store_lock);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* Computes the comm's host structure from the world's host ids. */
static pdde_status comm_topology(pdde_comm *c) {
    comm_world *w = c->w;
    int n = c->size, me_host = w->host_of[c->ranks[c->rank]];
    int *hosts = calloc((size_t)w->size, sizeof *hosts), *count = calloc((size_t)w->size, sizeof *count);
    c->local_group = malloc((size_t)n * sizeof(int));
    c->cross_group = malloc((size_t)n * sizeof(int));
    if (!hosts || !count || !c->local_group || !c->cross_group) {
        free(hosts); free(count);
        return pdde_error(w->ctx, PDDE_ERR_OOM, "comm: out of memory");
    }
    /* host index of each world host, in order of first appearance in this comm (1-based; 0 = unseen) */
    c->n_hosts = 0;
    for (int i = 0; i < n; i++) {
        int h = w->host_of[c->ranks[i]];
        if (!hosts[h]) hosts[h] = ++c->n_hosts;
        count[hosts[h] - 1]++;
    }
    c->local_equal = 1;
    for (int h = 1; h < c->n_hosts; h++) c->local_equal &= count[h] == count[0];
    c->local_n = 0;
    for (int i = 0; i < n; i++)
        if (w->host_of[c->ranks[i]] == me_host) {
            if (i == c->rank) c->local_me = c->local_n;
            c->local_group[c->local_n++] = c->ranks[i];
        }
    /* cross group: the local_me-th rank of each host, hosts in order */
    c->cross_n = 0;
    if (c->local_equal) {
        int *seen = count; /* reuse: ranks seen so far per host */
        memset(seen, 0, (size_t)w->size * sizeof *seen);
        for (int i = 0; i < n; i++) {
            int hi = hosts[w->host_of[c->ranks[i]]] - 1;
            if (seen[hi]++ == c->local_me) {
                if (i == c->rank) c->cross_me = c->cross_n;
                c->cross_group[c->cross_n++] = c->ranks[i];
            }
        }
    }
    free(hosts); free(count);
    return PDDE_OK;
}

/* serial: unique among the world's communicators (0 for the world itself) */
static pdde_status comm_new(comm_world *w, int rank, int size, int *ranks, int id, int64_t serial, pdde_comm_algo algo,
                            pdde_comm **out) {
    pdde_comm *c = calloc(1, sizeof *c);
    if (!c) { free(ranks); return pdde_error(w->ctx, PDDE_ERR_OOM, "comm: out of memory"); }
    c->w = w; c->rank = rank; c->size = size; c->ranks = ranks; c->id = id; c->algo = algo;
    c->last_algo = "none";
    comm_shm *s = NULL;
    pdde_status st = comm_topology(c);
    if (!st) st = comm_shm_map(c, serial, &s);
    if (!st && s) {
        /* everybody must have the segment, or nobody uses it: agree over the transport (c->shm is
         * still NULL) */
        int32_t ok = s->base != NULL, all = 0;
        st = pdde_comm_allreduce(c, &ok, &all, 1, PDDE_I32, PDDE_REDUCE_MIN);
        comm_shm_unlink(s); /* everyone has mapped it by now */
        if (!st && all) c->shm = s;
        else comm_shm_detach(s);
        if (st == PDDE_ERR_TIMEOUT) st = pdde_error(w->ctx, st, "comm: shared-memory setup timed out");
    }
    if (st) { free(c->local_group); free(c->cross_group); free(c->ranks); free(c); return st; }
    pthread_mutex_lock(&w->lock);
    w->refs++;
    pthread_mutex_unlock(&w->lock);
    *out = c;
    return PDDE_OK;
}

static pdde_comm_algo comm_algo_from_env(pdde_comm_algo given) {
    static const char *const words[] = {"auto", "ring", "recursive", "two_level"};
    static const pdde_comm_algo algos[] = {PDDE_ALGO_AUTO, PDDE_ALGO_RING, PDDE_ALGO_RECURSIVE, PDDE_ALGO_TWO_LEVEL};
    return given ? given : algos[pdde_env_choice("PDDE_COMM_ALGO", words, 4, 0)];
}

/* A death notice of the world forming (a rank that died or went silent after registering its notice):
 * PDDE_ERR_PEER_LOST with its message, else PDDE_OK. Reading it also renews this rank's lease. */
static pdde_status world_forming_check(comm_world *w) {
    char key[256];
    void *v = NULL;
    size_t len;
    world_failed_key(w, key, sizeof key);
    pdde_status st = w->store->iface->get(w->store->impl, NULL, key, &v, &len);
    if (st) { free(v); return st == PDDE_ERR_NOT_FOUND ? PDDE_OK : st; }
    char *bar = strchr(v, '|');
    st = pdde_error(w->ctx, PDDE_ERR_PEER_LOST, "comm: while the world formed: %s", bar ? bar + 1 : (char *)v);
    free(v);
    return st;
}

/* Publishes this rank's listen handle and host id, then connects to and accepts from every peer. */
static pdde_status world_connect(comm_world *w, const char *host_id, double deadline) {
    double waited_from = comm_now();
    pdde_context *ctx = w->ctx;
    int n = w->size;
    unsigned char handle[PDDE_TRANSPORT_HANDLE_MAX + 256];
    size_t hlen = 0;
    pdde_status st = w->tp->listen(w->tr, handle + 4, &hlen, &w->listen);
    if (st) return pdde_error(ctx, st, "comm: transport %s cannot listen", w->tp->name);
    put_u32(handle, (uint32_t)hlen);
    size_t idlen = strlen(host_id) + 1;
    memcpy(handle + 4 + hlen, host_id, idlen);
    char key[300];
    snprintf(key, sizeof key, "%s/addr/%d", w->prefix, w->rank);
    if ((st = pdde_store_set(w->store, key, handle, 4 + hlen + idlen))) return st;

    w->send = calloc((size_t)n, sizeof *w->send);
    w->recv = calloc((size_t)n, sizeof *w->recv);
    w->host_of = calloc((size_t)n, sizeof *w->host_of);
    w->host_names = calloc((size_t)n, sizeof *w->host_names);
    unsigned char **handles = calloc((size_t)n, sizeof *handles);
    size_t *hlens = calloc((size_t)n, sizeof *hlens);
    void **pending = calloc((size_t)n, sizeof *pending);      /* accepted, not yet identified */
    void **ident_req = calloc((size_t)n, sizeof *ident_req);
    int32_t *ident = calloc((size_t)n, sizeof *ident), me = w->rank;
    void **send_ident = calloc((size_t)n, sizeof *send_ident);
    if (!w->send || !w->recv || !w->host_of || !w->host_names || !handles || !hlens || !pending || !ident_req ||
        !ident || !send_ident) {
        st = pdde_error(ctx, PDDE_ERR_OOM, "comm: out of memory");
        goto done;
    }
    int n_hosts = 0;
    for (int p = 0; p < n && !st; p++) {
        snprintf(key, sizeof key, "%s/addr/%d", w->prefix, p);
        /* in slices, watching the world's death notices: a rank lost while the world forms fails it now */
        for (;;) {
            double left = deadline - comm_now();
            st = pdde_store_wait(w->store, key, left < 0 ? 0 : left < 0.1 ? left : 0.1);
            if (st != PDDE_ERR_TIMEOUT || left <= 0.1 || (st = world_forming_check(w))) break;
        }
        if (st == PDDE_ERR_TIMEOUT) {
            st = pdde_error(ctx, st, "comm: rank %d did not publish its address (store key '%s') within the init timeout (%.3g s waited; a rank not "
                            "started, or refused by the store: another job secret?)", p, key, comm_now() - waited_from);
            break;
        }
        if (st) break;
        void *v; size_t len;
        if ((st = pdde_store_get(w->store, key, &v, &len))) break;
        uint32_t hl = len >= 4 ? get_u32(v) : 0;
        if (len < 4 || hl > len - 4 || hl > PDDE_TRANSPORT_HANDLE_MAX) {
            free(v);
            st = pdde_error(ctx, PDDE_ERR_COMM, "comm: rank %d published a malformed address", p);
            break;
        }
        handles[p] = v; hlens[p] = hl;
        snprintf(w->host_names[p], sizeof w->host_names[p], "%s", (char *)v + 4 + hl);
        int h = 0;
        while (h < p && strcmp(w->host_names[h], w->host_names[p])) h++;
        w->host_of[p] = h < p ? w->host_of[h] : n_hosts++;
    }
    /* every pair gets a connection each way; a 4-byte hello on the new connection names the sender */
    int todo_send = n - 1, todo_recv = n - 1;
    double idle_since = comm_now(), last_check = comm_now();
    while (!st && (todo_send || todo_recv)) {
        int moved = 0;
        for (int p = 0; p < n && !st; p++) {
            if (p == me) continue;
            if (!w->send[p] && !send_ident[p]) {
                void *sc = NULL;
                st = w->tp->connect(w->tr, (unsigned char *)handles[p] + 4, hlens[p], &sc);
                if (sc) { w->send[p] = sc; st = w->tp->isend(sc, &me, 4, 0, PDDE_MEM_HOST, &send_ident[p]); moved = 1; }
            }
            if (send_ident[p]) {
                int done = 0;
                st = w->tp->test(send_ident[p], &done, NULL);
                if (done || st) { send_ident[p] = NULL; todo_send--; moved = 1; }
            }
        }
        void *rc = NULL;
        if (!st && todo_recv && !(st = w->tp->accept(w->listen, &rc)) && rc) {
            for (int i = 0; i < n; i++)
                if (!pending[i]) {
                    pending[i] = rc;
                    st = w->tp->irecv(rc, &ident[i], 4, 0, PDDE_MEM_HOST, &ident_req[i]);
                    break;
                }
            moved = 1;
        }
        for (int i = 0; i < n && !st; i++) {
            if (!ident_req[i]) continue;
            int done = 0;
            size_t got = 0;
            st = w->tp->test(ident_req[i], &done, &got);
            if (!done) continue;
            ident_req[i] = NULL;
            moved = 1;
            if (got != 4 || ident[i] < 0 || ident[i] >= n || ident[i] == me || w->recv[ident[i]]) {
                st = pdde_error(ctx, PDDE_ERR_COMM, "comm: bad hello from a peer (rank %d)", ident[i]);
                break;
            }
            w->recv[ident[i]] = pending[i];
            pending[i] = NULL;
            todo_recv--;
        }
        if (st) { st = pdde_error(ctx, st, "comm: rank %d: connecting to its peers failed (%s)", me, pdde_status_str(st)); break; }
        w->tp->progress(w->tr);
        double now = comm_now();
        if (moved) idle_since = now;
        if (now - last_check > 0.1 && (last_check = now, st = world_forming_check(w))) break;
        if (now > deadline) {
            st = pdde_error(ctx, PDDE_ERR_TIMEOUT, "comm: rank %d: %d outgoing and %d incoming connections not up "
                            "within the init timeout", me, todo_send, todo_recv);
            break;
        }
        comm_backoff(now - idle_since, deadline - now, w->spin_s);
    }
done:
    for (int i = 0; i < n; i++) {
        if (handles) free(handles[i]);
        if (ident_req && ident_req[i]) w->tp->cancel(w->tr, ident_req[i]);
        if (send_ident && send_ident[i]) w->tp->cancel(w->tr, send_ident[i]);
        if (pending && pending[i]) w->tp->close_recv(pending[i]);
    }
    free(handles); free(hlens); free(pending); free(ident_req); free(ident); free(send_ident);
    return st;
}

pdde_status pdde_comm_init(pdde_context *ctx, const pdde_comm_params *params, pdde_comm **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_comm_init: out is NULL");
    *out = NULL;
    pdde_comm_params p = PDDE_COMM_PARAMS_INIT;
    if (params) p = *params;
    if (p.mem_kind != PDDE_MEM_HOST)
        return pdde_error(ctx, PDDE_ERR_UNSUPPORTED, "comm: only host buffers are supported for now");
    /* (a job's processes take it from their launcher; it bounds the operations, forming the world keeps its own:
     * a node started late is not an error, PDDE_COMM_INIT_TIMEOUT bounds that wait) */
    if (p.timeout_s <= 0 && pdde_env_double("PDDE_COMM_TIMEOUT", 300, 1e-3, 86400, &p.timeout_s) && p.init_timeout_s <= 0)
        p.init_timeout_s = 300;
    double init_env;
    if ((!params || params->init_timeout_s <= 0) && pdde_env_double("PDDE_COMM_INIT_TIMEOUT", 0, 1e-3, 86400, &init_env)) p.init_timeout_s = init_env;
    pdde_comm_env env = {0};
    pdde_status st;
    if (p.world_size > 0) {
        if (p.rank < 0 || p.rank >= p.world_size)
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "comm: rank %d is not in [0, %d)", p.rank, p.world_size);
        env.rank = p.rank; env.world_size = p.world_size; env.launcher = "params";
        const char *a = getenv("PDDE_STORE_ADDR");
        if (a) snprintf(env.store_addr, sizeof env.store_addr, "%s", a);
    } else if ((st = pdde_comm_env_read(ctx, &env))) {
        return st;
    }
    comm_launch launch = {0};
    if (!p.store && !env.store_addr[0]) {
        if (!strcmp(env.launcher, "pdde-run") || !strcmp(env.launcher, "params"))
            return pdde_error(ctx, PDDE_ERR_ENV, "PDDE_STORE_ADDR is not set (host:port of the bootstrap store; "
                                                 "pdde-run sets it, other launchers need it exported)");
        if ((st = comm_launch_addr(ctx, &env, &launch))) return st;
        snprintf(env.store_addr, sizeof env.store_addr, "%.255s", launch.connect);
    }
    comm_world *w = calloc(1, sizeof *w);
    if (!w) return pdde_error(ctx, PDDE_ERR_OOM, "comm: out of memory");
    w->ctx = ctx;
    w->rank = env.rank;
    w->size = env.world_size;
    w->timeout_s = p.timeout_s > 0 ? p.timeout_s : 300;
    w->peer_timeout_s = p.peer_timeout_s > 0 ? p.peer_timeout_s : 5;
    w->no_progress_thread = p.no_progress_thread;
    w->mem_kind = p.mem_kind;
    w->tp = p.transport ? p.transport : pdde_transport_ucx();
    pthread_mutex_init(&w->lock, NULL);
    pthread_mutex_init(&w->store_lock, NULL);
    pthread_cond_init(&w->cv, NULL);
    /* forming the world has its own bound (a short operation timeout need not fit a loaded machine's
     * start-up): the world's waits read w->timeout_s, so it holds the init bound until the world is made */
    double op_timeout_s = w->timeout_s;
    if (p.init_timeout_s > 0) w->timeout_s = p.init_timeout_s;
    double deadline = comm_now() + w->timeout_s;
    char host_id[COMM_HOST_ID_MAX], key[300];
    comm_host_id(p.host_id, host_id, sizeof host_id);

    /* the job secret: the environment's (or this process's); under mpirun/srun without one, the
     * launcher's (env.c) */
    comm_secret secret = {0};
    st = comm_secret_lookup(ctx, &secret);
    w->launch = launch;
    if (st == PDDE_ERR_NOT_FOUND && !p.store && strcmp(env.launcher, "pdde-run") && strcmp(env.launcher, "params")) {
        if (!launch.job_id[0]) comm_launch_addr(ctx, &env, &w->launch); /* only the job id is needed */
        if (!w->launch.job_id[0]) snprintf(w->launch.job_id, sizeof w->launch.job_id, "%.20s-%.100s", env.launcher, env.store_addr);
        st = comm_launch_secret(ctx, &env, &w->launch, w->timeout_s, &secret, &w->secret_file);
    } else if (st == PDDE_ERR_NOT_FOUND && !p.store) {
        st = pdde_error(ctx, PDDE_ERR_ENV, "no job secret: set PDDE_JOB_SECRET or PDDE_JOB_SECRET_FILE (pdde-run sets "
                        "it for its ranks)");
    } else if (st == PDDE_ERR_NOT_FOUND) {
        st = PDDE_OK; /* a store of the caller's and no secret anywhere: the transport checks an empty key */
    }
    if (st) goto fail;
    if (p.store) {
        w->store = p.store;
    } else {
        /* launchers other than pdde-run host no store: rank 0 does, on the address everyone was given */
        if (w->rank == 0 && strcmp(env.launcher, "pdde-run")) {
            pdde_store_server_params sp = PDDE_STORE_SERVER_PARAMS_INIT;
            sp.addr = launch.bind[0] ? launch.bind : env.store_addr;
            sp.secret = secret.text;
            if ((st = pdde_store_server_init_params(ctx, &sp, &w->server))) {
                if (launch.bind[0])
                    st = pdde_error(ctx, st, "%s (the port comes from the job id: set PDDE_STORE_PORT or PDDE_STORE_ADDR "
                                    "to choose another)", pdde_last_error(ctx));
                goto fail;
            }
        }
        if ((st = pdde_store_connect_secret(ctx, env.store_addr, secret.text, w->timeout_s, &w->store))) goto fail;
        w->own_store = 1;
    }
    if (w->tp->api_version != PDDE_TRANSPORT_API_VERSION || w->tp->struct_size < sizeof *w->tp) {
        st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "comm: transport %s has interface version %u, want %u", w->tp->name,
                        w->tp->api_version, PDDE_TRANSPORT_API_VERSION);
        goto fail;
    }
    pdde_transport_params tp = {w->peer_timeout_s, secret.len ? secret.text : NULL};
    if ((st = w->tp->init(ctx, &tp, &w->tr))) goto fail;
    /* each init is a new generation of keys, so a job may init again (after a failure) with one store */
    int64_t gen;
    snprintf(key, sizeof key, "%s/generation/%d", p.prefix ? p.prefix : "pdde", w->rank);
    if ((st = pdde_store_add(w->store, key, 1, &gen))) goto fail;
    snprintf(w->prefix, sizeof w->prefix, "%s/%lld", p.prefix ? p.prefix : "pdde", (long long)gen);
    /* the death notice from here on: a rank lost while the world forms fails the others' init at once
     * (world_connect watches the notices; its store calls renew this rank's lease meanwhile) */
    {
        char notice[COMM_HOST_ID_MAX + 128];
        snprintf(notice, sizeof notice, "%d|rank %d (pid %d on %s) died or lost its connection to the store",
                 PDDE_ERR_PEER_LOST, w->rank, (int)getpid(), host_id);
        world_failed_key(w, key, sizeof key);
        /* The lease ends short of peer_timeout_s by what noticing its end takes (the server's 0.1 s
         * poll, this thread's 0.05 s one): a frozen peer is reported within peer_timeout_s as documented
         * (with the whole of it as lease, test_comm_fail measured 1.50-1.65 s for 1.5). Pings every
         * peer_timeout_s/4 still renew it at least three times. */
        double margin = w->peer_timeout_s / 4 < 0.25 ? w->peer_timeout_s / 4 : 0.25;
        st = pdde_store_set_liveness(w->store, key, notice, strlen(notice), w->peer_timeout_s - margin);
        if (st && st != PDDE_ERR_UNSUPPORTED) goto fail;
    }
    if ((st = world_connect(w, host_id, deadline))) goto fail;
    if (w->secret_file) { comm_launch_secret_done(&w->launch); w->secret_file = 0; } /* everyone has read it */
    int here = 0;
    for (int i = 0; i < w->size; i++) here += w->host_of[i] == w->host_of[w->rank];
    /* spinning pays when every local rank has a core to itself (the service threads sleep): with 2
     * ranks on 2 cores a yield or a sleep per message costs microseconds to milliseconds */
    w->spin_s = here <= sysconf(_SC_NPROCESSORS_ONLN) ? COMM_SPIN_S : 0;
    if (pthread_create(&w->thread, NULL, comm_service, w)) {
        st = pdde_error(ctx, PDDE_ERR_OOM, "comm: cannot start the service thread");
        goto fail;
    }
    w->thread_started = 1;
    int *ranks = malloc((size_t)w->size * sizeof *ranks);
    if (!ranks) { st = pdde_error(ctx, PDDE_ERR_OOM, "comm: out of memory"); goto fail; }
    for (int i = 0; i < w->size; i++) ranks[i] = i;
    if ((st = comm_new(w, w->rank, w->size, ranks, COMM_WORLD_ID, 0, comm_algo_from_env(p.algo), out))) goto fail;
    w->timeout_s = op_timeout_s;
    return PDDE_OK;
fail:
    world_destroy(w);
    return st;
}

void pdde_comm_free(pdde_comm *c) {
    if (!c) return;
    if (c->a2a) { /* the sub-communicators first: they hold references to the world */
        pdde_comm_free(c->a2a->local_comm), pdde_comm_free(c->a2a->cross_comm);
        free(c->a2a->host_idx), free(c->a2a->local_idx), free(c->a2a->rank_at), free(c->a2a);
    }
    comm_world *w = c->w;
    pthread_mutex_lock(&w->lock);
    for (pdde_comm_request *r = w->active, *next; r; r = next) {
        next = r->next;
        if (r->comm == c) req_finish(r, PDDE_ERR_ABORTED);
    }
    int last = --w->refs == 0;
    pthread_mutex_unlock(&w->lock);
    comm_shm_detach(c->shm);
    free(c->ranks); free(c->local_group); free(c->cross_group);
    free(c);
    if (last) world_destroy(w);
}

int pdde_comm_rank(const pdde_comm *c) { return c ? c->rank : -1; }
int pdde_comm_size(const pdde_comm *c) { return c ? c->size : 0; }
int pdde_comm_host_count(const pdde_comm *c) { return c ? c->n_hosts : 0; }
pdde_context *pdde_comm_context(const pdde_comm *c) { return c ? c->w->ctx : NULL; }
void pdde_comm_set_algo(pdde_comm *c, pdde_comm_algo algo) { if (c) c->algo = algo; }
const char *pdde_comm_last_algo(const pdde_comm *c) { return c ? c->last_algo : ""; }

void pdde_comm_abort(pdde_comm *c) {
    if (!c) return;
    comm_world *w = c->w;
    pthread_mutex_lock(&w->lock);
    comm_fail(w, PDDE_ERR_ABORTED, "rank %d aborted the communicator", w->rank);
    while (w->active) req_finish(w->active, w->failed);
    pthread_mutex_unlock(&w->lock);
}

pdde_status pdde_comm_status(pdde_comm *c) {
    if (!c) return PDDE_ERR_INVALID_ARG;
    return comm_report(c->w, c->w->failed);
}

pdde_status pdde_comm_split(pdde_comm *c, int color, int key, pdde_comm **out) {
    if (!c || !out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    comm_world *w = c->w;
    int n = c->size;
    int32_t mine[2] = {color < 0 ? -1 : color, key}, *all = malloc((size_t)n * 2 * sizeof *all);
    int *ranks = malloc((size_t)n * sizeof *ranks);
    if (!all || !ranks) { free(all); free(ranks); return pdde_error(w->ctx, PDDE_ERR_OOM, "comm: out of memory"); }
    pdde_status st = pdde_comm_allgather(c, mine, all, 2, PDDE_I32);
    /* colors in increasing order get consecutive ids from a counter in the store */
    int ncolors = 0, color_index = 0;
    for (int i = 0; i < n && !st; i++) {
        int first = all[2 * i] >= 0;
        for (int j = 0; j < i && first; j++) first = all[2 * j] != all[2 * i];
        if (!first) continue;
        ncolors++;
        if (all[2 * i] < mine[0]) color_index++;
    }
    int64_t base = 0;
    if (!st && c->rank == 0) {
        char k[300];
        snprintf(k, sizeof k, "%s/comm_ids", w->prefix);
        pthread_mutex_lock(&w->store_lock);
        st = pdde_store_add(w->store, k, ncolors, &base);
        pthread_mutex_unlock(&w->store_lock);
        base -= ncolors;
    }
    pdde_status st2 = pdde_comm_broadcast(c, &base, 1, PDDE_I64, 0); /* all ranks take part, even after an error */
    if (!st) st = st2;
    int size = 0, rank = 0;
    if (!st && mine[0] >= 0) {
        /* members ordered by (key, parent rank): insertion sort, n is small */
        for (int i = 0; i < n; i++) {
            if (all[2 * i] != mine[0]) continue;
            int j = size++;
            while (j > 0 && all[2 * ranks[j - 1] + 1] > all[2 * i + 1]) { ranks[j] = ranks[j - 1]; j--; }
            ranks[j] = i;
        }
        for (int i = 0; i < size; i++) {
            if (ranks[i] == c->rank) rank = i;
            ranks[i] = c->ranks[ranks[i]];
        }
    }
    free(all);
    if (st || mine[0] < 0) { free(ranks); return st; }
    int id = 2 + (int)((base + color_index) % ((1 << COMM_ID_BITS) - 2));
    return comm_new(w, rank, size, ranks, id, 1 + base + color_index, c->algo, out);
}

#endif /* PDDE_COMM_COMM_C */
