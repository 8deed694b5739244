/* comm/etcd.c — etcd (v3.4 or later) as a pdde_store backend, through its v3 JSON gateway over HTTP
 * (POST /v3/kv/put, /v3/kv/range, /v3/kv/deleterange, /v3/kv/txn, /v3/lease/grant, /v3/lease/keepalive,
 * /v3/lease/revoke, /v3/watch; keys and values base64) with libcurl.
 *
 * The store's operations map onto etcd's: set = put, get = range, compare_set and add = a transaction
 * on the key's value or revision (add retries when another client changed it in between), remove =
 * deleterange, wait = a watch from the revision after a range that found nothing. Death notices
 * (set_liveness) are leases: the client grants one of lease_s (etcd's minimum is 2 s) and keeps it
 * alive on every ping; it registers its notice under __pdde/reg/<key>/<lease> (no lease) and puts
 * __pdde/alive/<lease> on the lease. When the lease ends (the process died, froze, or lost etcd for
 * longer than the lease), etcd deletes the alive key; a get that finds no key then looks for
 * registrations of it whose alive key is gone, and sets the notice (create-only transaction) for
 * everyone. A clean close deletes the registration and revokes the lease. pdde_store_etcd_set_leased
 * puts a key on the lease itself, so etcd deletes it when the lease ends (pdde-run keeps an elastic
 * job's store address so). pdde_store_etcd_remove_prefix deletes a prefix's keys and registrations
 * (a range delete each: how pdde-run clears an elastic run's keys).
 *
 * etcd is reached in the clear without authentication: run it on 127.0.0.1 or a network only the
 * job's hosts reach. Without libcurl (PDDE_HAVE_CURL unset) the connect call says so. */

#ifndef PDDE_COMM_ETCD_C
#define PDDE_COMM_ETCD_C

#include "util.c"
#include "store.c"

#ifdef PDDE_HAVE_CURL
#include <curl/curl.h>
#include <math.h>

static void etcd_global_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

typedef struct {
    CURL *curl;
    char endpoint[256];       /* http://host:port */
    double timeout_s;
    long long lease;          /* 0: none */
    double lease_s;           /* the lease asked for; while one is held it bounds the wait for a reply (etcd_post) */
    char *live_key;           /* the registered notice's key */
    char *buf;                /* the last reply */
    size_t len, cap;
    int stop_watch;           /* the watch callback saw an event */
    CURLcode last_rc;         /* curl's outcome of the last request (the first request tells a URL that can never work) */
} store_etcd;

static size_t etcd_write(char *data, size_t size, size_t n, void *arg) {
    store_etcd *t = arg;
    size_t k = size * n;
    if (t->len + k + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 4096;
        while (cap < t->len + k + 1) cap *= 2;
        char *b = realloc(t->buf, cap);
        if (!b) return 0;
        t->buf = b, t->cap = cap;
    }
    memcpy(t->buf + t->len, data, k);
    t->len += k;
    t->buf[t->len] = 0;
    return k;
}

static const char etcd_b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* base64 of n bytes into out (4 * ((n + 2) / 3) + 1 bytes). */
static void etcd_b64_encode(const void *in, size_t n, char *out) {
    const unsigned char *p = in;
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        out[o++] = etcd_b64[v >> 18 & 63], out[o++] = etcd_b64[v >> 12 & 63];
        out[o++] = i + 1 < n ? etcd_b64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? etcd_b64[v & 63] : '=';
    }
    out[o] = 0;
}

/* Decodes base64 text of length n into a malloc'ed NUL-terminated buffer; NULL on bad input. */
static char *etcd_b64_decode(const char *in, size_t n, size_t *len) {
    char *out = malloc(n / 4 * 3 + 4);
    if (!out) return NULL;
    size_t o = 0;
    uint32_t v = 0;
    int bits = 0;
    for (size_t i = 0; i < n && in[i] != '='; i++) {
        const char *c = strchr(etcd_b64, in[i]);
        if (!c || !in[i]) { free(out); return NULL; }
        v = v << 6 | (uint32_t)(c - etcd_b64), bits += 6;
        if (bits >= 8) bits -= 8, out[o++] = (char)(v >> bits & 255);
    }
    out[o] = 0;
    *len = o;
    return out;
}

