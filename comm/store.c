/* comm/store.c — the bootstrap key-value store: the generic pdde_store wrapper over a backend vtable,
 * and the built-in TCP backend (a one-thread poll() server and a synchronous client).
 *
 * Wire format (little-endian), one request then one reply per round trip:
 *   request: u32 body_len, u8 op, then three fields: u32 len + bytes (key, a, b)
 *   reply:   u32 body_len, i32 status, u32 len + bytes (the value; an error's message)
 * Authentication: on accept the server sends a reply frame whose value is its nonce and its value
 * limit (or an error: too many connections, no file descriptors); the client answers with AUTH (a =
 * its nonce, b = HMAC(secret, "pdde store client" | server nonce | client nonce)); the server checks it
 * in constant time and answers with its own proof over the nonces the other way round, which the
 * client checks (a port squatter posing as the store learns nothing and is found out). Nothing but
 * AUTH is served before that; a failure is logged and the connection closed.
 *
 * The server never blocks on a client: replies go to a per-client output queue written as the socket
 * takes them; a client with a reply pending is not read (so it cannot pile up replies), and one that
 * takes nothing of it for stall_timeout_s is dropped. Values, memory (keys, values, buffers and queues
 * together), the bytes each client stores and the number of connections are capped; the offending
 * client gets an error naming the limit. When file descriptors run out, a reserve descriptor lets the
 * server accept, tell and close the newcomer instead of spinning on a listen socket it cannot serve.
 *
 * Keys made by SET belong to the client that made them: only it may SET, CAS or REMOVE them; keys
 * made by ADD or CAS are shared counters and flags; death notices belong to the server and nobody may
 * change them. A client that registered a liveness notice and disconnects without BYE (its process
 * died) or stays silent past its lease gets the notice set by the server: that is how peers learn of
 * a death fast. */

#ifndef PDDE_COMM_STORE_C
#define PDDE_COMM_STORE_C

#include "util.c"
#include "auth.c"

#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <pthread.h>

enum {
    STORE_OP_SET = 1, STORE_OP_GET, STORE_OP_ADD, STORE_OP_CAS, STORE_OP_REMOVE,
    STORE_OP_LIVENESS, STORE_OP_PING, STORE_OP_BYE, STORE_OP_AUTH,
};
#define STORE_MAX_KEY 4096
#define STORE_HELLO_BYTES (COMM_NONCE_BYTES + 8)   /* server nonce, u64 max value bytes */
static const char store_client_label[] = "pdde store client", store_server_label[] = "pdde store server";

struct pdde_store {
    const pdde_store_iface *iface;
    void *impl;
    pdde_context *ctx;
};

/* ================================================================================================
 * Generic wrapper */

pdde_status pdde_store_wrap(pdde_context *ctx, const pdde_store_iface *iface, void *impl, pdde_store **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_store_wrap: out is NULL");
    *out = NULL;
    if (!iface || iface->api_version != PDDE_STORE_API_VERSION || iface->struct_size < sizeof *iface ||
        !iface->set || !iface->get || !iface->add || !iface->compare_set || !iface->remove || !iface->close)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_store_wrap: bad store interface (version %u)",
                          iface ? iface->api_version : 0);
    pdde_store *s = calloc(1, sizeof *s);
    if (!s) return pdde_error(ctx, PDDE_ERR_OOM, "pdde_store_wrap: out of memory");
    s->iface = iface; s->impl = impl; s->ctx = ctx;
    *out = s;
    return PDDE_OK;
}

void pdde_store_close(pdde_store *s) {
    if (!s) return;
    s->iface->close(s->impl);
    free(s);
}

#define STORE_CHECK(s, key)                                                                         \
    do {                                                                                            \
        if (!(s)) return PDDE_ERR_INVALID_ARG;                                                      \
        if (!(key) || !*(key)) return pdde_error((s)->ctx, PDDE_ERR_INVALID_ARG, "store: empty key"); \
    } while (0)

pdde_status pdde_store_set(pdde_store *s, const char *key, const void *val, size_t len) {
    STORE_CHECK(s, key);
    return s->iface->set(s->impl, s->ctx, key, val, len);
}
pdde_status pdde_store_get(pdde_store *s, const char *key, void **val, size_t *len) {
    STORE_CHECK(s, key);
    return s->iface->get(s->impl, s->ctx, key, val, len);
}
pdde_status pdde_store_add(pdde_store *s, const char *key, int64_t delta, int64_t *out) {
    STORE_CHECK(s, key);
    return s->iface->add(s->impl, s->ctx, key, delta, out);
}
pdde_status pdde_store_compare_set(pdde_store *s, const char *key, const void *expected, size_t expected_len,
                                   const void *desired, size_t desired_len, int *swapped) {
    STORE_CHECK(s, key);
    return s->iface->compare_set(s->impl, s->ctx, key, expected, expected_len, desired, desired_len, swapped);
}
pdde_status pdde_store_remove(pdde_store *s, const char *key) {
    STORE_CHECK(s, key);
    return s->iface->remove(s->impl, s->ctx, key);
}
pdde_status pdde_store_set_liveness(pdde_store *s, const char *key, const void *val, size_t len, double lease_s) {
    STORE_CHECK(s, key);
    if (!s->iface->set_liveness)
        return pdde_error(s->ctx, PDDE_ERR_UNSUPPORTED, "store %s: no liveness notices", s->iface->name);
    return s->iface->set_liveness(s->impl, s->ctx, key, val, len, lease_s);
}
pdde_status pdde_store_ping(pdde_store *s) {
    if (!s) return PDDE_ERR_INVALID_ARG;
    return s->iface->ping ? s->iface->ping(s->impl, s->ctx) : PDDE_OK;
}

/* Polls get with a growing pause (0.2 ms .. 20 ms) when the backend has no native wait. */
pdde_status pdde_store_wait(pdde_store *s, const char *key, double timeout_s) {
    STORE_CHECK(s, key);
    if (s->iface->wait) return s->iface->wait(s->impl, s->ctx, key, timeout_s);
    double deadline = comm_now() + timeout_s, pause = 2e-4;
    for (;;) {
        void *v = NULL; size_t n;
        pdde_status st = s->iface->get(s->impl, s->ctx, key, &v, &n);
        free(v);
        if (st != PDDE_ERR_NOT_FOUND) return st;
        double left = deadline - comm_now();
        if (left <= 0)
            return pdde_error(s->ctx, PDDE_ERR_TIMEOUT, "store: key '%s' did not appear within %.3g s", key,
                              timeout_s);
        comm_sleep(pause < left ? pause : left);
        pause = pause * 2 < 0.02 ? pause * 2 : 0.02;
    }
}

/* ================================================================================================
 * TCP server */

typedef struct {
    char *key;
    size_t klen;
    char *val;
    size_t len;
    uint64_t owner;          /* the client id that made it with SET; 0 = shared or the server's */
    int locked;              /* a death notice: no client may change it */
} store_kv;

