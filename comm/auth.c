/* comm/auth.c — what the job's connections prove: SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104),
 * a constant-time comparison, random bytes, and the job secret (from the environment, a private
 * file, or made here). The store (store.c) and the transport (transport_ucx.c) run challenge-response
 * exchanges over these: each side sends a fresh random nonce and proves it holds the secret by an HMAC
 * over both nonces, so a recorded exchange cannot be replayed and the secret never travels. */

#ifndef PDDE_COMM_AUTH_C
#define PDDE_COMM_AUTH_C

#include "util.c"

#include <fcntl.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/stat.h>

#define COMM_SHA256_BYTES 32
#define COMM_NONCE_BYTES 32
#define COMM_SECRET_MIN 16   /* bytes: shorter secrets are refused */
#define COMM_SECRET_MAX 256

typedef struct {
    uint32_t h[8];
    uint64_t bytes;          /* message length so far */
    unsigned char buf[64];   /* a partial block */
} comm_sha256;

static const uint32_t comm_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t comm_ror(uint32_t x, int n) { return x >> n | x << (32 - n); }

static void comm_sha256_block(comm_sha256 *s, const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = comm_ror(w[i - 15], 7) ^ comm_ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = comm_ror(w[i - 2], 17) ^ comm_ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (comm_ror(e, 6) ^ comm_ror(e, 11) ^ comm_ror(e, 25)) + ((e & f) ^ (~e & g)) + comm_sha256_k[i] + w[i];
        uint32_t t2 = (comm_ror(a, 2) ^ comm_ror(a, 13) ^ comm_ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    s->h[0] += a; s->h[1] += b; s->h[2] += c; s->h[3] += d; s->h[4] += e; s->h[5] += f; s->h[6] += g; s->h[7] += h;
}

static void comm_sha256_init(comm_sha256 *s) {
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->bytes = 0;
}

static void comm_sha256_update(comm_sha256 *s, const void *data, size_t n) {
    if (n == 0) return; /* (data may be NULL then) */
    const unsigned char *p = data;
    size_t have = (size_t)(s->bytes % 64);
    s->bytes += n;
    if (have) {
        size_t take = 64 - have < n ? 64 - have : n;
        memcpy(s->buf + have, p, take);
        p += take; n -= take;
        if (have + take < 64) return;
        comm_sha256_block(s, s->buf);
    }
    for (; n >= 64; p += 64, n -= 64) comm_sha256_block(s, p);
    memcpy(s->buf, p, n);
}

static void comm_sha256_final(comm_sha256 *s, unsigned char out[COMM_SHA256_BYTES]) {
    uint64_t bits = s->bytes * 8;
    unsigned char pad[72] = {0x80};
    size_t have = (size_t)(s->bytes % 64), npad = have < 56 ? 56 - have : 120 - have;
    for (int i = 0; i < 8; i++) pad[npad + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
    comm_sha256_update(s, pad, npad + 8);
    for (int i = 0; i < 8; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (unsigned char)(s->h[i] >> (24 - 8 * j));
}

/* HMAC-SHA256 of the concatenation of parts (n_parts pointers and lengths): the messages of the
 * handshakes are a label and nonces, hashed without copying them together. */
static void comm_hmac(const void *key, size_t klen, int n_parts, const void *const *parts, const size_t *lens,
                      unsigned char out[COMM_SHA256_BYTES]) {
    unsigned char k[64] = {0}, pad[64], inner[COMM_SHA256_BYTES];
    comm_sha256 s;
    if (klen > 64) {
        comm_sha256_init(&s);
        comm_sha256_update(&s, key, klen);
        comm_sha256_final(&s, k);
    } else if (klen) {
        memcpy(k, key, klen);
    }
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    comm_sha256_init(&s);
    comm_sha256_update(&s, pad, 64);
    for (int i = 0; i < n_parts; i++) comm_sha256_update(&s, parts[i], lens[i]);
    comm_sha256_final(&s, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    comm_sha256_init(&s);
    comm_sha256_update(&s, pad, 64);
    comm_sha256_update(&s, inner, sizeof inner);
    comm_sha256_final(&s, out);
}

void pdde_sha256(const void *data, size_t n, unsigned char out[32]) {
    if (!out || (!data && n)) return;
    comm_sha256 s;
    comm_sha256_init(&s);
    comm_sha256_update(&s, data, n);
    comm_sha256_final(&s, out);
}

void pdde_hmac_sha256(const void *key, size_t key_len, const void *data, size_t n, unsigned char out[32]) {
    if (!out || (!key && key_len) || (!data && n)) return;
    const void *parts[1] = {data};
    comm_hmac(key, key_len, 1, parts, &n, out);
}

/* The proof of one side of a handshake: HMAC(secret, label | nonce_a | nonce_b). */
static void comm_prove(const void *secret, size_t slen, const char *label, const unsigned char *a,
                       const unsigned char *b, unsigned char out[COMM_SHA256_BYTES]) {
    const void *parts[3] = {label, a, b};
    size_t lens[3] = {strlen(label) + 1, COMM_NONCE_BYTES, COMM_NONCE_BYTES};
    comm_hmac(secret, slen, 3, parts, lens, out);
}

/* Compares in time independent of where the bytes differ. 1 equal. */
static int comm_equal_ct(const void *a, const void *b, size_t n) {
    const volatile unsigned char *x = a, *y = b;
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++) d |= x[i] ^ y[i];
    return d == 0;
}

static int comm_random(void *buf, size_t n) {
    unsigned char *p = buf;
    while (n) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        p += r; n -= (size_t)r;
    }
    return 0;
}

/* ================================================================================================
 * The job secret */

typedef struct {
    char text[COMM_SECRET_MAX + 1];
    size_t len;              /* 0: none */
} comm_secret;

/* The secret this process made (the first store server without one in the environment): its own
 * clients and the processes it forks (the tests' ranks) prove it too. */
static comm_secret comm_process_secret;
static pthread_mutex_t comm_process_secret_lock = PTHREAD_MUTEX_INITIALIZER;

pdde_status pdde_job_secret_generate(pdde_context *ctx, char *out, size_t cap) {
    unsigned char r[32];
    if (!out || cap < 2 * sizeof r + 1) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "job secret: buffer too small");
    if (comm_random(r, sizeof r))
        return pdde_error(ctx, PDDE_ERR_IO, "job secret: no random bytes from getrandom: %s", strerror(errno));
    for (size_t i = 0; i < sizeof r; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
    return PDDE_OK;
}

static pdde_status comm_secret_set(pdde_context *ctx, comm_secret *s, const char *text, size_t len, const char *from) {
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) len--;
    if (len < COMM_SECRET_MIN || len > COMM_SECRET_MAX)
        return pdde_error(ctx, PDDE_ERR_ENV, "job secret from %s has %zu bytes; want %d to %d", from, len,
                          COMM_SECRET_MIN, COMM_SECRET_MAX);
    memcpy(s->text, text, len);
    s->text[len] = 0;
    s->len = len;
    return PDDE_OK;
}

/* Reads a secret file that only its owner (this user) can read: a regular file, mode 0600 or
 * stricter. Anything else is refused, naming what is wrong, so a secret nobody else may know never
 * comes from a file others could read or replace. */
static pdde_status comm_secret_read_file(pdde_context *ctx, const char *path, comm_secret *s) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return pdde_error(ctx, PDDE_ERR_ENV, "job secret file %s: %s", path, strerror(errno));
    struct stat st;
    pdde_status r = PDDE_OK;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode))
        r = pdde_error(ctx, PDDE_ERR_ENV, "job secret file %s is not a regular file", path);
    else if (st.st_uid != geteuid())
        r = pdde_error(ctx, PDDE_ERR_ENV, "job secret file %s belongs to uid %d, not to this user (%d)", path,
                       (int)st.st_uid, (int)geteuid());
    else if (st.st_mode & 077)
        r = pdde_error(ctx, PDDE_ERR_ENV, "job secret file %s has mode %03o; others may read it (want 0600)", path,
                       (unsigned)(st.st_mode & 0777));
    char buf[COMM_SECRET_MAX + 2];
    ssize_t n = r ? 0 : read(fd, buf, sizeof buf);
    close(fd);
    if (r) return r;
    if (n < 0) return pdde_error(ctx, PDDE_ERR_ENV, "job secret file %s: %s", path, strerror(errno));
    char from[300];
    snprintf(from, sizeof from, "file %s", path);
    return comm_secret_set(ctx, s, buf, (size_t)n, from);
}