/* The string value of "name":"..." in the reply after `from` (NULL: absent); *n its length. */
static const char *etcd_field(const char *from, const char *name, size_t *n) {
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":\"", name);
    const char *p = from ? strstr(from, pat) : NULL;
    if (!p) return NULL;
    p += strlen(pat);
    const char *e = strchr(p, '"');
    if (!e) return NULL;
    *n = (size_t)(e - p);
    return p;
}

/* POSTs body to path; the reply is in t->buf. watch: a streaming request, stopped at its first event or
 * after timeout_s. A client holding a lease waits for any other reply at most twice the lease, as the
 * built-in store's client does: etcd answers at once, so one silent that long is down or out of reach,
 * and a caller that judges so by the time since the last reply (an elastic joiner) must get control
 * back by then. */
static pdde_status etcd_post(store_etcd *t, pdde_context *ctx, const char *path, const char *body, double timeout_s, int watch) {
    char url[320];
    snprintf(url, sizeof url, "%s%s", t->endpoint, path);
    t->len = 0;
    if (t->buf) t->buf[0] = 0;
    if (!watch && t->lease && 2 * t->lease_s < timeout_s) timeout_s = 2 * t->lease_s;
    curl_easy_setopt(t->curl, CURLOPT_URL, url);
    curl_easy_setopt(t->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(t->curl, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    CURLcode rc = t->last_rc = curl_easy_perform(t->curl);
    long code = 0;
    curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
    if (watch && (rc == CURLE_OPERATION_TIMEDOUT || rc == CURLE_WRITE_ERROR || rc == CURLE_OK)) return PDDE_OK;
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return pdde_error(ctx, PDDE_ERR_TIMEOUT, "etcd %s: no reply to %s within %.3g s", t->endpoint, path, timeout_s);
    if (rc != CURLE_OK)
        return pdde_error(ctx, PDDE_ERR_COMM, "etcd %s: %s: %s (is etcd running there?)", t->endpoint, path, curl_easy_strerror(rc));
    if (code != 200)
        return pdde_error(ctx, PDDE_ERR_COMM, "etcd %s: %s: HTTP %ld: %.200s", t->endpoint, path, code, t->buf ? t->buf : "");
    return PDDE_OK;
}

/* A JSON body with the base64 of key (and of value when given): {"key":"..","value":".."<extra>}. */
static char *etcd_body(const char *key, const void *val, size_t vlen, const char *extra) {
    size_t kl = strlen(key), cap = 4 * ((kl + 2) / 3) + 4 * ((vlen + 2) / 3) + (extra ? strlen(extra) : 0) + 64;
    char *b = malloc(cap), *p = b;
    if (!b) return NULL;
    p += sprintf(p, "{\"key\":\"");
    etcd_b64_encode(key, kl, p), p += strlen(p);
    if (val) {
        p += sprintf(p, "\",\"value\":\"");
        etcd_b64_encode(val, vlen, p), p += strlen(p);
    }
    sprintf(p, "\"%s}", extra ? extra : "");
    return b;
}

static pdde_status etcd_put(store_etcd *t, pdde_context *ctx, const char *key, const void *val, size_t len, long long lease) {
    char extra[64] = "";
    if (lease) snprintf(extra, sizeof extra, ",\"lease\":\"%lld\"", lease);
    char *b = etcd_body(key, val, len, extra);
    if (!b) return pdde_error(ctx, PDDE_ERR_OOM, "etcd: out of memory");
    pdde_status st = etcd_post(t, ctx, "/v3/kv/put", b, t->timeout_s, 0);
    free(b);
    return st;
}

/* Reads key: *val (malloc'ed) or PDDE_ERR_NOT_FOUND; *mod its mod_revision, *rev the store's revision. */
static pdde_status etcd_range(store_etcd *t, pdde_context *ctx, const char *key, void **val, size_t *len, long long *mod,
                              long long *rev) {
    char *b = etcd_body(key, NULL, 0, NULL);
    if (!b) return pdde_error(ctx, PDDE_ERR_OOM, "etcd: out of memory");
    pdde_status st = etcd_post(t, ctx, "/v3/kv/range", b, t->timeout_s, 0);
    free(b);
    if (st) return st;
    size_t n;
    const char *r = etcd_field(t->buf, "revision", &n);
    if (rev) *rev = r ? atoll(r) : 0;
    const char *kvs = strstr(t->buf, "\"kvs\"");
    if (!kvs) return PDDE_ERR_NOT_FOUND;
    const char *m = etcd_field(kvs, "mod_revision", &n);
    if (mod) *mod = m ? atoll(m) : 0;
    const char *v = etcd_field(kvs, "value", &n);
    if (val) {
        *val = v ? etcd_b64_decode(v, n, len) : calloc(1, 1);
        if (!v) *len = 0;
        if (!*val) return pdde_error(ctx, PDDE_ERR_CORRUPT, "etcd %s: a value that is not base64", t->endpoint);
    }
    return PDDE_OK;
}

/* A transaction: if compare (a JSON object) holds, put key = val. *swapped whether it did. */
static pdde_status etcd_txn_put(store_etcd *t, pdde_context *ctx, const char *compare, const char *key, const void *val, size_t len,
                                int *swapped) {
    char *put = etcd_body(key, val, len, NULL);
    if (!put) return pdde_error(ctx, PDDE_ERR_OOM, "etcd: out of memory");
    size_t cap = strlen(put) + strlen(compare) + 128;
    char *b = malloc(cap);
    if (!b) { free(put); return pdde_error(ctx, PDDE_ERR_OOM, "etcd: out of memory"); }
    snprintf(b, cap, "{\"compare\":[%s],\"success\":[{\"request_put\":%s}]}", compare, put);
    free(put);
    pdde_status st = etcd_post(t, ctx, "/v3/kv/txn", b, t->timeout_s, 0);
    free(b);
    if (!st && swapped) *swapped = strstr(t->buf, "\"succeeded\":true") != NULL;
    return st;
}

static pdde_status store_etcd_set(void *impl, pdde_context *ctx, const char *key, const void *val, size_t len) {
    return etcd_put(impl, ctx, key, val, len, 0);
}

/* A notice whose registrant's lease ended: set it (the first one) and give it back. */
static pdde_status etcd_dead_notice(store_etcd *t, pdde_context *ctx, const char *key, void **val, size_t *len) {
    size_t kl = strlen(key);
    char *prefix = malloc(kl + 32), *end = malloc(kl + 32);
    if (!prefix || !end) { free(prefix), free(end); return PDDE_ERR_OOM; }
    snprintf(prefix, kl + 32, "__pdde/reg/%s/", key);
    snprintf(end, kl + 32, "__pdde/reg/%s0", key); /* ('0' follows '/') */
    char *kb = malloc(4 * (kl + 34) / 3 + 8), *eb = malloc(4 * (kl + 34) / 3 + 8), body[2048];
    pdde_status st = PDDE_ERR_NOT_FOUND;
    if (kb && eb && 2 * (kl + 34) < 1000) {
        etcd_b64_encode(prefix, strlen(prefix), kb), etcd_b64_encode(end, strlen(end), eb);
        snprintf(body, sizeof body, "{\"key\":\"%s\",\"range_end\":\"%s\"}", kb, eb);
        st = etcd_post(t, ctx, "/v3/kv/range", body, t->timeout_s, 0);
    }
    free(kb), free(eb), free(end);
    char *regs = st ? NULL : strdup(t->buf ? t->buf : "");
    if (st || !regs) { free(prefix), free(regs); return st ? st : PDDE_ERR_OOM; }
    st = PDDE_ERR_NOT_FOUND;
    for (const char *p = strstr(regs, "\"kvs\""); p && st == PDDE_ERR_NOT_FOUND;) {
        size_t n, vn;
        const char *k = etcd_field(p, "key", &n);
        if (!k) break;
        const char *v = etcd_field(k + n, "value", &vn);
        size_t kl2;
        char *name = etcd_b64_decode(k, n, &kl2);
        const char *lease = name ? strrchr(name, '/') : NULL;
        char alive[64];
        snprintf(alive, sizeof alive, "__pdde/alive/%s", lease ? lease + 1 : "");
        if (lease && etcd_range(t, ctx, alive, NULL, NULL, NULL, NULL) == PDDE_ERR_NOT_FOUND && v) {
            size_t notice_len;
            char *notice = etcd_b64_decode(v, vn, &notice_len);
            if (notice) {
                char cmp[1024], kb2[800];
                if (strlen(key) < 500) {
                    etcd_b64_encode(key, strlen(key), kb2);
                    snprintf(cmp, sizeof cmp, "{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"0\"}", kb2);
                    etcd_txn_put(t, ctx, cmp, key, notice, notice_len, NULL);
                }
                free(notice);
                st = etcd_range(t, ctx, key, val, len, NULL, NULL); /* the first notice set, ours or another's */
            }
        }
        free(name);
        p = v ? v + vn : k + n;
    }
    free(prefix), free(regs);
    return st;
}

static pdde_status store_etcd_get(void *impl, pdde_context *ctx, const char *key, void **val, size_t *len) {
    store_etcd *t = impl;
    *val = NULL, *len = 0;
    pdde_status st = etcd_range(t, ctx, key, val, len, NULL, NULL);
    if (st == PDDE_ERR_NOT_FOUND) st = etcd_dead_notice(t, ctx, key, val, len);
    if (st == PDDE_ERR_NOT_FOUND) return pdde_error(ctx, st, "store: no key '%s'", key);
    return st;
}

static pdde_status store_etcd_add(void *impl, pdde_context *ctx, const char *key, int64_t delta, int64_t *out) {
    store_etcd *t = impl;
    char kb[4200];
    if (strlen(key) > 3000) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "etcd: key too long");
    etcd_b64_encode(key, strlen(key), kb);
    for (int tries = 0; tries < 1000; tries++) {
        void *v = NULL;
        size_t len = 0;
        long long mod = 0;
        pdde_status st = etcd_range(t, ctx, key, &v, &len, &mod, NULL);
        if (st && st != PDDE_ERR_NOT_FOUND) return st;
        long long now = v ? atoll(v) : 0, sum;
        free(v);
        if (__builtin_add_overflow(now, (long long)delta, &sum))
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "etcd: adding %lld to '%s' overflows 64 bits", (long long)delta, key);
        char num[32], cmp[4400];
        int n = snprintf(num, sizeof num, "%lld", sum);
        if (st == PDDE_ERR_NOT_FOUND) snprintf(cmp, sizeof cmp, "{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"0\"}", kb);
        else snprintf(cmp, sizeof cmp, "{\"key\":\"%s\",\"target\":\"MOD\",\"mod_revision\":\"%lld\"}", kb, mod);
        int swapped = 0;
        if ((st = etcd_txn_put(t, ctx, cmp, key, num, (size_t)n, &swapped))) return st;
        if (swapped) { if (out) *out = sum; return PDDE_OK; }
    }
    return pdde_error(ctx, PDDE_ERR_TIMEOUT, "etcd: add to '%s' lost 1000 races in a row", key);
}