typedef struct {
    int fd;
    uint64_t id;             /* unique per connection, never 0 */
    int authed, closing;     /* closing: drop once the output queue is written */
    double auth_deadline;
    unsigned char nonce[COMM_NONCE_BYTES];
    char peer[64];           /* address:port, for the log */
    unsigned char *in;       /* bytes received, not yet a whole frame */
    size_t in_len, in_cap;
    size_t skip;             /* bytes of a refused (oversized) request still to discard */
    unsigned char *out;      /* replies not yet taken by the socket */
    size_t out_off, out_len, out_cap;
    double out_since;        /* when the socket last took bytes of a pending reply */
    size_t owned;            /* bytes of the keys it made */
    char *live_key, *live_val; /* the death notice, or NULL */
    size_t live_len;
    double lease_s, last_seen;
} store_client;

struct pdde_store_server {
    int listen_fd, port;
    int reserve_fd;          /* spent to accept-and-refuse when descriptors run out */
    int wake[2];             /* a pipe that stops the server thread */
    pthread_t thread;
    comm_secret secret;
    size_t max_value, max_total, max_client;
    int max_clients;
    double auth_timeout_s, stall_timeout_s;
    size_t mem;              /* keys, values, input buffers and output queues */
    uint64_t next_id;
    double accept_paused_until;
    store_kv *kv;            /* few keys (bootstrap only): a linear array is enough */
    int n_kv, cap_kv;
    store_client *clients;
    int n_clients, cap_clients;
    _Atomic int n_live;      /* authenticated clients connected, readable from other threads */
    pthread_mutex_t fail_lock;
    char first_failure[600]; /* the first value of a ".../failed" key, and why the store set it */
    const char *drop_reason; /* set around the store_put of a death notice */
    double log_window;       /* the log is rate-limited: at most 20 lines per 10 s */
    int log_lines, log_dropped;
};

static void store_log(pdde_store_server *srv, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void store_log(pdde_store_server *srv, const char *fmt, ...) {
    double now = comm_now();
    if (now - srv->log_window > 10) {
        if (srv->log_dropped) pdde_log(PDDE_LOG_WARN, "pdde store: (%d more messages suppressed)\n", srv->log_dropped);
        srv->log_window = now;
        srv->log_lines = srv->log_dropped = 0;
    }
    if (srv->log_lines++ >= 20) { srv->log_dropped++; return; }
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pdde_log(PDDE_LOG_WARN, "pdde store (port %d): %s\n", srv->port, msg);
}

static store_kv *store_find(pdde_store_server *srv, const void *key, size_t klen) {
    for (int i = 0; i < srv->n_kv; i++)
        if (srv->kv[i].klen == klen && !memcmp(srv->kv[i].key, key, klen)) return &srv->kv[i];
    return NULL;
}

static void store_account(pdde_store_server *srv, store_client *c, size_t add, size_t sub) {
    srv->mem += add; srv->mem -= sub;
    if (c) { c->owned += add; c->owned -= c->owned < sub ? c->owned : sub; }
}

/* Why a write of len value bytes to e (NULL: a new key) by c would break a limit, or NULL. */
static const char *store_over_limit(pdde_store_server *srv, store_client *c, const store_kv *e, size_t klen, size_t len) {
    size_t old = e ? e->len : 0, grow = len + (e ? 0 : klen);
    if (len > srv->max_value) return "max_value_bytes";
    if (grow > old && srv->mem + grow - old > srv->max_total) return "max_total_bytes";
    if (c && grow > old && c->owned + grow - old > srv->max_client) return "max_client_bytes";
    return NULL;
}

/* Stores val under key; 0 ok, -1 out of memory. */
static int store_put(pdde_store_server *srv, store_client *c, const void *key, size_t klen, const void *val, size_t len,
                     uint64_t owner) {
    char *v = malloc(len + 1);
    if (!v) return -1;
    memcpy(v, val, len); v[len] = 0;
    store_kv *e = store_find(srv, key, klen);
    if (!e) {
        if (srv->n_kv == srv->cap_kv) {
            int cap = srv->cap_kv ? srv->cap_kv * 2 : 64;
            store_kv *kv = realloc(srv->kv, (size_t)cap * sizeof *kv);
            if (!kv) { free(v); return -1; }
            srv->kv = kv; srv->cap_kv = cap;
        }
        e = &srv->kv[srv->n_kv];
        *e = (store_kv){.key = malloc(klen + 1), .klen = klen, .owner = owner};
        if (!e->key) { free(v); return -1; }
        memcpy(e->key, key, klen); e->key[klen] = 0;
        srv->n_kv++;
        store_account(srv, c, klen, 0);
    }
    store_account(srv, c, len, e->len);
    free(e->val);
    e->val = v; e->len = len;
    if (klen >= 7 && !memcmp((const char *)key + klen - 7, "/failed", 7)) {
        const char *bar = memchr(v, '|', len), *text = bar ? bar + 1 : v; /* "status|message" */
        pthread_mutex_lock(&srv->fail_lock);
        if (!srv->first_failure[0])
            snprintf(srv->first_failure, sizeof srv->first_failure, "%.400s%s%s%s", text, srv->drop_reason ? " (" : "",
                     srv->drop_reason ? srv->drop_reason : "", srv->drop_reason ? ")" : "");
        pthread_mutex_unlock(&srv->fail_lock);
    }
    return 0;
}

static void store_remove_at(pdde_store_server *srv, store_client *c, store_kv *e) {
    store_account(srv, c, 0, e->klen + e->len);
    free(e->key); free(e->val);
    *e = srv->kv[--srv->n_kv];
}

/* Appends a reply to c's output queue. A reply that would break the memory limit becomes an error
 * (short, always queued). 0 ok, -1 out of memory. */
static int store_reply(pdde_store_server *srv, store_client *c, int32_t status, const void *val, size_t len) {
    char msg[200];
    if (len > 256 && srv->mem + len > srv->max_total) {
        snprintf(msg, sizeof msg, "store: a reply of %zu bytes would exceed the store's memory limit (%zu of %zu bytes "
                 "in use; max_total_bytes)", len, srv->mem, srv->max_total);
        status = PDDE_ERR_OOM; val = msg; len = strlen(msg);
    }
    size_t need = c->out_len + 12 + len;
    if (c->out_off && need > c->out_cap) { /* reclaim what was sent first */
        memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
        c->out_len -= c->out_off; need -= c->out_off; c->out_off = 0;
    }
    if (need > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < need) cap *= 2;
        unsigned char *o = realloc(c->out, cap);
        if (!o) return -1;
        srv->mem += cap - c->out_cap;
        c->out = o; c->out_cap = cap;
    }
    unsigned char *p = c->out + c->out_len;
    put_u32(p, (uint32_t)(8 + len));
    put_u32(p + 4, (uint32_t)status);
    put_u32(p + 8, (uint32_t)len);
    if (len) memcpy(p + 12, val, len);
    if (c->out_len == c->out_off) c->out_since = comm_now();
    c->out_len += 12 + len;
    return 0;
}

