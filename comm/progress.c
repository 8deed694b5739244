/* comm/progress.c — waiting for operations (the caller's thread progresses its own), starting and
 * finishing them, and the world's service thread (background progress, heartbeats to the store,
 * failure publication and polling). Above schedule.c, whose programs it drives. */

#ifndef PDDE_COMM_PROGRESS_C
#define PDDE_COMM_PROGRESS_C

#include "util.c"
#include "../backends/deadline.h"
#include "world.c"
#include "schedule.c"

/* ================================================================================================
 * Waiting */

/* Waits for r with the world lock held (released while backing off), progressing the transport
 * itself: the caller's thread drives its own operation, no hand-off to the service thread. */
static pdde_status req_wait_locked(pdde_comm_request *r, double timeout_s) {
    comm_world *w = r->w;
    double start = comm_now(), deadline = start + timeout_s, idle_since = start;
    w->waiters++;
    for (;;) {
        if (!r->done && world_progress(w)) idle_since = comm_now();
        if (r->done) break;
        double now = comm_now();
        if (now >= deadline) break;
        pthread_mutex_unlock(&w->lock);
        comm_backoff(now - idle_since, deadline - now, w->spin_s);
        pthread_mutex_lock(&w->lock);
    }
    w->waiters--;
    return r->done ? r->status : PDDE_ERR_TIMEOUT;
}

static pdde_status req_wait(pdde_comm_request *r, double timeout_s) {
    pthread_mutex_lock(&r->w->lock);
    pdde_status st = req_wait_locked(r, timeout_s);
    pthread_mutex_unlock(&r->w->lock);
    return st;
}

/* What a timeout names: "send to rank 1 (tag 7)", or "allgather over ranks 0 2". */
static const char *req_describe(const pdde_comm_request *r, char *buf, size_t n) {
    if (r->peer >= 0) {
        snprintf(buf, n, "%s %s rank %d (tag %d)", r->kind, strcmp(r->kind, "send") ? "from" : "to", r->peer, r->tag);
        return buf;
    }
    size_t k = (size_t)snprintf(buf, n, "%s over ranks", r->kind ? r->kind : "collective");
    int shown = r->comm->size < 8 ? r->comm->size : 8;
    for (int i = 0; i < shown && k < n; i++) k += (size_t)snprintf(buf + k, n - k, " %d", r->comm->ranks[i]);
    if (shown < r->comm->size && k < n) snprintf(buf + k, n - k, " .. (%d ranks)", r->comm->size);
    return buf;
}

/* Starts a built operation: links it to the world and posts its first steps. */
static pdde_status comm_start(pdde_comm *c, pdde_comm_request *r, const char *algo, pdde_comm_request **out) {
    comm_world *w = c->w;
    *out = NULL;
    if (!r->kind) r->kind = algo ? algo : c->last_algo;
    if (algo) {
        c->last_algo = algo;
        r->tagbase = (uint64_t)c->id << 28 | (uint64_t)(c->seq++ & 0xfff) << 16;
    }
    pthread_mutex_lock(&w->lock);
    pdde_status st = w->failed;
    if (!st) {
        r->next = w->active;
        if (w->active) w->active->prev = r;
        w->active = r;
        w->started++;
        req_advance(r);
        /* The service thread progresses non-blocking operations in the background, so it is woken
         * for them. A blocking caller progresses its operation itself; the service thread needs a
         * wake-up only to start polling the failure key, and waking it on every operation costs a
         * futex call and a context switch (microseconds, and a core taken from a spinning rank). */
        if (!comm_blocking_call || !w->watching) pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->lock);
    if (st) { req_release(r); return comm_report(w, st); }
    *out = r;
    return PDDE_OK;
}

/* The blocking form of every operation: wait with the communicator's timeout; a timeout poisons the
 * world (the peers are out of step, nothing sensible can follow). */
static pdde_status comm_finish(pdde_comm *c, pdde_status st, pdde_comm_request *r) {
    comm_blocking_call = 0;
    if (st) return st;
    comm_world *w = c->w;
    pthread_mutex_lock(&w->lock); /* one lock hold for the wait and the release */
    st = req_wait_locked(r, w->timeout_s);
    if (st == PDDE_ERR_TIMEOUT) {
        char what[96];
        comm_fail(w, PDDE_ERR_TIMEOUT, "rank %d: a %s did not finish within %.3g s", w->rank, req_describe(r, what, sizeof what),
                  w->timeout_s);
        world_progress(w);
    }
    char msg[sizeof r->msg];
    snprintf(msg, sizeof msg, "%s", r->done ? r->msg : "");
    if (r->done) req_release(r);
    else r->detached = 1;
    pthread_mutex_unlock(&w->lock);
    if (st && *msg && !w->failed) return pdde_error(w->ctx, st, "%s", msg); /* an error of this operation alone */
    return comm_report(w, st);
}

