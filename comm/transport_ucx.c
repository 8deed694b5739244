/* comm/transport_ucx.c — the UCX transport: pdde_transport_iface on the UCP tag API.
 *
 * One UCP worker per transport instance. A listen handle is (listener id, listener nonce, worker
 * address). connect() makes an endpoint to the listener's worker and sends HELLO (its connect id, a
 * fresh nonce, its address and a proof: HMAC of the job secret over both nonces, the connect id and
 * the address); accept() probes for HELLOs, checks the proof in constant time (a wrong one is logged
 * and dropped, and a nonce seen before is a replay), assigns a connection id, makes an endpoint back
 * (used for the ACK and to learn of the sender's death) and sends ACK (the connection id and the
 * acceptor's proof over the nonces the other way round); connect() finishes when the ACK arrives and
 * its proof holds. So a process without the secret can neither join a world nor pose as a member.
 * (UCX does not authenticate each message: one who can see the network can still inject messages on
 * a guessed tag; run jobs on a network only the job's hosts can reach.)
 * Tags: bits 63..40 the receiver-assigned connection id (0 = control), bits 39..0 the caller's tag.
 * Endpoints use UCP_ERR_HANDLING_MODE_PEER: a dead peer fails its connections' requests. */

#ifndef PDDE_COMM_TRANSPORT_UCX_C
#define PDDE_COMM_TRANSPORT_UCX_C

#include "util.c"
#include "auth.c"

#include <ucp/api/ucp.h>

#define UCX_TAG_USER_MASK ((UINT64_C(1) << PDDE_TRANSPORT_TAG_BITS) - 1)
#define UCX_TAG_ACK_BIT (UINT64_C(1) << (PDDE_TRANSPORT_TAG_BITS - 1))

typedef struct ucx_conn ucx_conn;

typedef struct {
    ucp_context_h context;
    ucp_worker_h worker;
    ucp_address_t *addr;
    size_t addr_len;
    uint64_t next_listen, next_connect; /* ids of listeners and of pending connects, per worker */
    uint64_t next_conn_id;              /* ids of accepted connections (tags), per worker */
    ucx_conn *pending;                  /* connects waiting for their ACK */
    ucx_conn *closing;                  /* closed connections, freed by ucx_fini */
    int aborting;                       /* after a failure: close without flushing or progressing */
    comm_secret secret;                 /* what HELLO and ACK prove (len 0: an empty key) */
    int refused;                        /* HELLOs refused (the first few are logged) */
} ucx_transport;

typedef struct {
    ucx_transport *tr;
    uint64_t id;
    unsigned char nonce[COMM_NONCE_BYTES];
    void *hello_req;         /* a HELLO being received */
    unsigned char *hello_buf;
    size_t hello_len;
    unsigned char (*seen)[COMM_NONCE_BYTES]; /* the connectors' nonces accepted so far (replays are refused) */
    size_t n_seen;
} ucx_listen;

struct ucx_conn {
    ucx_transport *tr;
    ucp_ep_h ep;
    uint64_t conn_id;        /* receiver-assigned, in the high tag bits */
    volatile int failed;     /* set by the endpoint's error handler */
    /* connect handshake (sender side) */
    uint64_t connect_id;
    unsigned char listen_handle[PDDE_TRANSPORT_HANDLE_MAX];
    size_t listen_handle_len;
    void *hello_req, *ack_req;
    unsigned char *hello_msg;
    unsigned char nonce[COMM_NONCE_BYTES]; /* this connect's nonce */
    unsigned char ack[8 + COMM_SHA256_BYTES]; /* conn id and the acceptor's proof, received or to send */
    ucx_conn *next_pending;
    void *close_req;         /* the endpoint's close in progress */
    ucx_conn *next_closing;
};

/* Lives inside each UCP request (ucp_params.request_size), so requests need no allocation. */
typedef struct {
    ucx_conn *conn;
    int is_recv;
} ucx_req;

static void ucx_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep; (void)status;
    ((ucx_conn *)arg)->failed = 1;
}

static void ucx_req_init(void *request) { memset(request, 0, sizeof(ucx_req)); }

static pdde_status ucx_status(pdde_context *ctx, ucs_status_t s, const char *what) {
    return pdde_error(ctx, PDDE_ERR_COMM, "ucx: %s: %s", what, ucs_status_string(s));
}