static pdde_status store_etcd_cas(void *impl, pdde_context *ctx, const char *key, const void *expected, size_t elen, const void *desired,
                                  size_t dlen, int *swapped) {
    store_etcd *t = impl;
    size_t kl = strlen(key);
    char *kb = malloc(4 * (kl + 2) / 3 + 8), *eb = malloc(4 * (elen + 2) / 3 + 8), *cmp = malloc(4 * (kl + elen + 4) / 3 + 128);
    pdde_status st = PDDE_ERR_OOM;
    if (kb && eb && cmp) {
        etcd_b64_encode(key, kl, kb), etcd_b64_encode(expected, elen, eb);
        if (!elen) sprintf(cmp, "{\"key\":\"%s\",\"target\":\"CREATE\",\"create_revision\":\"0\"}", kb);
        else sprintf(cmp, "{\"key\":\"%s\",\"target\":\"VALUE\",\"value\":\"%s\"}", kb, eb);
        st = etcd_txn_put(t, ctx, cmp, key, desired, dlen, swapped);
    }
    free(kb), free(eb), free(cmp);
    return st == PDDE_ERR_OOM ? pdde_error(ctx, st, "etcd: out of memory") : st;
}

static pdde_status store_etcd_remove(void *impl, pdde_context *ctx, const char *key) {
    store_etcd *t = impl;
    char *b = etcd_body(key, NULL, 0, NULL);
    if (!b) return pdde_error(ctx, PDDE_ERR_OOM, "etcd: out of memory");
    pdde_status st = etcd_post(t, ctx, "/v3/kv/deleterange", b, t->timeout_s, 0);
    free(b);
    if (!st && !strstr(t->buf, "\"deleted\"")) return PDDE_ERR_NOT_FOUND;
    return st;
}