static int store_reply_error(pdde_store_server *srv, store_client *c, int32_t status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
static int store_reply_error(pdde_store_server *srv, store_client *c, int32_t status, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return store_reply(srv, c, status, msg, strlen(msg));
}

/* Writes what the socket takes of c's queue. 0 ok, -1 the connection is gone. */
static int store_flush(pdde_store_server *srv, store_client *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) { c->out_off += (size_t)w; c->out_since = comm_now(); continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return -1;
    }
    c->out_off = c->out_len = 0;
    if (c->out_cap > 65536) { /* a big reply went out: give its memory back */
        free(c->out);
        srv->mem -= c->out_cap;
        c->out = NULL; c->out_cap = 0;
    }
    return 0;
}

/* why: what the store saw, for the first-failure record (NULL: the connection closed) */
static void store_client_drop(pdde_store_server *srv, int i, int clean, const char *why) {
    store_client *c = &srv->clients[i];
    srv->drop_reason = why ? why : "its connection to the store closed: the process died or closed it";
    if (!clean && c->live_key && !store_find(srv, c->live_key, strlen(c->live_key)) &&
        !store_put(srv, NULL, c->live_key, strlen(c->live_key), c->live_val, c->live_len, 0))
        store_find(srv, c->live_key, strlen(c->live_key))->locked = 1;
    srv->drop_reason = NULL;
    close(c->fd);
    srv->mem -= c->in_cap + c->out_cap;
    free(c->in); free(c->out); free(c->live_key); free(c->live_val);
    int authed = c->authed;
    srv->clients[i] = srv->clients[--srv->n_clients];
    if (authed) atomic_fetch_sub(&srv->n_live, 1);
}

/* Checks the client's AUTH request: a = its nonce, b = its proof. 0 ok (the answer is queued), -1
 * refused (the error is queued and the connection closes after it). */
static int store_auth(pdde_store_server *srv, store_client *c, int op, const unsigned char *const *f, const size_t *fl) {
    unsigned char want[COMM_SHA256_BYTES], mine[COMM_SHA256_BYTES];
    if (op != STORE_OP_AUTH) {
        store_log(srv, "refused %s: request %d before authentication", c->peer, op);
        store_reply_error(srv, c, PDDE_ERR_AUTH, "store: not authenticated (a client must prove the job secret first)");
        return -1;
    }
    int ok = fl[1] == COMM_NONCE_BYTES && fl[2] == COMM_SHA256_BYTES;
    if (ok) {
        comm_prove(srv->secret.text, srv->secret.len, store_client_label, c->nonce, f[1], want);
        ok = comm_equal_ct(want, f[2], sizeof want);
    }
    if (!ok) {
        store_log(srv, "refused %s: wrong job secret", c->peer);
        store_reply_error(srv, c, PDDE_ERR_AUTH, "store: authentication failed (wrong job secret: check PDDE_JOB_SECRET "
                          "or PDDE_JOB_SECRET_FILE)");
        return -1;
    }
    comm_prove(srv->secret.text, srv->secret.len, store_server_label, f[1], c->nonce, mine);
    c->authed = 1;
    atomic_fetch_add(&srv->n_live, 1);
    return store_reply(srv, c, PDDE_OK, mine, sizeof mine);
}

/* Whether c may change e (NULL: a new key): its maker, anyone for a shared key, nobody for a death
 * notice. */
static int store_may_write(pdde_store_server *srv, store_client *c, const store_kv *e) {
    if (!e) return 1;
    if (e->locked || (e->owner && e->owner != c->id)) {
        store_log(srv, "refused %s: change of key '%.200s' made by another client", c->peer, e->key);
        store_reply_error(srv, c, PDDE_ERR_STATE, "store: key '%.200s' was made by another client%s; only its maker "
                          "may change it", e->key, e->locked ? " (a death notice)" : "");
        return 0;
    }
    return 1;
}

/* Handles one request frame; returns 0 to keep the client, 1 to drop it cleanly, -1 on error. */
static int store_handle(pdde_store_server *srv, store_client *c, const unsigned char *body, size_t n) {
    const unsigned char *f[3]; size_t fl[3];
    if (n < 1) return -1;
    int op = body[0];
    size_t pos = 1;
    for (int i = 0; i < 3; i++) {
        if (pos + 4 > n) return -1;
        fl[i] = get_u32(body + pos); pos += 4;
        if (fl[i] > n - pos) return -1;
        f[i] = body + pos; pos += fl[i];
    }
    if (!c->authed) {
        if (store_auth(srv, c, op, f, fl)) c->closing = 1;
        return 0;
    }
    const char *key = (const char *)f[0];
    size_t klen = fl[0];
    if (klen > STORE_MAX_KEY)
        return store_reply_error(srv, c, PDDE_ERR_INVALID_ARG, "store: key of %zu bytes (the limit is %d)", klen, STORE_MAX_KEY);
    store_kv *e = store_find(srv, key, klen);
    const char *limit;
    switch (op) {
    case STORE_OP_SET:
        if (!store_may_write(srv, c, e)) return 0;
        if ((limit = store_over_limit(srv, c, e, klen, fl[1])))
            return store_reply_error(srv, c, PDDE_ERR_OOM, "store: refused a value of %zu bytes for '%.200s': over the "
                                     "store's %s (%zu of %zu bytes in use)", fl[1], e ? e->key : "(new key)", limit,
                                     srv->mem, srv->max_total);
        if (store_put(srv, c, key, klen, f[1], fl[1], c->id)) return store_reply_error(srv, c, PDDE_ERR_OOM, "store: out of memory");
        return store_reply(srv, c, PDDE_OK, NULL, 0);
    case STORE_OP_GET:
        return e ? store_reply(srv, c, PDDE_OK, e->val, e->len) : store_reply(srv, c, PDDE_ERR_NOT_FOUND, NULL, 0);
    case STORE_OP_ADD: {
        if (fl[1] != 8) return -1;
        if (!store_may_write(srv, c, e)) return 0;
        long long v = e ? strtoll(e->val, NULL, 10) : 0;
        if (__builtin_add_overflow(v, (long long)get_u64(f[1]), &v)) /* (a hostile or broken delta: no signed overflow here) */
            return store_reply_error(srv, c, PDDE_ERR_INVALID_ARG, "store: adding %lld to '%.200s' overflows 64 bits",
                                     (long long)get_u64(f[1]), e ? e->key : "(new key)");
        char buf[32];
        int len = snprintf(buf, sizeof buf, "%lld", v);
        if ((limit = store_over_limit(srv, NULL, e, klen, (size_t)len)) || store_put(srv, NULL, key, klen, buf, (size_t)len, 0))
            return store_reply_error(srv, c, PDDE_ERR_OOM, "store: out of memory (%s)", limit ? limit : "malloc");
        return store_reply(srv, c, PDDE_OK, buf, (size_t)len);
    }
    case STORE_OP_CAS: {
        int match = e ? (e->len == fl[1] && !memcmp(e->val, f[1], fl[1])) : fl[1] == 0;
        if (match && !store_may_write(srv, c, e)) return 0; /* a compare that fails changes nothing */
        if (match && (limit = store_over_limit(srv, e && e->owner ? c : NULL, e, klen, fl[2])))
            return store_reply_error(srv, c, PDDE_ERR_OOM, "store: refused a value of %zu bytes: over the store's %s", fl[2], limit);
        if (match && store_put(srv, e && e->owner ? c : NULL, key, klen, f[2], fl[2], e ? e->owner : 0))
            return store_reply_error(srv, c, PDDE_ERR_OOM, "store: out of memory");
        unsigned char r = (unsigned char)match;
        return store_reply(srv, c, PDDE_OK, &r, 1);
    }
    case STORE_OP_REMOVE:
        if (!e) return store_reply(srv, c, PDDE_ERR_NOT_FOUND, NULL, 0);
        if (!store_may_write(srv, c, e)) return 0;
        store_remove_at(srv, e->owner ? c : NULL, e);
        return store_reply(srv, c, PDDE_OK, NULL, 0);
    case STORE_OP_LIVENESS:
        if (fl[2] != 8 || fl[1] > 4096) return -1;
        free(c->live_key); free(c->live_val);
        c->live_key = c->live_val = NULL;
        c->lease_s = 0;
        if (!klen) return store_reply(srv, c, PDDE_OK, NULL, 0); /* an empty key withdraws the notice */
        c->live_key = strndup(key, klen);
        c->live_val = malloc(fl[1] + 1);
        if (!c->live_key || !c->live_val) return -1;
        memcpy(c->live_val, f[1], fl[1]);
        c->live_len = fl[1];
        c->lease_s = (double)get_u64(f[2]) * 1e-6;
        return store_reply(srv, c, PDDE_OK, NULL, 0);
    case STORE_OP_PING:
        return store_reply(srv, c, PDDE_OK, NULL, 0);
    case STORE_OP_BYE:
        store_reply(srv, c, PDDE_OK, NULL, 0);
        c->closing = 1;
        free(c->live_key); c->live_key = NULL; /* a clean goodbye: no death notice */
        return 0;
    default:
        return -1;
    }
}