/* The UCX options pdde needs that UCX 1.13 reads only from the environment (ucp_config_modify does not
 * reach them), set there unless the user set them. Once a process, by its first pdde_context_init, before
 * pdde starts a thread: a setenv that adds a variable while another thread reads the environment (an etcd
 * client's getaddrinfo, a device runtime) can crash that thread. */
static void transport_env_defaults_once(void) {
    /* Shared memory takes part in the PEER error mode only with these two (the peer's death is then found
     * by keepalive); without them UCX falls back to TCP loopback, 5-10x slower. */
    setenv("UCX_POSIX_ERROR_HANDLING", "y", 0);
    setenv("UCX_SYSV_ERROR_HANDLING", "y", 0);
    /* UCX's memory hooks patch mmap/malloc in a process whose other threads (a device runtime such as
     * PoCL, OpenBLAS) are already running; installing them deadlocked ucp_init now and then. The shared
     * memory and TCP transports do not need them; on InfiniBand set UCX_MEM_EVENTS=y for the
     * registration cache. */
    setenv("UCX_MEM_EVENTS", "n", 0);
    setenv("UCX_MEMTYPE_CACHE", "n", 0);
    setenv("UCX_RCACHE_ENABLE", "n", 0); /* the registration cache is what installs the mmap hooks */
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
}

static void comm_transport_env_defaults(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, transport_env_defaults_once);
}

/* Sets a UCX option unless the user set it in the environment (the environment wins). */
static void ucx_default(ucp_config_t *cfg, const char *name, const char *value) {
    char env[128];
    snprintf(env, sizeof env, "UCX_%s", name);
    if (!getenv(env)) ucp_config_modify(cfg, name, value);
}

static pdde_status ucx_init(pdde_context *ctx, const pdde_transport_params *p, void **out) {
    *out = NULL;
    double peer_timeout = p && p->peer_timeout_s > 0 ? p->peer_timeout_s : 5;
    ucx_transport *tr = calloc(1, sizeof *tr);
    if (!tr) return pdde_error(ctx, PDDE_ERR_OOM, "ucx: out of memory");
    tr->next_listen = tr->next_connect = tr->next_conn_id = 1;
    if (p && p->secret) {
        pdde_status st = comm_secret_set(ctx, &tr->secret, p->secret, strlen(p->secret), "the transport parameters");
        if (st) { free(tr); return st; }
    }
    comm_transport_env_defaults(); /* (done already by pdde_context_init, before pdde started a thread) */
    ucp_config_t *cfg;
    ucs_status_t s = ucp_config_read(NULL, NULL, &cfg);
    if (s != UCS_OK) { free(tr); return ucx_status(ctx, s, "ucp_config_read"); }
    /* shared memory, then TCP; a keepalive well inside peer_timeout bounds failure detection */
    ucx_default(cfg, "TLS", "posix,sysv,cma,tcp,self");
    char ka[32];
    snprintf(ka, sizeof ka, "%.0fms", peer_timeout * 1000 / 4);
    ucx_default(cfg, "KEEPALIVE_INTERVAL", ka);
    /* pdde reports failures itself; UCX's own warnings about them (and about requests dropped on a
     * forced close) would only be noise */
    ucx_default(cfg, "LOG_LEVEL", "error");
    ucp_params_t params = {0};
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_REQUEST_SIZE | UCP_PARAM_FIELD_REQUEST_INIT |
                        UCP_PARAM_FIELD_MT_WORKERS_SHARED;
    params.features = UCP_FEATURE_TAG;
    params.request_size = sizeof(ucx_req);
    params.request_init = ucx_req_init;
    params.mt_workers_shared = 0;
    s = ucp_init(&params, cfg, &tr->context);
    ucp_config_release(cfg);
    if (s != UCS_OK) { free(tr); return ucx_status(ctx, s, "ucp_init"); }
    ucp_worker_params_t wp = {0};
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SERIALIZED; /* pdde serialises all calls with the world's lock */
    s = ucp_worker_create(tr->context, &wp, &tr->worker);
    if (s != UCS_OK) { ucp_cleanup(tr->context); free(tr); return ucx_status(ctx, s, "ucp_worker_create"); }
    s = ucp_worker_get_address(tr->worker, &tr->addr, &tr->addr_len);
    if (s != UCS_OK || tr->addr_len + 8 + COMM_NONCE_BYTES > PDDE_TRANSPORT_HANDLE_MAX) {
        ucp_worker_destroy(tr->worker); ucp_cleanup(tr->context); free(tr);
        return s != UCS_OK ? ucx_status(ctx, s, "ucp_worker_get_address")
                           : pdde_error(ctx, PDDE_ERR_COMM, "ucx: worker address too long");
    }
    *out = tr;
    return PDDE_OK;
}