/* A watch stops at its first event: the write callback ends the transfer. */
static size_t etcd_watch_write(char *data, size_t size, size_t n, void *arg) {
    store_etcd *t = arg;
    size_t k = etcd_write(data, size, n, arg);
    if (t->buf && strstr(t->buf, "\"events\"")) { t->stop_watch = 1; return 0; }
    return k;
}

static pdde_status store_etcd_wait(void *impl, pdde_context *ctx, const char *key, double timeout_s) {
    store_etcd *t = impl;
    double deadline = comm_now() + timeout_s;
    for (;;) {
        long long rev = 0;
        void *v = NULL;
        size_t len;
        pdde_status st = etcd_range(t, ctx, key, &v, &len, NULL, &rev);
        free(v);
        if (st != PDDE_ERR_NOT_FOUND) return st;
        double left = deadline - comm_now();
        if (left <= 0) return pdde_error(ctx, PDDE_ERR_TIMEOUT, "store: key '%s' did not appear within %.3g s", key, timeout_s);
        /* watch from the next revision: the key's creation wakes us (at most 1 s per watch, then look again) */
        char kb[4200], body[4400];
        if (strlen(key) > 3000) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "etcd: key too long");
        etcd_b64_encode(key, strlen(key), kb);
        snprintf(body, sizeof body, "{\"create_request\":{\"key\":\"%s\",\"start_revision\":\"%lld\"}}", kb, rev + 1);
        t->stop_watch = 0;
        curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, etcd_watch_write);
        st = etcd_post(t, ctx, "/v3/watch", body, left < 1 ? left : 1, 1);
        curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, etcd_write);
        if (st) return st;
    }
}