/* Serves the whole frames received, while no reply is pending. 0 keep, -1 drop. */
static int store_client_serve(pdde_store_server *srv, store_client *c) {
    size_t off = 0;
    while (c->in_len - off >= 4 && c->out_len == c->out_off && !c->closing) {
        size_t body = get_u32(c->in + off);
        if (c->in_len - off - 4 < body) break;
        if (store_handle(srv, c, c->in + off + 4, body)) return -1;
        off += 4 + body;
        if (store_flush(srv, c)) return -1;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    if (c->in_cap > 65536 && c->in_len < 4096) { /* a big request was served: give its memory back */
        unsigned char *in = realloc(c->in, 4096);
        if (in) { srv->mem -= c->in_cap - 4096; c->in = in; c->in_cap = 4096; }
    }
    return 0;
}

/* Reads what the client sent and serves every whole frame, while no reply is pending (a client
 * that does not read its replies is not read either). 0 keep, -1 drop. */
static int store_client_read(pdde_store_server *srv, store_client *c) {
    size_t frame_max = 2 * srv->max_value + STORE_MAX_KEY + 64;
    for (int rounds = 0; rounds < 16 && c->out_len == c->out_off && !c->closing; rounds++) {
        unsigned char scratch[65536];
        if (c->skip) { /* discard the rest of a refused request, without keeping it */
            ssize_t r = recv(c->fd, scratch, c->skip < sizeof scratch ? c->skip : sizeof scratch, MSG_DONTWAIT);
            if (r == 0) return -1;
            if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
            c->skip -= (size_t)r;
            c->last_seen = comm_now();
            continue;
        }
        /* the frame being received, if its header is in: grow to hold it (within the limits) */
        size_t need = 4096;
        if (c->in_len >= 4) need = 4 + (size_t)get_u32(c->in);
        if (c->in_len >= 4 && (need - 4 > frame_max || (need > c->in_cap && srv->mem + need - c->in_cap > srv->max_total))) {
            size_t body = need - 4;
            if (!c->authed) { store_log(srv, "refused %s: a %zu-byte frame before authentication", c->peer, body); return -1; }
            store_log(srv, "refused a request of %zu bytes from %s (%s)", body, c->peer,
                      body > frame_max ? "max_value_bytes" : "max_total_bytes");
            if (store_reply_error(srv, c, PDDE_ERR_OOM, "store: refused a request of %zu bytes: over the store's %s (%zu)",
                                  body, body > frame_max ? "max_value_bytes" : "max_total_bytes",
                                  body > frame_max ? srv->max_value : srv->max_total))
                return -1;
            if (c->in_len - 4 >= body) { /* all of it is here already (the buffer grew for an earlier one) */
                memmove(c->in, c->in + need, c->in_len - need);
                c->in_len -= need;
            } else {
                c->skip = body - (c->in_len - 4);
                c->in_len = 0;
            }
            continue;
        }
        if (!c->authed && need > 4096 + COMM_NONCE_BYTES + COMM_SHA256_BYTES) {
            store_log(srv, "refused %s: a %zu-byte frame before authentication", c->peer, need);
            return -1;
        }
        if (need > c->in_cap || c->in_cap - c->in_len < 1024) {
            size_t cap = c->in_cap ? c->in_cap : 4096;
            while (cap < need || cap - c->in_len < 1024) cap *= 2;
            unsigned char *in = realloc(c->in, cap);
            if (!in) return -1;
            srv->mem += cap - c->in_cap;
            c->in = in; c->in_cap = cap;
        }
        ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
        if (r == 0) return -1;
        if (r < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        c->in_len += (size_t)r;
        c->last_seen = comm_now();
        if (store_client_serve(srv, c)) return -1;
    }
    return 0;
}

/* Whether bytes from c wait unread: then c is alive, and the server was the one held up (stopped or
 * starved of the CPU after its poll), which must not cost c its lease. */
static int store_input_waiting(const store_client *c) {
    char byte;
    return recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
}

/* Accepts a connection and sends the challenge, or a refusal when the connections or the file
 * descriptors are used up (then the listen socket rests a while instead of waking poll at once). */
static int store_accept(pdde_store_server *srv) {
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    int fd = accept4(srv->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
    const char *refuse = NULL;
    char why[160];
    if (fd < 0 && (errno == EMFILE || errno == ENFILE) && srv->reserve_fd >= 0) {
        close(srv->reserve_fd); /* make room to tell the newcomer, then keep the reserve again */
        fd = accept4(srv->listen_fd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        snprintf(why, sizeof why, "store: out of file descriptors (%d clients connected)", srv->n_clients);
        refuse = why;
        srv->accept_paused_until = comm_now() + 0.1;
    }
    if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            store_log(srv, "accept: %s; pausing new connections for 0.1 s", strerror(errno));
            srv->accept_paused_until = comm_now() + 0.1;
        }
        return 0;
    }
    if (!refuse && srv->n_clients >= srv->max_clients) {
        snprintf(why, sizeof why, "store: too many connections (the limit is %d; max_clients)", srv->max_clients);
        refuse = why;
    }
    store_client c = {.fd = fd, .id = ++srv->next_id, .last_seen = comm_now()};
    c.auth_deadline = c.last_seen + srv->auth_timeout_s;
    snprintf(c.peer, sizeof c.peer, "%s:%d", inet_ntoa(sa.sin_addr), ntohs(sa.sin_port));
    if (refuse) {
        unsigned char hdr[12];
        put_u32(hdr, (uint32_t)(8 + strlen(refuse)));
        put_u32(hdr + 4, (uint32_t)PDDE_ERR_COMM);
        put_u32(hdr + 8, (uint32_t)strlen(refuse));
        if (send(fd, hdr, 12, MSG_NOSIGNAL | MSG_DONTWAIT) == 12) send(fd, refuse, strlen(refuse), MSG_NOSIGNAL | MSG_DONTWAIT);
        close(fd);
        store_log(srv, "refused %s: %s", c.peer, refuse + 7);
        return 1;
    }
    if (srv->n_clients == srv->cap_clients) {
        int nc = srv->cap_clients ? srv->cap_clients * 2 : 16;
        store_client *cl = realloc(srv->clients, (size_t)nc * sizeof *cl);
        if (!cl) { close(fd); return 1; }
        srv->clients = cl; srv->cap_clients = nc;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char hello[STORE_HELLO_BYTES];
    if (comm_random(c.nonce, sizeof c.nonce)) { close(fd); return 1; }
    memcpy(hello, c.nonce, COMM_NONCE_BYTES);
    put_u64(hello + COMM_NONCE_BYTES, srv->max_value);
    srv->clients[srv->n_clients] = c;
    store_client *nc = &srv->clients[srv->n_clients++];
    if (store_reply(srv, nc, PDDE_OK, hello, sizeof hello) || store_flush(srv, nc)) store_client_drop(srv, srv->n_clients - 1, 1, NULL);
    return 1;
}

static void *store_server_main(void *arg) {
    pdde_store_server *srv = arg;
    struct pollfd *pfds = NULL;
    int cap = 0;
    for (;;) {
        if (cap < srv->n_clients + 2) {
            int ncap = srv->n_clients + 16;
            struct pollfd *p = realloc(pfds, (size_t)ncap * sizeof *p);
            if (!p) { comm_sleep(0.01); continue; }
            pfds = p; cap = ncap;
        }
        double now = comm_now();
        int listening = now >= srv->accept_paused_until;
        pfds[0] = (struct pollfd){srv->wake[0], POLLIN, 0};
        pfds[1] = (struct pollfd){listening ? srv->listen_fd : -1, POLLIN, 0};
        int n = srv->n_clients;
        for (int i = 0; i < n; i++) {
            store_client *c = &srv->clients[i];
            short ev = c->out_len > c->out_off ? POLLOUT : (c->closing ? 0 : POLLIN);
            pfds[2 + i] = (struct pollfd){c->fd, ev, 0};
        }
        /* a short poll period bounds how late an expired lease or a stalled client is noticed */
        if (poll(pfds, (nfds_t)(n + 2), listening ? 100 : 20) < 0 && errno != EINTR) break;
        if (pfds[0].revents) break;
        now = comm_now();
        /* clients first (indices stay valid: new clients are appended after) */
        for (int i = n - 1; i >= 0; i--) {
            store_client *c = &srv->clients[i];
            short re = pfds[2 + i].revents;
            int drop = 0, clean = 0;
            if (re & (POLLERR | POLLNVAL)) drop = 1;
            if (!drop && (re & POLLOUT) && (store_flush(srv, c) || store_client_serve(srv, c))) drop = 1;
            if (!drop && (re & (POLLIN | POLLHUP)) && store_client_read(srv, c)) drop = 1;
            if (!drop && c->closing && c->out_len == c->out_off) drop = clean = 1;
            if (!drop && !c->authed && now > c->auth_deadline) {
                store_log(srv, "closed %s: no authentication within %.3g s", c->peer, srv->auth_timeout_s);
                drop = clean = 1;
            }
            if (!drop && c->out_len > c->out_off && now - c->out_since > srv->stall_timeout_s) {
                store_log(srv, "dropped %s: it took none of a %zu-byte reply for %.3g s", c->peer, c->out_len - c->out_off,
                          srv->stall_timeout_s);
                drop = 1;
            }
            char why[120] = "";
            if (!drop && c->lease_s > 0 && now - c->last_seen > c->lease_s && !store_input_waiting(c)) {
                snprintf(why, sizeof why, "its lease expired: no sign of life for %.3g s; stopped or hung", c->lease_s);
                drop = 1;
            }
            if (drop) store_client_drop(srv, i, clean, why[0] ? why : NULL);
        }
        if (listening && (pfds[1].revents & POLLIN))
            for (int k = 0; k < 16 && comm_now() >= srv->accept_paused_until && store_accept(srv); k++) {}
    }
    free(pfds);
    return NULL;
}

pdde_status pdde_store_server_init_params(pdde_context *ctx, const pdde_store_server_params *params,
                                          pdde_store_server **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_store_server_init: out is NULL");
    *out = NULL;
    pdde_store_server_params p = PDDE_STORE_SERVER_PARAMS_INIT;
    if (params) p = *params;
    const char *addr = p.addr ? p.addr : "127.0.0.1:0";
    char host[256]; int port;
    if (comm_parse_addr(addr, host, sizeof host, &port))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "store server: bad address '%s' (want host:port)", addr);
    struct sockaddr_in sa;
    if (comm_resolve(host, port, &sa))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "store server: cannot resolve '%s'", host);
    pdde_store_server *srv = calloc(1, sizeof *srv);
    if (!srv) return pdde_error(ctx, PDDE_ERR_OOM, "store server: out of memory");
    pdde_status st = p.secret ? comm_secret_set(ctx, &srv->secret, p.secret, strlen(p.secret), "the server parameters")
                              : comm_secret_for_server(ctx, &srv->secret);
    if (st) { free(srv); return st; }
    srv->max_value = p.max_value_bytes ? p.max_value_bytes : (size_t)16 << 20;
    srv->max_total = p.max_total_bytes ? p.max_total_bytes : (size_t)512 << 20;
    srv->max_client = p.max_client_bytes ? p.max_client_bytes : (size_t)64 << 20;
    srv->max_clients = p.max_clients > 0 ? p.max_clients : 1024;
    srv->auth_timeout_s = p.auth_timeout_s > 0 ? p.auth_timeout_s : 5;
    srv->stall_timeout_s = p.stall_timeout_s > 0 ? p.stall_timeout_s : 10;
    if (srv->max_value > UINT32_MAX / 4) srv->max_value = UINT32_MAX / 4;
    pthread_mutex_init(&srv->fail_lock, NULL);
    srv->wake[0] = srv->wake[1] = -1;
    srv->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    srv->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (srv->listen_fd < 0) goto fail;
    setsockopt(srv->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(srv->listen_fd, (struct sockaddr *)&sa, sizeof sa) || listen(srv->listen_fd, 512)) goto fail;
    socklen_t sl = sizeof sa;
    getsockname(srv->listen_fd, (struct sockaddr *)&sa, &sl);
    srv->port = ntohs(sa.sin_port);
    if (pipe2(srv->wake, O_CLOEXEC)) goto fail;
    if (pthread_create(&srv->thread, NULL, store_server_main, srv)) goto fail;
    *out = srv;
    return PDDE_OK;
fail:;
    int err = errno;
    if (srv->listen_fd >= 0) close(srv->listen_fd);
    if (srv->reserve_fd >= 0) close(srv->reserve_fd);
    if (srv->wake[0] >= 0) { close(srv->wake[0]); close(srv->wake[1]); }
    free(srv);
    return pdde_error(ctx, PDDE_ERR_COMM, "store server: cannot listen on %s: %s", addr, strerror(err));
}

pdde_status pdde_store_server_init(pdde_context *ctx, const char *addr, pdde_store_server **out) {
    pdde_store_server_params p = PDDE_STORE_SERVER_PARAMS_INIT;
    p.addr = addr;
    return pdde_store_server_init_params(ctx, &p, out);
}

int pdde_store_server_port(const pdde_store_server *srv) { return srv ? srv->port : -1; }

void pdde_store_server_free(pdde_store_server *srv) {
    if (!srv) return;
    ssize_t w = write(srv->wake[1], "x", 1);
    (void)w;
    pthread_join(srv->thread, NULL);
    while (srv->n_clients) store_client_drop(srv, srv->n_clients - 1, 1, NULL);
    pthread_mutex_destroy(&srv->fail_lock);
    for (int i = 0; i < srv->n_kv; i++) { free(srv->kv[i].key); free(srv->kv[i].val); }
    free(srv->kv); free(srv->clients);
    close(srv->listen_fd); close(srv->wake[0]); close(srv->wake[1]);
    if (srv->reserve_fd >= 0) close(srv->reserve_fd);
    free(srv);
}

int pdde_store_server_n_clients(const pdde_store_server *srv) { return srv ? atomic_load(&srv->n_live) : 0; }

int pdde_store_server_first_failure(pdde_store_server *srv, char *buf, size_t cap) {
    if (!srv || !buf || !cap) return 0;
    pthread_mutex_lock(&srv->fail_lock);
    snprintf(buf, cap, "%s", srv->first_failure);
    pthread_mutex_unlock(&srv->fail_lock);
    return buf[0] != 0;
}

/* ================================================================================================
 * TCP client */

typedef struct {
    int fd;
    char addr[256];
    double timeout_s;   /* per request: a store that does not answer is as good as lost */
    double lease_s;     /* the lease this client holds (0: none); it bounds the wait for a reply (store_rpc) */
    int broken;         /* the connection closed, failed or carried garbage: fail fast from then on */
    size_t max_value;   /* the server's limit, from its challenge */
    /* A round trip that ran out of time stays owed. The wire has no request ids, so no new request
     * goes out before the rest of the owed one is sent and its reply read and dropped: a late reply
     * is never taken for another request's. Each later call first takes in what has arrived, without
     * waiting: a store that was only slow is used again once it has answered, and until then (a host
     * cut off) calls fail at once, as they did when one late reply broke the connection for good. */
    int owed;
    unsigned char *tx;        /* the request being sent, how much of it went, and when it started */
    size_t tx_len, tx_off;
    double tx_since;
    unsigned char rx_hdr[12]; /* the reply being read: its header, then its value */
    size_t rx_hdr_have;
    char *rx_val;
    uint32_t rx_len, rx_have;
} store_tcp;

/* Sends the rest of t->tx by the deadline (a deadline now: what the socket takes at once). 0 sent,
 * -2 out of time, -1 error. */
static int store_send_until(store_tcp *t, double deadline) {
    while (t->tx_off < t->tx_len) {
        ssize_t w = send(t->fd, t->tx + t->tx_off, t->tx_len - t->tx_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) { t->tx_off += (size_t)w; continue; }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        int ms = (int)((deadline - comm_now()) * 1000);
        if (ms <= 0) return -2;
        struct pollfd pfd = {t->fd, POLLOUT, 0};
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -1;
    }
    return 0;
}

/* Reads the reply frame in progress by the deadline (a deadline now: what has arrived); what was read
 * stays for the next try. 0 whole (store_take_reply), -2 out of time, -3 closed, -4 not a reply frame,
 * -1 error. */
static int store_recv_until(store_tcp *t, double deadline) {
    for (;;) {
        unsigned char *dst;
        size_t want;
        if (t->rx_hdr_have < sizeof t->rx_hdr) {
            dst = t->rx_hdr + t->rx_hdr_have, want = sizeof t->rx_hdr - t->rx_hdr_have;
        } else if (!t->rx_val) { /* the header is in: check it, make room for the value */
            t->rx_len = get_u32(t->rx_hdr + 8);
            if (t->rx_len > (uint32_t)INT32_MAX || get_u32(t->rx_hdr) != 8 + t->rx_len) return -4;
            if (!(t->rx_val = malloc((size_t)t->rx_len + 1))) return -1;
            t->rx_have = 0;
            continue;
        } else if (t->rx_have < t->rx_len) {
            dst = (unsigned char *)t->rx_val + t->rx_have, want = t->rx_len - t->rx_have;
        } else {
            t->rx_val[t->rx_len] = 0;
            return 0;
        }
        ssize_t r = recv(t->fd, dst, want, MSG_DONTWAIT);
        if (r > 0) {
            if (t->rx_hdr_have < sizeof t->rx_hdr) t->rx_hdr_have += (size_t)r;
            else t->rx_have += (uint32_t)r;
            continue;
        }
        if (r == 0) return -3;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        int ms = (int)((deadline - comm_now()) * 1000);
        if (ms <= 0) return -2;
        struct pollfd pfd = {t->fd, POLLIN, 0};
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -1;
    }
}

/* Hands over the whole reply just read: its status and its value (malloc'ed, NUL-terminated). */
static void store_take_reply(store_tcp *t, int32_t *status, char **val, uint32_t *vlen) {
    *status = (int32_t)get_u32(t->rx_hdr + 4);
    *val = t->rx_val, *vlen = t->rx_len;
    t->rx_val = NULL, t->rx_hdr_have = 0, t->rx_have = t->rx_len = 0;
}

/* Sends the rest of t->tx and reads its reply by the deadline. 0 with the reply, else as
 * store_recv_until (the round trip stays where it got to). */
static int store_round_trip(store_tcp *t, double deadline, int32_t *status, char **val, uint32_t *vlen) {
    int rc = store_send_until(t, deadline);
    if (!rc) rc = store_recv_until(t, deadline);
    if (rc) return rc;
    free(t->tx);
    t->tx = NULL, t->tx_len = t->tx_off = 0;
    store_take_reply(t, status, val, vlen);
    return 0;
}

static pdde_status store_lost(store_tcp *t, pdde_context *ctx, int rc) {
    const char *why = rc == -3 ? "the store closed it" : rc == -4 ? "a malformed reply" : strerror(errno);
    if (rc == -2) { /* perhaps only slow: the round trip stays owed (see store_tcp) */
        t->owed = 1;
        return pdde_error(ctx, PDDE_ERR_TIMEOUT, "store %s: no reply in time", t->addr);
    }
    t->broken = 1;
    return pdde_error(ctx, PDDE_ERR_PEER_LOST, "store %s: connection lost (%s)", t->addr, why);
}

/* Takes in what has arrived of an owed round trip's reply, sending the rest of its request first,
 * by the deadline; the reply is dropped. 0: nothing is owed any more. */
static int store_catch_up(store_tcp *t, double deadline) {
    int32_t status;
    char *v = NULL;
    uint32_t len;
    int rc = store_round_trip(t, deadline, &status, &v, &len);
    free(v);
    if (!rc) t->owed = 0;
    return rc;
}

static pdde_status store_rpc(store_tcp *t, pdde_context *ctx, int op, const char *key, const void *a, size_t alen,
                             const void *b, size_t blen, void **val, size_t *vlen) {
    if (t->broken) return pdde_error(ctx, PDDE_ERR_PEER_LOST, "store %s: connection lost", t->addr);
    if (t->owed) {
        int rc = store_catch_up(t, comm_now());
        if (rc == -2)
            return pdde_error(ctx, PDDE_ERR_TIMEOUT, "store %s: still no reply to a request made %.3g s ago (the store is "
                              "slow or out of reach)", t->addr, comm_now() - t->tx_since);
        if (rc) return store_lost(t, ctx, rc);
    }
    size_t klen = key ? strlen(key) : 0, body = 1 + 12 + klen + alen + blen;
    if (klen > STORE_MAX_KEY || alen > t->max_value || blen > t->max_value)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "store %s: %s of %zu bytes is over the store's limit of %zu", t->addr,
                          klen > STORE_MAX_KEY ? "a key" : "a value", klen > STORE_MAX_KEY ? klen : alen > blen ? alen : blen,
                          klen > STORE_MAX_KEY ? (size_t)STORE_MAX_KEY : t->max_value);
    unsigned char *msg = malloc(4 + body);
    if (!msg) return pdde_error(ctx, PDDE_ERR_OOM, "store: out of memory");
    unsigned char *p = msg;
    put_u32(p, (uint32_t)body); p[4] = (unsigned char)op; p += 5;
    const void *fs[3] = {key, a, b}; size_t fl[3] = {klen, alen, blen};
    for (int i = 0; i < 3; i++) { put_u32(p, (uint32_t)fl[i]); p += 4; if (fl[i]) memcpy(p, fs[i], fl[i]); p += fl[i]; }
    free(t->tx);
    t->tx = msg, t->tx_len = 4 + body, t->tx_off = 0, t->tx_since = comm_now();
    /* A client holding a lease waits for a reply at most twice the lease, not timeout_s: the server
     * answers at once, and a client it has not heard from for the lease is dropped (its notice set, the
     * others go on without it). No reply by then means this host is cut off from the store (a link
     * down drops packets silently: no error comes), and waiting for timeout_s (minutes) would hold the
     * caller, and a collective waiting on the store's failure key, long after the others re-formed. */
    double wait = t->timeout_s;
    if (t->lease_s > 0 && 2 * t->lease_s < wait) wait = 2 * t->lease_s;
    int32_t status = 0;
    char *v = NULL;
    uint32_t len = 0;
    int rc = store_round_trip(t, t->tx_since + wait, &status, &v, &len);
    if (rc) return store_lost(t, ctx, rc);
    if (val && status == PDDE_OK) { *val = v; *vlen = len; v = NULL; }
    pdde_status r = PDDE_OK;
    if (status == PDDE_ERR_NOT_FOUND) r = pdde_error(ctx, status, "store: no key '%s'", key ? key : "");
    else if (status && len) r = pdde_error(ctx, status, "store %s: %s", t->addr, v); /* the server says why */
    else if (status) r = pdde_error(ctx, status, "store %s: request failed (%s)", t->addr, pdde_status_str(status));
    free(v);
    return r;
}