static void ucx_conn_close(void *conn);

static void ucx_fini(void *p) {
    ucx_transport *tr = p;
    if (!tr) return;
    while (tr->pending) ucx_conn_close(tr->pending); /* connects given up before their ACK came */
    /* flushes towards live peers are quick; peers that do not answer cost at most 1 s in all. After a
     * failure nothing is progressed (see pdde_transport_iface.abort). */
    double deadline = comm_now() + 1.0;
    for (int busy = 1; busy && !tr->aborting && comm_now() < deadline;) {
        ucp_worker_progress(tr->worker);
        busy = 0;
        for (ucx_conn *c = tr->closing; c && !busy; c = c->next_closing)
            busy = c->close_req && ucp_request_check_status(c->close_req) == UCS_INPROGRESS;
    }
    while (tr->closing) {
        ucx_conn *c = tr->closing;
        tr->closing = c->next_closing;
        if (c->close_req) ucp_request_free(c->close_req);
        free(c);
    }
    ucp_worker_release_address(tr->worker, tr->addr);
    ucp_worker_destroy(tr->worker);
    ucp_cleanup(tr->context);
    free(tr);
}

static pdde_status ucx_get_props(void *p, pdde_transport_props *out) {
    (void)p;
    memset(out, 0, sizeof *out);
    snprintf(out->name, sizeof out->name, "ucx");
    /* nominal figures; pdde-bench measures the real ones for the cost model */
    out->bandwidth = 10e9;
    out->latency = 5e-6;
    out->mem_kinds = 1u << PDDE_MEM_HOST;
    return PDDE_OK;
}

static int ucx_progress(void *p) { return (int)ucp_worker_progress(((ucx_transport *)p)->worker); }

static pdde_status ucx_listen_open(void *p, void *handle, size_t *handle_len, void **listen_comm) {
    ucx_transport *tr = p;
    ucx_listen *l = calloc(1, sizeof *l);
    if (!l) return PDDE_ERR_OOM;
    l->tr = tr;
    l->id = tr->next_listen++;
    if (comm_random(l->nonce, sizeof l->nonce)) { free(l); return PDDE_ERR_IO; }
    unsigned char *h = handle;
    put_u64(h, l->id);
    memcpy(h + 8, l->nonce, sizeof l->nonce);
    memcpy(h + 8 + COMM_NONCE_BYTES, tr->addr, tr->addr_len);
    *handle_len = 8 + COMM_NONCE_BYTES + tr->addr_len;
    *listen_comm = l;
    return PDDE_OK;
}

static pdde_status ucx_ep_create(ucx_transport *tr, const void *addr, ucx_conn *c) {
    ucp_ep_params_t ep = {0};
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ucx_err_cb;
    ep.err_handler.arg = c;
    return ucp_ep_create(tr->worker, &ep, &c->ep) == UCS_OK ? PDDE_OK : PDDE_ERR_COMM;
}

/* The request of a send that finished inside ucp_tag_send_nbx (a short message copied straight into
 * the peer's shared-memory FIFO): no UCP request is allocated, tested or freed for it. */
static ucx_req ucx_send_done;

/* A non-blocking tag send/recv that always yields a request (or NULL on error). Sends may complete
 * at once (then the request is &ucx_send_done); receives always get a UCP request, which reports the
 * received length. */
static void *ucx_post(ucx_transport *tr, ucx_conn *c, int recv, void *buf, size_t n, uint64_t tag) {
    ucp_request_param_t prm = {0};
    prm.op_attr_mask = recv ? UCP_OP_ATTR_FLAG_NO_IMM_CMPL : 0;
    ucs_status_ptr_t r = recv ? ucp_tag_recv_nbx(tr->worker, buf, n, tag, ~UINT64_C(0), &prm)
                              : ucp_tag_send_nbx(c->ep, buf, n, tag, &prm);
    if (!recv && r == NULL) return &ucx_send_done; /* UCS_OK: completed in place */
    if (UCS_PTR_IS_ERR(r) || !r) return NULL;
    ucx_req *q = r;
    q->conn = c;
    q->is_recv = recv;
    return r;
}

/* 1 done, 0 pending, -1 failed; releases the request when finished. */
static int ucx_poll_req(void **req) {
    if (!*req) return 1;
    if (*req == &ucx_send_done) { *req = NULL; return 1; }
    ucs_status_t s = ucp_request_check_status(*req);
    if (s == UCS_INPROGRESS) return 0;
    ucp_request_free(*req);
    *req = NULL;
    return s == UCS_OK ? 1 : -1;
}

