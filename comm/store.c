/* comm/store.c — the bootstrap key-value store: the generic pdde_store wrapper over a backend vtable,
 * and the built-in TCP backend (a one-thread poll() server and a synchronous client).
 *
 * Wire format (little-endian), one request then one reply per round trip:
 *   request: u32 body_len, u8 op, then three fields: u32 len + bytes (key, a, b)
 *   reply:   u32 body_len, i32 status, u32 len + bytes (the value)
 * A client that registered a liveness notice and disconnects without BYE (its process died) or stays
 * silent past its lease gets the notice set by the server: that is how peers learn of a death fast. */

enum {
    STORE_OP_SET = 1, STORE_OP_GET, STORE_OP_ADD, STORE_OP_CAS, STORE_OP_REMOVE,
    STORE_OP_LIVENESS, STORE_OP_PING, STORE_OP_BYE,
};
#define STORE_MAX_FRAME (64u << 20)

struct pdde_store {
    const pdde_store_iface *iface;
    void *impl;
    pdde_context *ctx;
};

static double comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void comm_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* "host:port" -> parts; host may be empty ("" = any / loopback). */
static int comm_parse_addr(const char *addr, char *host, size_t hostcap, int *port) {
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    if (!colon || (size_t)(colon - addr) >= hostcap) return -1;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || p < 0 || p > 65535) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    *port = (int)p;
    return 0;
}

static void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get_u32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint64_t get_u64(const unsigned char *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

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

void pdde_store_free(pdde_store *s) {
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
 * Socket helpers shared by the server and the client */

/* Writes all of buf; waits for POLLOUT up to timeout_s in total. 0 ok, -1 error/timeout. */
static int comm_write_all(int fd, const void *buf, size_t n, double timeout_s) {
    const char *p = buf;
    double deadline = comm_now() + timeout_s;
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) { p += w; n -= (size_t)w; continue; }
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        int ms = (int)((deadline - comm_now()) * 1000);
        if (ms <= 0) return -1;
        struct pollfd pfd = {fd, POLLOUT, 0};
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -1;
    }
    return 0;
}

/* Reads exactly n bytes within timeout_s. 0 ok, -1 error, -2 timeout, -3 peer closed. */
static int comm_read_all(int fd, void *buf, size_t n, double timeout_s) {
    char *p = buf;
    double deadline = comm_now() + timeout_s;
    while (n) {
        ssize_t r = recv(fd, p, n, MSG_DONTWAIT);
        if (r > 0) { p += r; n -= (size_t)r; continue; }
        if (r == 0) return -3;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        int ms = (int)((deadline - comm_now()) * 1000);
        if (ms <= 0) return -2;
        struct pollfd pfd = {fd, POLLIN, 0};
        if (poll(&pfd, 1, ms) < 0 && errno != EINTR) return -1;
    }
    return 0;
}

static int comm_resolve(const char *host, int port, struct sockaddr_in *sa) {
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (!*host || !strcmp(host, "*") || !strcmp(host, "0.0.0.0")) { sa->sin_addr.s_addr = htonl(INADDR_ANY); return 0; }
    if (inet_pton(AF_INET, host, &sa->sin_addr) == 1) return 0;
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) || !res) return -1;
    sa->sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
    freeaddrinfo(res);
    return 0;
}

/* ================================================================================================
 * TCP server */

typedef struct {
    char *key;
    char *val;
    size_t len;
} store_kv;

typedef struct {
    int fd;
    unsigned char *in;       /* bytes received, not yet a whole frame */
    size_t in_len, in_cap;
    char *live_key, *live_val; /* the death notice, or NULL */
    size_t live_len;
    double lease_s, last_seen;
} store_client;

struct pdde_store_server {
    int listen_fd, port;
    int wake[2];             /* a pipe that stops the server thread */
    pthread_t thread;
    store_kv *kv;            /* few keys (bootstrap only): a linear array is enough */
    int n_kv, cap_kv;
    store_client *clients;
    int n_clients, cap_clients;
    _Atomic int n_live;      /* clients connected, readable from other threads */
};

static store_kv *store_find(pdde_store_server *srv, const char *key, size_t klen) {
    for (int i = 0; i < srv->n_kv; i++)
        if (strlen(srv->kv[i].key) == klen && !memcmp(srv->kv[i].key, key, klen)) return &srv->kv[i];
    return NULL;
}