static pdde_status store_tcp_set(void *impl, pdde_context *ctx, const char *key, const void *val, size_t len) {
    return store_rpc(impl, ctx, STORE_OP_SET, key, val, len, NULL, 0, NULL, NULL);
}
static pdde_status store_tcp_get(void *impl, pdde_context *ctx, const char *key, void **val, size_t *len) {
    *val = NULL; *len = 0;
    return store_rpc(impl, ctx, STORE_OP_GET, key, NULL, 0, NULL, 0, val, len);
}
static pdde_status store_tcp_add(void *impl, pdde_context *ctx, const char *key, int64_t delta, int64_t *out) {
    unsigned char d[8]; put_u64(d, (uint64_t)delta);
    void *v = NULL; size_t n;
    pdde_status st = store_rpc(impl, ctx, STORE_OP_ADD, key, d, 8, NULL, 0, &v, &n);
    if (!st && out) *out = strtoll(v, NULL, 10);
    free(v);
    return st;
}
static pdde_status store_tcp_cas(void *impl, pdde_context *ctx, const char *key, const void *expected, size_t elen,
                                 const void *desired, size_t dlen, int *swapped) {
    void *v = NULL; size_t n;
    pdde_status st = store_rpc(impl, ctx, STORE_OP_CAS, key, expected, elen, desired, dlen, &v, &n);
    if (!st && swapped) *swapped = n == 1 && *(unsigned char *)v;
    free(v);
    return st;
}
static pdde_status store_tcp_remove(void *impl, pdde_context *ctx, const char *key) {
    return store_rpc(impl, ctx, STORE_OP_REMOVE, key, NULL, 0, NULL, 0, NULL, NULL);
}
static pdde_status store_tcp_liveness(void *impl, pdde_context *ctx, const char *key, const void *val, size_t len,
                                      double lease_s) {
    store_tcp *t = impl;
    unsigned char l[8]; put_u64(l, (uint64_t)(lease_s > 0 ? lease_s * 1e6 : 0));
    /* The registration waits for its reply at most twice the lease it asks for, as every call does once
     * the lease is held (store_rpc): whoever registers a lease judges the store lost at that scale (an
     * elastic joiner whose store goes silent right then stops after two leases, not its timeout). */
    double held = t->lease_s;
    if (lease_s > 0 && (held <= 0 || lease_s < held)) t->lease_s = lease_s;
    pdde_status st = store_rpc(t, ctx, STORE_OP_LIVENESS, key, val, len, l, 8, NULL, NULL);
    t->lease_s = st ? held : lease_s > 0 ? lease_s : 0;
    return st;
}
static pdde_status store_tcp_ping(void *impl, pdde_context *ctx) {
    return store_rpc(impl, ctx, STORE_OP_PING, NULL, NULL, 0, NULL, 0, NULL, NULL);
}
static void store_tcp_close(void *impl) {
    store_tcp *t = impl;
    /* A reply still owed (a store only slow has it on the way) is waited for a moment first: without the
     * goodbye after it, the store would take this clean close for a death and publish the notice. A
     * moment only: a client cut off from its store (an elastic joiner, a world failing) must not linger. */
    if (!t->broken && t->owed && store_catch_up(t, comm_now() + 0.25)) t->broken = 1;
    if (!t->broken) { /* (a reply still owed and not in: no goodbye, as for a broken connection) */
        t->timeout_s = 1.0;
        store_rpc(t, NULL, STORE_OP_BYE, NULL, NULL, 0, NULL, 0, NULL, NULL);
    }
    close(t->fd);
    free(t->tx);
    free(t->rx_val);
    free(t);
}