static pdde_status store_etcd_liveness(void *impl, pdde_context *ctx, const char *key, const void *val, size_t len, double lease_s) {
    store_etcd *t = impl;
    char name[4400];
    if (t->live_key) { /* withdraw the one before */
        snprintf(name, sizeof name, "__pdde/reg/%.3000s/%lld", t->live_key, t->lease);
        store_etcd_remove(t, NULL, name);
        free(t->live_key), t->live_key = NULL;
    }
    if (t->lease) {
        char body[64];
        snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", t->lease);
        etcd_post(t, NULL, "/v3/lease/revoke", body, t->timeout_s, 0);
        t->lease = 0;
    }
    if (!*key) return PDDE_OK;
    if (strlen(key) > 3000) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "etcd: key too long");
    char body[64];
    long ttl = (long)ceil(lease_s > 2 ? lease_s : 2); /* (etcd's least) */
    snprintf(body, sizeof body, "{\"TTL\":\"%ld\"}", ttl);
    /* the grant waits for its reply at most twice the lease asked for, as every request does once the
     * lease is held (etcd_post): a caller that registers a lease judges etcd lost at that scale */
    double wait = lease_s > 0 && 2 * lease_s < t->timeout_s ? 2 * lease_s : t->timeout_s;
    pdde_status st = etcd_post(t, ctx, "/v3/lease/grant", body, wait, 0);
    size_t n;
    const char *id = st ? NULL : etcd_field(t->buf, "ID", &n);
    if (!st && !id) return pdde_error(ctx, PDDE_ERR_COMM, "etcd %s: lease grant without an ID: %.200s", t->endpoint, t->buf);
    if (st) return st;
    t->lease = atoll(id);
    t->lease_s = lease_s > 0 ? lease_s : ttl;
    snprintf(name, sizeof name, "__pdde/alive/%lld", t->lease);
    if ((st = etcd_put(t, ctx, name, "", 0, t->lease))) return st;
    snprintf(name, sizeof name, "__pdde/reg/%s/%lld", key, t->lease);
    if ((st = etcd_put(t, ctx, name, val, len, 0))) return st;
    t->live_key = strdup(key);
    return t->live_key ? PDDE_OK : pdde_error(ctx, PDDE_ERR_OOM, "etcd: out of memory");
}

