/* store_wire.h — the built-in store's wire protocol written by hand (comm/store.c documents it), for
 * the tests that play a misbehaving client (test_store, test_store_auth): a request's frame, a reply
 * read with a deadline. Include once, after test_util.h. */
#ifndef PDDE_STORE_WIRE_H
#define PDDE_STORE_WIRE_H
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa)) { close(fd); return -1; }
    return fd;
}

/* One request: op, then key, a and b as length-prefixed fields; 0 when all of it was sent. */
static int raw_request(int fd, int op, const char *key, const void *a, size_t alen, const void *b, size_t blen) {
    size_t klen = key ? strlen(key) : 0, body = 13 + klen + alen + blen;
    unsigned char *m = malloc(4 + body), *p = m;
    put32(p, (uint32_t)body); p[4] = (unsigned char)op; p += 5;
    const void *f[3] = {key, a, b};
    size_t fl[3] = {klen, alen, blen};
    for (int i = 0; i < 3; i++) { put32(p, (uint32_t)fl[i]); p += 4; if (fl[i]) memcpy(p, f[i], fl[i]); p += fl[i]; }
    size_t off = 0;
    while (off < 4 + body) {
        ssize_t w = send(fd, m + off, 4 + body - off, MSG_NOSIGNAL);
        if (w <= 0) break;
        off += (size_t)w;
    }
    free(m);
    return off == 4 + body ? 0 : -1;
}

static int raw_read(int fd, void *buf, size_t n, double timeout_s) {
    double deadline = test_now() + timeout_s;
    for (size_t got = 0; got < n;) {
        struct pollfd q = {fd, POLLIN, 0};
        int ms = (int)((deadline - test_now()) * 1000);
        if (ms <= 0 || poll(&q, 1, ms) <= 0) return -2;
        ssize_t r = recv(fd, (char *)buf + got, n - got, 0);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

/* One reply: 0 with its status and value (its first cap - 1 bytes kept in val, NUL-terminated; its
 * length in *len), -1 closed, -2 no reply within timeout_s. val and len may be NULL. */
static int raw_reply(int fd, int32_t *status, void *val, size_t cap, size_t *len, double timeout_s) {
    unsigned char h[12];
    int rc = raw_read(fd, h, 12, timeout_s);
    if (rc) return rc;
    *status = (int32_t)get32(h + 4);
    uint32_t n = get32(h + 8);
    char *v = malloc(n + 1);
    rc = raw_read(fd, v, n, timeout_s);
    if (!rc && val && cap) { size_t k = n < cap - 1 ? n : cap - 1; memcpy(val, v, k); ((char *)val)[k] = 0; }
    if (len) *len = n;
    free(v);
    return rc;
}
#endif