static void ucx_drop_req(ucx_transport *tr, void **req) {
    if (!*req) return;
    if (*req == &ucx_send_done) { *req = NULL; return; }
    ucp_request_cancel(tr->worker, *req);
    ucp_request_free(*req);
    *req = NULL;
}

/* Starts closing the endpoint; the connection stays allocated (its endpoint's error handler may
 * still name it) until ucx_fini, which waits for all closes together, so that freeing a world with
 * many peers costs at most one flush timeout, not one per peer. */
static void ucx_conn_close(void *conn) {
    ucx_conn *c = conn;
    if (!c) return;
    ucx_transport *tr = c->tr;
    ucx_drop_req(tr, &c->hello_req);
    ucx_drop_req(tr, &c->ack_req);
    if (c->ep) {
        ucp_request_param_t prm = {0};
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = c->failed || tr->aborting ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        void *r = ucp_ep_close_nbx(c->ep, &prm);
        c->close_req = r && !UCS_PTR_IS_ERR(r) ? r : NULL;
        c->ep = NULL;
    }
    for (ucx_conn **pp = &tr->pending; *pp; pp = &(*pp)->next_pending)
        if (*pp == c) { *pp = c->next_pending; break; }
    free(c->hello_msg);
    c->hello_msg = NULL;
    c->next_closing = tr->closing;
    tr->closing = c;
}

/* HELLO layout: connect id (8), the connector's nonce, its proof, its worker address. */
#define UCX_HELLO_HEAD (8 + COMM_NONCE_BYTES + COMM_SHA256_BYTES)
#define UCX_ADDR_OFF (8 + COMM_NONCE_BYTES) /* of the worker address in a listen handle */

/* The connector's proof: HMAC(secret, label | listener nonce | connector nonce | connect id | address),
 * so a recorded HELLO cannot be replayed from another address. */
static void ucx_hello_proof(const ucx_transport *tr, const unsigned char *listen_nonce, const unsigned char *nonce,
                            const unsigned char *connect_id, const void *addr, size_t addr_len,
                            unsigned char out[COMM_SHA256_BYTES]) {
    static const char label[] = "pdde ucx hello";
    const void *parts[5] = {label, listen_nonce, nonce, connect_id, addr};
    size_t lens[5] = {sizeof label, COMM_NONCE_BYTES, COMM_NONCE_BYTES, 8, addr_len};
    comm_hmac(tr->secret.text, tr->secret.len, 5, parts, lens, out);
}

static pdde_status ucx_connect(void *p, const void *handle, size_t handle_len, void **send_comm) {
    ucx_transport *tr = p;
    *send_comm = NULL;
    if (handle_len <= UCX_ADDR_OFF || handle_len > PDDE_TRANSPORT_HANDLE_MAX) return PDDE_ERR_INVALID_ARG;
    /* NCCL-style: called again with the same handle until connected; the state waits in tr->pending */
    ucx_conn *c = tr->pending;
    while (c && (c->listen_handle_len != handle_len || memcmp(c->listen_handle, handle, handle_len))) c = c->next_pending;
    if (!c) {
        if (!(c = calloc(1, sizeof *c))) return PDDE_ERR_OOM;
        c->tr = tr;
        memcpy(c->listen_handle, handle, handle_len);
        c->listen_handle_len = handle_len;
        c->connect_id = tr->next_connect++;
        if (comm_random(c->nonce, sizeof c->nonce)) { free(c); return PDDE_ERR_IO; }
        if (ucx_ep_create(tr, (const unsigned char *)handle + UCX_ADDR_OFF, c)) { free(c); return PDDE_ERR_COMM; }
        size_t n = UCX_HELLO_HEAD + tr->addr_len;
        if (!(c->hello_msg = malloc(n))) { ucx_conn_close(c); return PDDE_ERR_OOM; }
        put_u64(c->hello_msg, c->connect_id);
        memcpy(c->hello_msg + 8, c->nonce, COMM_NONCE_BYTES);
        ucx_hello_proof(tr, (const unsigned char *)handle + 8, c->nonce, c->hello_msg, tr->addr, tr->addr_len,
                        c->hello_msg + 8 + COMM_NONCE_BYTES);
        memcpy(c->hello_msg + UCX_HELLO_HEAD, tr->addr, tr->addr_len);
        c->ack_req = ucx_post(tr, c, 1, c->ack, sizeof c->ack, UCX_TAG_ACK_BIT | c->connect_id);
        c->hello_req = ucx_post(tr, c, 0, c->hello_msg, n, get_u64(handle) & (UCX_TAG_ACK_BIT - 1));
        if (!c->ack_req || !c->hello_req) { ucx_conn_close(c); return PDDE_ERR_COMM; }
        c->next_pending = tr->pending;
        tr->pending = c;
    }
    ucp_worker_progress(tr->worker);
    int hello = ucx_poll_req(&c->hello_req), ack = ucx_poll_req(&c->ack_req);
    if (hello < 0 || ack < 0 || c->failed) { ucx_conn_close(c); return PDDE_ERR_PEER_LOST; }
    if (hello && ack) {
        unsigned char want[COMM_SHA256_BYTES];
        comm_prove(tr->secret.text, tr->secret.len, "pdde ucx ack", c->nonce, (const unsigned char *)handle + 8, want);
        if (!comm_equal_ct(want, c->ack + 8, sizeof want)) { ucx_conn_close(c); return PDDE_ERR_AUTH; }
        for (ucx_conn **pp = &tr->pending; *pp; pp = &(*pp)->next_pending)
            if (*pp == c) { *pp = c->next_pending; break; }
        c->conn_id = get_u64(c->ack);
        free(c->hello_msg);
        c->hello_msg = NULL;
        *send_comm = c;
    }
    return PDDE_OK;
}