static int store_put(pdde_store_server *srv, const char *key, size_t klen, const void *val, size_t len) {
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
        if (!(e->key = strndup(key, klen))) { free(v); return -1; }
        srv->n_kv++;
        e->val = NULL;
    }
    free(e->val);
    e->val = v; e->len = len;
    return 0;
}

static void store_client_drop(pdde_store_server *srv, int i, int clean) {
    store_client *c = &srv->clients[i];
    if (!clean && c->live_key && !store_find(srv, c->live_key, strlen(c->live_key)))
        store_put(srv, c->live_key, strlen(c->live_key), c->live_val, c->live_len);
    close(c->fd);
    free(c->in); free(c->live_key); free(c->live_val);
    srv->clients[i] = srv->clients[--srv->n_clients];
    atomic_store(&srv->n_live, srv->n_clients);
}

static int store_reply(int fd, int32_t status, const void *val, size_t len) {
    unsigned char hdr[12];
    put_u32(hdr, (uint32_t)(8 + len));
    put_u32(hdr + 4, (uint32_t)status);
    put_u32(hdr + 8, (uint32_t)len);
    if (comm_write_all(fd, hdr, 12, 5.0)) return -1;
    return len ? comm_write_all(fd, val, len, 5.0) : 0;
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
    const char *key = (const char *)f[0];
    size_t klen = fl[0];
    store_kv *e;
    switch (op) {
    case STORE_OP_SET:
        return store_put(srv, key, klen, f[1], fl[1]) ? store_reply(c->fd, PDDE_ERR_OOM, NULL, 0)
                                                      : store_reply(c->fd, PDDE_OK, NULL, 0);
    case STORE_OP_GET:
        e = store_find(srv, key, klen);
        return e ? store_reply(c->fd, PDDE_OK, e->val, e->len) : store_reply(c->fd, PDDE_ERR_NOT_FOUND, NULL, 0);
    case STORE_OP_ADD: {
        if (fl[1] != 8) return -1;
        e = store_find(srv, key, klen);
        long long v = e ? strtoll(e->val, NULL, 10) : 0;
        v += (long long)get_u64(f[1]);
        char buf[32];
        int len = snprintf(buf, sizeof buf, "%lld", v);
        if (store_put(srv, key, klen, buf, (size_t)len)) return store_reply(c->fd, PDDE_ERR_OOM, NULL, 0);
        return store_reply(c->fd, PDDE_OK, buf, (size_t)len);
    }
    case STORE_OP_CAS: {
        e = store_find(srv, key, klen);
        int match = e ? (e->len == fl[1] && !memcmp(e->val, f[1], fl[1])) : fl[1] == 0;
        if (match && store_put(srv, key, klen, f[2], fl[2])) return store_reply(c->fd, PDDE_ERR_OOM, NULL, 0);
        unsigned char r = (unsigned char)match;
        return store_reply(c->fd, PDDE_OK, &r, 1);
    }
    case STORE_OP_REMOVE:
        e = store_find(srv, key, klen);
        if (!e) return store_reply(c->fd, PDDE_ERR_NOT_FOUND, NULL, 0);
        free(e->key); free(e->val);
        *e = srv->kv[--srv->n_kv];
        return store_reply(c->fd, PDDE_OK, NULL, 0);
    case STORE_OP_LIVENESS:
        if (fl[2] != 8) return -1;
        free(c->live_key); free(c->live_val);
        c->live_key = c->live_val = NULL;
        c->lease_s = 0;
        if (!klen) return store_reply(c->fd, PDDE_OK, NULL, 0); /* an empty key withdraws the notice */
        c->live_key = strndup(key, klen);
        c->live_val = malloc(fl[1] + 1);
        if (!c->live_key || !c->live_val) return -1;
        memcpy(c->live_val, f[1], fl[1]);
        c->live_len = fl[1];
        c->lease_s = (double)get_u64(f[2]) * 1e-6;
        return store_reply(c->fd, PDDE_OK, NULL, 0);
    case STORE_OP_PING:
        return store_reply(c->fd, PDDE_OK, NULL, 0);
    case STORE_OP_BYE:
        store_reply(c->fd, PDDE_OK, NULL, 0);
        return 1;
    default:
        return -1;
    }
}