static pdde_status store_etcd_ping(void *impl, pdde_context *ctx) {
    store_etcd *t = impl;
    if (!t->lease) return PDDE_OK;
    char body[64];
    snprintf(body, sizeof body, "{\"ID\":\"%lld\"}", t->lease);
    pdde_status st = etcd_post(t, ctx, "/v3/lease/keepalive", body, t->timeout_s, 0);
    if (!st && !strstr(t->buf, "\"TTL\""))
        return pdde_error(ctx, PDDE_ERR_PEER_LOST, "etcd %s: the lease of this client ended (it was silent too long)", t->endpoint);
    return st;
}

/* Puts key on this client's lease: etcd deletes it when the lease ends. */
static pdde_status store_etcd_set_leased(store_etcd *t, pdde_context *ctx, const char *key, const void *val, size_t len) {
    if (!t->lease)
        return pdde_error(ctx, PDDE_ERR_STATE, "etcd %s: '%s' is to be bound to this client's lease, and it holds none "
                          "(pdde_store_set_liveness first)", t->endpoint, key);
    return etcd_put(t, ctx, key, val, len, t->lease);
}

/* Deletes every key that starts with prefix, and the death-notice registrations under
 * __pdde/reg/<prefix>: a range delete each, [prefix, prefix with its last byte incremented). */
static pdde_status store_etcd_remove_prefix(store_etcd *t, pdde_context *ctx, const char *prefix) {
    size_t pl = strlen(prefix);
    if (!pl || pl > 1000) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "etcd: a prefix of 1 to 1000 bytes, not %zu", pl);
    pdde_status st = PDDE_OK;
    for (int reg = 0; reg < 2 && !st; reg++) {
        char from[1100], to[1100], fb[1500], tb[1500], body[3100];
        snprintf(from, sizeof from, "%s%s", reg ? "__pdde/reg/" : "", prefix);
        snprintf(to, sizeof to, "%s", from);
        to[strlen(to) - 1]++; /* (a prefix ending in 0xff would wrap: keys here are text) */
        etcd_b64_encode(from, strlen(from), fb), etcd_b64_encode(to, strlen(to), tb);
        snprintf(body, sizeof body, "{\"key\":\"%s\",\"range_end\":\"%s\"}", fb, tb);
        st = etcd_post(t, ctx, "/v3/kv/deleterange", body, t->timeout_s, 0);
    }
    return st;
}

static void store_etcd_close(void *impl) {
    store_etcd *t = impl;
    double was = t->timeout_s;
    t->timeout_s = 1;
    store_etcd_liveness(t, NULL, "", "", 0, 0); /* a clean goodbye: no death notice */
    t->timeout_s = was;
    curl_easy_cleanup(t->curl);
    free(t->buf), free(t->live_key);
    free(t);
}

static const pdde_store_iface store_etcd_iface = {
    PDDE_STORE_API_VERSION, sizeof(pdde_store_iface), "etcd",
    store_etcd_set, store_etcd_get, store_etcd_add, store_etcd_cas, store_etcd_remove,
    store_etcd_wait, store_etcd_liveness, store_etcd_ping, store_etcd_close,
};