static pdde_status ucx_accept(void *lp, void **recv_comm) {
    ucx_listen *l = lp;
    ucx_transport *tr = l->tr;
    *recv_comm = NULL;
    ucp_worker_progress(tr->worker);
    if (!l->hello_req) {
        ucp_tag_recv_info_t info;
        ucp_tag_message_h msg = ucp_tag_probe_nb(tr->worker, l->id, ~UINT64_C(0), 1, &info);
        if (!msg) return PDDE_OK;
        if (info.length <= UCX_HELLO_HEAD || info.length > UCX_HELLO_HEAD + PDDE_TRANSPORT_HANDLE_MAX) {
            /* not a HELLO of ours: take it off the queue and forget it */
            static unsigned char junk[1];
            ucp_request_param_t prm = {0};
            ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(tr->worker, junk, 0, msg, &prm); /* ends truncated */
            if (UCS_PTR_IS_PTR(r)) ucp_request_free(r);
            return PDDE_OK;
        }
        if (!(l->hello_buf = malloc(info.length))) return PDDE_ERR_OOM;
        l->hello_len = info.length;
        ucp_request_param_t prm = {0};
        prm.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
        ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(tr->worker, l->hello_buf, info.length, msg, &prm);
        if (UCS_PTR_IS_ERR(r) || !r) { free(l->hello_buf); l->hello_buf = NULL; return PDDE_ERR_COMM; }
        l->hello_req = r;
    }
    int rc = ucx_poll_req(&l->hello_req);
    if (rc == 0) return PDDE_OK;
    unsigned char *hello = l->hello_buf;
    l->hello_buf = NULL;
    if (rc < 0) { free(hello); return PDDE_ERR_COMM; }
    /* the proof, then the nonce: a HELLO seen before is a replay */
    unsigned char want[COMM_SHA256_BYTES];
    ucx_hello_proof(tr, l->nonce, hello + 8, hello, hello + UCX_HELLO_HEAD, l->hello_len - UCX_HELLO_HEAD, want);
    int ok = comm_equal_ct(want, hello + 8 + COMM_NONCE_BYTES, sizeof want);
    for (size_t i = 0; ok && i < l->n_seen; i++) ok = memcmp(l->seen[i], hello + 8, COMM_NONCE_BYTES) != 0;
    void *grown = ok ? realloc(l->seen, (l->n_seen + 1) * sizeof *l->seen) : NULL;
    if (!ok || !grown) {
        if (ok) { free(hello); return PDDE_ERR_OOM; }
        if (tr->refused++ < 10)
            pdde_log(PDDE_LOG_WARN, "pdde: ucx: refused a connection that did not prove the job secret (pid %d)\n", (int)getpid());
        free(hello);
        return PDDE_OK;
    }
    l->seen = grown;
    memcpy(l->seen[l->n_seen++], hello + 8, COMM_NONCE_BYTES);
    ucx_conn *c = calloc(1, sizeof *c);
    if (!c) { free(hello); return PDDE_ERR_OOM; }
    c->tr = tr;
    c->conn_id = tr->next_conn_id++ & 0xffffff;
    put_u64(c->ack, c->conn_id);
    comm_prove(tr->secret.text, tr->secret.len, "pdde ucx ack", hello + 8, l->nonce, c->ack + 8);
    pdde_status st = ucx_ep_create(tr, hello + UCX_HELLO_HEAD, c);
    if (!st) {
        c->ack_req = ucx_post(tr, c, 0, c->ack, sizeof c->ack, UCX_TAG_ACK_BIT | get_u64(hello));
        if (!c->ack_req) st = PDDE_ERR_COMM;
    }
    free(hello);
    if (st) { ucx_conn_close(c); return st; }
    *recv_comm = c; /* the ACK finishes on its own; ucx_conn_close drops it if it never does */
    return PDDE_OK;
}