/* The secret from the environment (PDDE_JOB_SECRET, then PDDE_JOB_SECRET_FILE), else the one this
 * process made. PDDE_ERR_NOT_FOUND (no message) when there is none. */
static pdde_status comm_secret_lookup(pdde_context *ctx, comm_secret *s) {
    const char *v = getenv("PDDE_JOB_SECRET"), *f = getenv("PDDE_JOB_SECRET_FILE");
    if (v && *v) return comm_secret_set(ctx, s, v, strlen(v), "PDDE_JOB_SECRET");
    if (f && *f) return comm_secret_read_file(ctx, f, s);
    pthread_mutex_lock(&comm_process_secret_lock);
    *s = comm_process_secret;
    pthread_mutex_unlock(&comm_process_secret_lock);
    return s->len ? PDDE_OK : PDDE_ERR_NOT_FOUND;
}

/* The secret a store server guards with: the environment's or this process's, made now if neither. */
static pdde_status comm_secret_for_server(pdde_context *ctx, comm_secret *s) {
    pdde_status st = comm_secret_lookup(ctx, s);
    if (st != PDDE_ERR_NOT_FOUND) return st;
    pthread_mutex_lock(&comm_process_secret_lock);
    if (!comm_process_secret.len && !(st = pdde_job_secret_generate(ctx, comm_process_secret.text, sizeof comm_process_secret.text)))
        comm_process_secret.len = strlen(comm_process_secret.text);
    *s = comm_process_secret;
    pthread_mutex_unlock(&comm_process_secret_lock);
    return s->len ? PDDE_OK : st;
}

#endif /* PDDE_COMM_AUTH_C */