static const pdde_store_iface store_tcp_iface = {
    PDDE_STORE_API_VERSION, sizeof(pdde_store_iface), "tcp",
    store_tcp_set, store_tcp_get, store_tcp_add, store_tcp_cas, store_tcp_remove,
    NULL, store_tcp_liveness, store_tcp_ping, store_tcp_close,
};

/* The challenge-response on a new connection (see the top of this file). */
static pdde_status store_tcp_auth(store_tcp *t, pdde_context *ctx, const comm_secret *secret) {
    int32_t status = 0;
    char *v = NULL;
    uint32_t len = 0;
    int rc = store_recv_until(t, comm_now() + t->timeout_s);
    if (rc) {
        pdde_status r = store_lost(t, ctx, rc);
        t->broken = 1;
        return r;
    }
    store_take_reply(t, &status, &v, &len);
    if (status) {
        pdde_status r = pdde_error(ctx, status, "store %s refused the connection: %s", t->addr, len ? v : pdde_status_str(status));
        free(v);
        t->broken = 1;
        return r;
    }
    if (len != STORE_HELLO_BYTES) {
        free(v); t->broken = 1;
        return pdde_error(ctx, PDDE_ERR_COMM, "store %s: not a pdde store (or another version of it)", t->addr);
    }
    unsigned char server_nonce[COMM_NONCE_BYTES], nonce[COMM_NONCE_BYTES], proof[COMM_SHA256_BYTES];
    memcpy(server_nonce, v, sizeof server_nonce);
    t->max_value = (size_t)get_u64((unsigned char *)v + COMM_NONCE_BYTES);
    free(v);
    if (comm_random(nonce, sizeof nonce)) return pdde_error(ctx, PDDE_ERR_IO, "store: no random bytes: %s", strerror(errno));
    comm_prove(secret->text, secret->len, store_client_label, server_nonce, nonce, proof);
    void *answer = NULL;
    size_t alen = 0;
    pdde_status st = store_rpc(t, ctx, STORE_OP_AUTH, NULL, nonce, sizeof nonce, proof, sizeof proof, &answer, &alen);
    if (st) { t->broken = 1; return st; }
    comm_prove(secret->text, secret->len, store_server_label, nonce, server_nonce, proof);
    int ok = alen == sizeof proof && comm_equal_ct(answer, proof, sizeof proof);
    free(answer);
    if (!ok) {
        t->broken = 1;
        return pdde_error(ctx, PDDE_ERR_AUTH, "store %s could not prove the job secret: it is not this job's store", t->addr);
    }
    return PDDE_OK;
}