static pdde_status ucx_isend(void *sc, const void *buf, size_t n, uint64_t tag, pdde_mem_kind kind, void **req) {
    ucx_conn *c = sc;
    *req = NULL;
    if (kind != PDDE_MEM_HOST) return PDDE_ERR_UNSUPPORTED;
    if (c->failed) return PDDE_ERR_PEER_LOST;
    *req = ucx_post(c->tr, c, 0, (void *)buf, n, c->conn_id << PDDE_TRANSPORT_TAG_BITS | (tag & UCX_TAG_USER_MASK));
    return *req ? PDDE_OK : PDDE_ERR_COMM;
}

static pdde_status ucx_irecv(void *rc, void *buf, size_t n, uint64_t tag, pdde_mem_kind kind, void **req) {
    ucx_conn *c = rc;
    *req = NULL;
    if (kind != PDDE_MEM_HOST) return PDDE_ERR_UNSUPPORTED;
    if (c->failed) return PDDE_ERR_PEER_LOST;
    *req = ucx_post(c->tr, c, 1, buf, n, c->conn_id << PDDE_TRANSPORT_TAG_BITS | (tag & UCX_TAG_USER_MASK));
    return *req ? PDDE_OK : PDDE_ERR_COMM;
}

static void ucx_cancel(void *p, void *req) {
    ucx_drop_req((ucx_transport *)p, &req);
}

static pdde_status ucx_test(void *req, int *done, size_t *nbytes) {
    ucx_req *q = req;
    ucx_conn *c = q->conn;
    ucs_status_t s;
    ucp_tag_recv_info_t info = {0};
    *done = 0;
    if (q == &ucx_send_done) {
        *done = 1;
        if (nbytes) *nbytes = 0;
        return PDDE_OK;
    }
    s = q->is_recv ? ucp_tag_recv_request_test(req, &info) : ucp_request_check_status(req);
    if (s == UCS_INPROGRESS) {
        /* a receive does not fail by itself when its sender dies: its connection's endpoint tells */
        if (!c->failed) return PDDE_OK;
        ucx_drop_req(c->tr, &req);
        *done = 1;
        return PDDE_ERR_PEER_LOST;
    }
    ucp_request_free(req);
    *done = 1;
    if (nbytes) *nbytes = q->is_recv ? info.length : 0;
    if (s == UCS_OK) return PDDE_OK;
    if (s == UCS_ERR_MESSAGE_TRUNCATED) return PDDE_ERR_COMM;
    return c->failed || s == UCS_ERR_CONNECTION_RESET || s == UCS_ERR_ENDPOINT_TIMEOUT || s == UCS_ERR_UNREACHABLE ||
                   s == UCS_ERR_CANCELED
               ? PDDE_ERR_PEER_LOST
               : PDDE_ERR_COMM;
}

static void ucx_close_listen(void *lp) {
    ucx_listen *l = lp;
    if (!l) return;
    ucx_drop_req(l->tr, &l->hello_req);
    free(l->hello_buf);
    free(l->seen);
    free(l);
}

static void ucx_abort(void *p) { ((ucx_transport *)p)->aborting = 1; }

static const pdde_transport_iface ucx_iface = {
    PDDE_TRANSPORT_API_VERSION, sizeof(pdde_transport_iface), "ucx",
    ucx_init, ucx_fini, ucx_get_props, ucx_listen_open, ucx_connect, ucx_accept,
    ucx_isend, ucx_irecv, ucx_test, ucx_cancel, ucx_progress,
    ucx_conn_close, ucx_conn_close, ucx_close_listen, ucx_abort,
};

const pdde_transport_iface *pdde_transport_ucx(void) { return &ucx_iface; }

#endif /* PDDE_COMM_TRANSPORT_UCX_C */