/* Reads what the client sent and serves every whole frame. Same return convention as store_handle. */
static int store_client_read(pdde_store_server *srv, store_client *c) {
    for (;;) {
        if (c->in_cap - c->in_len < 4096) {
            size_t cap = c->in_cap ? c->in_cap * 2 : 8192;
            unsigned char *in = realloc(c->in, cap);
            if (!in) return -1;
            c->in = in; c->in_cap = cap;
        }
        ssize_t r = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, MSG_DONTWAIT);
        if (r == 0) return -1;
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return -1;
        }
        c->in_len += (size_t)r;
    }
    c->last_seen = comm_now();
    size_t off = 0;
    while (c->in_len - off >= 4) {
        uint32_t body = get_u32(c->in + off);
        if (body > STORE_MAX_FRAME) return -1;
        if (c->in_len - off - 4 < body) break;
        int rc = store_handle(srv, c, c->in + off + 4, body);
        if (rc) return rc;
        off += 4 + body;
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    return 0;
}

static void *store_server_main(void *arg) {
    pdde_store_server *srv = arg;
    struct pollfd *pfds = NULL;
    int cap = 0;
    for (;;) {
        if (cap < srv->n_clients + 2) {
            cap = srv->n_clients + 16;
            struct pollfd *p = realloc(pfds, (size_t)cap * sizeof *p);
            if (!p) { comm_sleep(0.01); continue; }
            pfds = p;
        }
        pfds[0] = (struct pollfd){srv->wake[0], POLLIN, 0};
        pfds[1] = (struct pollfd){srv->listen_fd, POLLIN, 0};
        int n = srv->n_clients;
        for (int i = 0; i < n; i++) pfds[2 + i] = (struct pollfd){srv->clients[i].fd, POLLIN, 0};
        /* a short poll period bounds how late an expired lease is noticed */
        if (poll(pfds, (nfds_t)(n + 2), 100) < 0 && errno != EINTR) break;
        if (pfds[0].revents) break;
        /* clients first (indices stay valid: new clients are appended after) */
        for (int i = n - 1; i >= 0; i--) {
            store_client *c = &srv->clients[i];
            if (pfds[2 + i].revents) {
                int rc = store_client_read(srv, c);
                if (rc) { store_client_drop(srv, i, rc == 1); continue; }
            }
            if (c->lease_s > 0 && comm_now() - c->last_seen > c->lease_s) store_client_drop(srv, i, 0);
        }
        if (pfds[1].revents & POLLIN) {
            int fd = accept(srv->listen_fd, NULL, NULL);
            if (fd >= 0) {
                if (srv->n_clients == srv->cap_clients) {
                    int nc = srv->cap_clients ? srv->cap_clients * 2 : 16;
                    store_client *cl = realloc(srv->clients, (size_t)nc * sizeof *cl);
                    if (!cl) { close(fd); continue; }
                    srv->clients = cl; srv->cap_clients = nc;
                }
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                srv->clients[srv->n_clients++] = (store_client){.fd = fd, .last_seen = comm_now()};
                atomic_store(&srv->n_live, srv->n_clients);
            }
        }
    }
    free(pfds);
    return NULL;
}

pdde_status pdde_store_server_init(pdde_context *ctx, const char *addr, pdde_store_server **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_store_server_init: out is NULL");
    *out = NULL;
    char host[256]; int port;
    if (comm_parse_addr(addr ? addr : "127.0.0.1:0", host, sizeof host, &port))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "store server: bad address '%s' (want host:port)", addr);
    struct sockaddr_in sa;
    if (comm_resolve(host, port, &sa))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "store server: cannot resolve '%s'", host);
    pdde_store_server *srv = calloc(1, sizeof *srv);
    if (!srv) return pdde_error(ctx, PDDE_ERR_OOM, "store server: out of memory");
    srv->wake[0] = srv->wake[1] = -1;
    srv->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
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
    if (srv->wake[0] >= 0) { close(srv->wake[0]); close(srv->wake[1]); }
    free(srv);
    return pdde_error(ctx, PDDE_ERR_COMM, "store server: cannot listen on %s: %s", addr, strerror(err));
}

int pdde_store_server_port(const pdde_store_server *srv) { return srv ? srv->port : -1; }

void pdde_store_server_free(pdde_store_server *srv) {
    if (!srv) return;
    ssize_t w = write(srv->wake[1], "x", 1);
    (void)w;
    pthread_join(srv->thread, NULL);
    while (srv->n_clients) store_client_drop(srv, srv->n_clients - 1, 1);
    for (int i = 0; i < srv->n_kv; i++) { free(srv->kv[i].key); free(srv->kv[i].val); }
    free(srv->kv); free(srv->clients);
    close(srv->listen_fd); close(srv->wake[0]); close(srv->wake[1]);
    free(srv);
}