pdde_status pdde_store_etcd_connect(pdde_context *ctx, const char *endpoint, double timeout_s, pdde_store **out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_store_etcd_connect: out is NULL");
    *out = NULL;
    if (!endpoint || (strncmp(endpoint, "http://", 7) && strncmp(endpoint, "etcd://", 7)) || strlen(endpoint) > 200)
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "etcd: endpoint '%s': want http://HOST:PORT", endpoint ? endpoint : "(null)");
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, etcd_global_init);
    store_etcd *t = calloc(1, sizeof *t);
    if (!t || !(t->curl = curl_easy_init())) { free(t); return pdde_error(ctx, PDDE_ERR_OOM, "etcd: cannot start a curl handle"); }
    const char *hp = endpoint + 7;
    size_t hl = strcspn(hp, "/");
    /* (a port curl would refuse: said here, as the URL that was given) */
    const char *colon = NULL; /* (the last one: [::1]:2379) */
    for (size_t k = 0; k < hl; k++)
        if (hp[k] == ':') colon = hp + k;
    char *port_end = NULL;
    long port = colon ? strtol(colon + 1, &port_end, 10) : 0;
    if (!colon || colon == hp || port_end != hp + hl || colon + 1 == port_end || port < 1 || port > 65535) {
        curl_easy_cleanup(t->curl), free(t);
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "etcd: endpoint '%s': want HOST:PORT with a port 1..65535", endpoint);
    }
    snprintf(t->endpoint, sizeof t->endpoint, "http://%.*s", (int)hl, hp);
    t->timeout_s = timeout_s > 0 ? (timeout_s < 10 ? timeout_s : 10) : 10;
    curl_easy_setopt(t->curl, CURLOPT_WRITEFUNCTION, etcd_write);
    curl_easy_setopt(t->curl, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->curl, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(t->curl, CURLOPT_PROTOCOLS_STR, "http");
    /* the first request retries until etcd answers or timeout_s passes (ranks may start first, and a
     * refused connection is an etcd still starting); a URL curl cannot use or a host that does not
     * resolve never works: those fail at once */
    double deadline = comm_now() + (timeout_s > 0 ? timeout_s : 30);
    pdde_status st;
    while ((st = etcd_post(t, ctx, "/v3/maintenance/status", "{}", t->timeout_s, 0)) && comm_now() < deadline) {
        if (t->last_rc == CURLE_COULDNT_RESOLVE_HOST || t->last_rc == CURLE_URL_MALFORMAT || t->last_rc == CURLE_UNSUPPORTED_PROTOCOL) {
            st = pdde_error(ctx, PDDE_ERR_INVALID_ARG, "etcd %s: %s (a wrong host name or URL: not retried)", t->endpoint,
                            curl_easy_strerror(t->last_rc));
            break;
        }
        comm_sleep(0.05);
    }
    if (!st) st = pdde_store_wrap(ctx, &store_etcd_iface, t, out);
    if (st) {
        curl_easy_cleanup(t->curl);
        free(t->buf), free(t);
    }
    return st;
}

pdde_status pdde_store_etcd_set_leased(pdde_store *s, const char *key, const void *val, size_t len) {
    STORE_CHECK(s, key);
    if (s->iface != &store_etcd_iface)
        return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "pdde_store_etcd_set_leased: store %s is not etcd", s->iface->name);
    return store_etcd_set_leased(s->impl, s->ctx, key, val, len);
}

pdde_status pdde_store_etcd_remove_prefix(pdde_store *s, const char *prefix) {
    STORE_CHECK(s, prefix);
    if (s->iface != &store_etcd_iface)
        return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "pdde_store_etcd_remove_prefix: store %s is not etcd", s->iface->name);
    return store_etcd_remove_prefix(s->impl, s->ctx, prefix);
}

#else /* no libcurl */

pdde_status pdde_store_etcd_connect(pdde_context *ctx, const char *endpoint, double timeout_s, pdde_store **out) {
    (void)endpoint, (void)timeout_s;
    if (out) *out = NULL;
    return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "etcd: pdde was built without libcurl (PDDE_HAVE_CURL; Debian: libcurl4-openssl-dev)");
}

pdde_status pdde_store_etcd_set_leased(pdde_store *s, const char *key, const void *val, size_t len) {
    (void)key, (void)val, (void)len;
    return pdde_error(s ? s->ctx : NULL, PDDE_ERR_UNAVAILABLE, "etcd: pdde was built without libcurl (PDDE_HAVE_CURL)");
}

pdde_status pdde_store_etcd_remove_prefix(pdde_store *s, const char *prefix) {
    (void)prefix;
    return pdde_error(s ? s->ctx : NULL, PDDE_ERR_UNAVAILABLE, "etcd: pdde was built without libcurl (PDDE_HAVE_CURL)");
}

#endif
#endif /* PDDE_COMM_ETCD_C */