pdde_status pdde_comm_test(pdde_comm_request *r, int *done) {
    if (!r || !done) return PDDE_ERR_INVALID_ARG;
    pthread_mutex_lock(&r->w->lock);
    if (!r->done) world_progress(r->w);
    *done = r->done;
    pdde_status st = r->done ? r->status : PDDE_OK;
    pthread_mutex_unlock(&r->w->lock);
    if (st && r->msg[0] && !r->w->failed) return pdde_error(r->w->ctx, st, "%s", r->msg);
    return comm_report(r->w, st);
}

pdde_status pdde_comm_wait(pdde_comm_request *r, double timeout_s) {
    if (!r) return PDDE_ERR_INVALID_ARG;
    pdde_status st = req_wait(r, timeout_s < 0 ? r->w->timeout_s : timeout_s);
    char what[96];
    if (st == PDDE_ERR_TIMEOUT)
        return pdde_error(r->w->ctx, st, "comm: rank %d: a %s did not finish within %.3g s (still pending)", r->w->rank,
                          req_describe(r, what, sizeof what), timeout_s < 0 ? r->w->timeout_s : timeout_s);
    if (st && r->msg[0] && !r->w->failed) return pdde_error(r->w->ctx, st, "%s", r->msg);
    return comm_report(r->w, st);
}

void pdde_comm_request_free(pdde_comm_request *r) {
    if (!r) return;
    comm_world *w = r->w;
    pthread_mutex_lock(&w->lock);
    if (r->done) req_release(r);
    else r->detached = 1;
    pthread_mutex_unlock(&w->lock);
}

/* ================================================================================================
 * The service thread: heartbeats, failure publication and polling, background progress. */

static void *comm_service(void *arg) {
    comm_world *w = arg;
    const pdde_store_iface *si = w->store->iface;
    double ping_every = w->peer_timeout_s / 4, last_ping = comm_now(), last_check = 0, pause = 20e-6;
    double last_busy = -1e30;
    unsigned long seen = 0;
    char key[256];
    world_failed_key(w, key, sizeof key);
    pthread_mutex_lock(&w->lock);
    while (!w->stop) {
        int active = w->active != NULL;
        /* Operations that started and finished while this thread slept count as activity too: a
         * loop of short blocking operations is rarely caught running. The failure key is polled
         * while operations run or a caller waits in one (the blocking small allreduce is no request:
         * without this a frozen peer held it until the operation timeout) and for ping_every after the
         * last one (comm_start then need not wake this thread for every blocking operation). */
        if (active || w->waiters || w->started != seen) { seen = w->started; last_busy = comm_now(); }
        int watch = comm_now() - last_busy < ping_every;
        if (active && !w->failed && !w->no_progress_thread && !w->waiters && world_progress(w)) pause = 20e-6;
        char msg[sizeof w->fail_msg + 16];
        int publish = w->failed && !w->published;
        if (publish) {
            snprintf(msg, sizeof msg, "%d|%s", (int)w->failed, w->fail_msg);
            w->published = 1;
        }
        pthread_mutex_unlock(&w->lock);

        double now = comm_now();
        pdde_status st = PDDE_OK;
        void *val = NULL; size_t len = 0;
        pthread_mutex_lock(&w->store_lock);
        if (publish) si->compare_set(w->store->impl, NULL, key, "", 0, msg, strlen(msg), NULL); /* the first cause stays */
        if (now - last_ping > ping_every) {
            last_ping = now;
            if (si->ping) st = si->ping(w->store->impl, NULL);
        }
        if (!st && watch && !w->failed && now - last_check > 0.05) {
            last_check = now;
            st = si->get(w->store->impl, NULL, key, &val, &len);
        }
        pthread_mutex_unlock(&w->store_lock);

        pthread_mutex_lock(&w->lock);
        if (st == PDDE_OK && val) {
            char *bar = strchr(val, '|');
            int code = atoi(val);
            w->published = 1; /* it came from the store: no need to write it back */
            comm_fail(w, code < 0 ? code : PDDE_ERR_PEER_LOST, "%s", bar ? bar + 1 : (char *)val);
        } else if (st && st != PDDE_ERR_NOT_FOUND) {
            w->published = 1;
            comm_fail(w, PDDE_ERR_PEER_LOST, "rank %d lost the connection to the store", w->rank);
        }
        free(val);
        if (w->failed && w->active && !w->waiters) world_progress(w);
        if (w->stop) break;
        if (active && !w->waiters) {
            /* background progress of non-blocking operations: poll, backing off to 1 ms */
            pthread_mutex_unlock(&w->lock);
            comm_sleep(pause);
            pause = pause * 2 < 1e-3 ? pause * 2 : 1e-3;
            pthread_mutex_lock(&w->lock);
        } else {
            /* idle, or a caller is waiting and progressing itself: only the store checks remain */
            struct timespec ts = cond_deadline(watch ? 0.05 : ping_every);
            w->watching = watch;
            pthread_cond_timedwait(&w->cv, &w->lock, &ts);
            w->watching = 0;
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

#endif /* PDDE_COMM_PROGRESS_C */