int pdde_store_server_n_clients(const pdde_store_server *srv) { return srv ? atomic_load(&srv->n_live) : 0; }

/* ================================================================================================
 * TCP client */

typedef struct {
    int fd;
    char addr[256];
    double timeout_s;   /* per request: a store that does not answer is as good as lost */
    int broken;         /* a failed round trip leaves the stream unsynchronised: fail fast from then on */
} store_tcp;

static pdde_status store_rpc(store_tcp *t, pdde_context *ctx, int op, const char *key, const void *a, size_t alen,
                             const void *b, size_t blen, void **val, size_t *vlen) {
    if (t->broken) return pdde_error(ctx, PDDE_ERR_PEER_LOST, "store %s: connection lost", t->addr);
    size_t klen = key ? strlen(key) : 0, body = 1 + 12 + klen + alen + blen;
    if (body > STORE_MAX_FRAME) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "store: value too large (%zu bytes)", alen + blen);
    unsigned char *msg = malloc(4 + body);
    if (!msg) return pdde_error(ctx, PDDE_ERR_OOM, "store: out of memory");
    unsigned char *p = msg;
    put_u32(p, (uint32_t)body); p[4] = (unsigned char)op; p += 5;
    const void *fs[3] = {key, a, b}; size_t fl[3] = {klen, alen, blen};
    for (int i = 0; i < 3; i++) { put_u32(p, (uint32_t)fl[i]); p += 4; if (fl[i]) memcpy(p, fs[i], fl[i]); p += fl[i]; }
    int rc = comm_write_all(t->fd, msg, 4 + body, t->timeout_s);
    free(msg);
    unsigned char hdr[12];
    if (!rc) rc = comm_read_all(t->fd, hdr, 12, t->timeout_s);
    if (rc) {
        t->broken = 1;
        return pdde_error(ctx, rc == -2 ? PDDE_ERR_TIMEOUT : PDDE_ERR_PEER_LOST, "store %s: %s", t->addr,
                          rc == -2 ? "no reply in time" : "connection lost");
    }
    int32_t status = (int32_t)get_u32(hdr + 4);
    uint32_t len = get_u32(hdr + 8);
    char *v = malloc((size_t)len + 1);
    if (!v) { t->broken = 1; return pdde_error(ctx, PDDE_ERR_OOM, "store: out of memory"); }
    if (len && comm_read_all(t->fd, v, len, t->timeout_s)) {
        free(v); t->broken = 1;
        return pdde_error(ctx, PDDE_ERR_PEER_LOST, "store %s: connection lost", t->addr);
    }
    v[len] = 0;
    if (val && status == PDDE_OK) { *val = v; *vlen = len; } else free(v);
    if (status == PDDE_ERR_NOT_FOUND) return pdde_error(ctx, status, "store: no key '%s'", key ? key : "");
    if (status) return pdde_error(ctx, status, "store %s: request failed (%s)", t->addr, pdde_status_str(status));
    return PDDE_OK;
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
    unsigned char l[8]; put_u64(l, (uint64_t)(lease_s > 0 ? lease_s * 1e6 : 0));
    return store_rpc(impl, ctx, STORE_OP_LIVENESS, key, val, len, l, 8, NULL, NULL);
}
static pdde_status store_tcp_ping(void *impl, pdde_context *ctx) {
    return store_rpc(impl, ctx, STORE_OP_PING, NULL, NULL, 0, NULL, 0, NULL, NULL);
}
static void store_tcp_close(void *impl) {
    store_tcp *t = impl;
    if (!t->broken) {
        t->timeout_s = 1.0;
        store_rpc(t, NULL, STORE_OP_BYE, NULL, NULL, 0, NULL, 0, NULL, NULL);
    }
    close(t->fd);
    free(t);
}

static const pdde_store_iface store_tcp_iface = {
    PDDE_STORE_API_VERSION, sizeof(pdde_store_iface), "tcp",
    store_tcp_set, store_tcp_get, store_tcp_add, store_tcp_cas, store_tcp_remove,
    NULL, store_tcp_liveness, store_tcp_ping, store_tcp_close,
};

pdde_status pdde_store_connect(pdde_context *ctx, const char *addr, double timeout_s, pdde_store **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_store_connect: out is NULL");
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
    pdde_status st = pdde_store_wrap(ctx, &store_tcp_iface, t, out);
    if (st) store_tcp_close(t);
    return st;
}