static pdde_status store_connect_with(pdde_context *ctx, const char *addr, const comm_secret *secret, double timeout_s,
                                      pdde_store **out) {
    *out = NULL;
    char host[256]; int port;
    if (!addr || comm_parse_addr(addr, host, sizeof host, &port) || port == 0)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "store: bad address '%s' (want host:port)", addr ? addr : "(null)");
    struct sockaddr_in sa;
    if (comm_resolve(*host ? host : "127.0.0.1", port, &sa))
        return pdde_error(ctx, PDDE_ERR_COMM, "store: cannot resolve host '%s'", host);
    if (timeout_s <= 0) timeout_s = 30;
    double deadline = comm_now() + timeout_s, pause = 1e-3;
    int fd = -1, err = 0;
    for (;;) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return pdde_error(ctx, PDDE_ERR_COMM, "store: socket: %s", strerror(errno));
        if (!connect(fd, (struct sockaddr *)&sa, sizeof sa)) break;
        err = errno;
        close(fd); fd = -1;
        double left = deadline - comm_now();
        if (left <= 0) break;
        comm_sleep(pause < left ? pause : left);
        pause = pause * 2 < 0.1 ? pause * 2 : 0.1;
    }
    if (fd < 0)
        return pdde_error(ctx, PDDE_ERR_TIMEOUT, "store: cannot connect to %s within %.3g s: %s", addr, timeout_s,
                          strerror(err));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    store_tcp *t = calloc(1, sizeof *t);
    if (!t) { close(fd); return pdde_error(ctx, PDDE_ERR_OOM, "store: out of memory"); }
    t->fd = fd;
    t->timeout_s = timeout_s > 10 ? timeout_s : 10;
    snprintf(t->addr, sizeof t->addr, "%s", addr);
    pdde_status st = store_tcp_auth(t, ctx, secret);
    if (!st) st = pdde_store_wrap(ctx, &store_tcp_iface, t, out);
    if (st) store_tcp_close(t);
    return st;
}

pdde_status pdde_store_connect_secret(pdde_context *ctx, const char *addr, const char *secret, double timeout_s,
                                      pdde_store **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_store_connect: out is NULL");
    *out = NULL;
    comm_secret s;
    pdde_status st = secret ? comm_secret_set(ctx, &s, secret, strlen(secret), "the caller") : comm_secret_lookup(ctx, &s);
    if (st == PDDE_ERR_NOT_FOUND)
        return pdde_error(ctx, PDDE_ERR_ENV, "store %s: no job secret (set PDDE_JOB_SECRET or PDDE_JOB_SECRET_FILE; "
                          "pdde-run sets it for its ranks)", addr ? addr : "");
    if (st) return st;
    return store_connect_with(ctx, addr, &s, timeout_s, out);
}

pdde_status pdde_store_connect(pdde_context *ctx, const char *addr, double timeout_s, pdde_store **out) {
    return pdde_store_connect_secret(ctx, addr, NULL, timeout_s, out);
}

#endif /* PDDE_COMM_STORE_C */
