/* test_store.c — what an outsider or a misbehaving client meets: SHA-256/HMAC against published
 * vectors; the store's challenge-response (wrong, missing or forged secrets refused, a fake store found
 * out), key ownership, and its limits (value, memory per client and in all, connections); 2-rank jobs
 * that run to the end, leases kept, while outsiders try to set the failure key, a client reads none of
 * its big replies, a client hoards memory, and a client exhausts the store's file descriptors (which
 * must not make it spin); a store stopped past a client's wait for a reply (the late reply is dropped, the
 * next call gets its own) and one killed; the UCX handshake refusing a peer with another secret. */
#define _GNU_SOURCE
#include "pdde_extension.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    printf("SKIPPED: pdde was built without comm (no UCX)\n0 passed, 0 failed\n");
    return 0;
}
#else
#include "test_util.h"
#include "comm_test_util.h"
#include "store_wire.h"
#include "tools/proc_stat.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/socket.h>

static const char SECRET[] = "test-store-secret-0123456789abcdef";

/* ---- the wire protocol by hand (store_wire.h) ---- */

/* The client side of the challenge-response, done by hand. Returns the server's answer status. */
static int32_t raw_auth(int fd, const char *secret) {
    char hello[64];
    int32_t st = -1;
    if (raw_reply(fd, &st, hello, sizeof hello, NULL, 5) || st) return st ? st : -1;
    unsigned char nonce[32], msg[18 + 64], proof[32];
    for (int i = 0; i < 32; i++) nonce[i] = (unsigned char)rand();
    memcpy(msg, "pdde store client", 18); /* the label with its NUL */
    memcpy(msg + 18, hello, 32);
    memcpy(msg + 50, nonce, 32);
    pdde_hmac_sha256(secret, strlen(secret), msg, sizeof msg, proof);
    raw_request(fd, 9 /* AUTH */, NULL, nonce, 32, proof, 32);
    if (raw_reply(fd, &st, NULL, 0, NULL, 5)) return -1;
    return st;
}

/* ---- SHA-256 and HMAC-SHA256: FIPS 180-4 examples and RFC 4231 test cases ---- */

static int hex_eq(const unsigned char *d, const char *hex) {
    char s[65];
    for (int i = 0; i < 32; i++) snprintf(s + 2 * i, 3, "%02x", d[i]);
    return !strcmp(s, hex);
}

static void test_vectors(void) {
    unsigned char d[32];
    pdde_sha256("abc", 3, d);
    CHECK(hex_eq(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"), "sha256(abc)");
    pdde_sha256("", 0, d);
    CHECK(hex_eq(d, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"), "sha256('')");
    const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 56 bytes: padding spills */
    pdde_sha256(two, strlen(two), d);
    CHECK(hex_eq(d, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"), "sha256(two blocks)");
    char x[64];
    memset(x, 'x', sizeof x);
    pdde_sha256(x, 55, d);
    CHECK(hex_eq(d, "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072"), "sha256(55 bytes)");
    pdde_sha256(x, 64, d);
    CHECK(hex_eq(d, "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c"), "sha256(64 bytes)");
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    pdde_sha256(a, 1000000, d);
    CHECK(hex_eq(d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"), "sha256(a million a)");
    free(a);
    unsigned char k1[20], k6[131];
    memset(k1, 0x0b, sizeof k1);
    memset(k6, 0xaa, sizeof k6);
    pdde_hmac_sha256(k1, sizeof k1, "Hi There", 8, d);
    CHECK(hex_eq(d, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"), "hmac case 1");
    const char *m2 = "what do ya want for nothing?";
    pdde_hmac_sha256("Jefe", 4, m2, strlen(m2), d);
    CHECK(hex_eq(d, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"), "hmac case 2");
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    pdde_hmac_sha256(k6, sizeof k6, m6, strlen(m6), d);
    CHECK(hex_eq(d, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"), "hmac case 6 (long key)");
}

/* ---- authentication, ownership, limits ---- */

/* A squatter on a port: sends a challenge like the store's, then answers AUTH with a made-up proof. */
static void *fake_store(void *arg) {
    int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
    unsigned char m[12 + 40] = {0}, in[256];
    put32(m, 8 + 40); put32(m + 8, 40);
    m[12 + 32] = 0xff; /* max value bytes */
    if (fd < 0) return NULL;
    ssize_t w = send(fd, m, sizeof m, MSG_NOSIGNAL);
    if (w == (ssize_t)sizeof m && recv(fd, in, sizeof in, 0) > 0) {
        unsigned char r[12 + 32];
        put32(r, 8 + 32); put32(r + 4, 0); put32(r + 8, 32);
        memset(r + 12, 0x5a, 32);
        w = send(fd, r, sizeof r, MSG_NOSIGNAL);
    }
    recv(fd, in, sizeof in, 0);
    close(fd);
    return NULL;
}

static void test_auth(pdde_context *ctx) {
    pdde_store_server_params sp = PDDE_STORE_SERVER_PARAMS_INIT;
    sp.secret = SECRET;
    sp.auth_timeout_s = 1;
    sp.max_value_bytes = 1 << 20;
    sp.max_client_bytes = 4 << 20;
    sp.max_total_bytes = 12 << 20;
    sp.max_clients = 24;
    pdde_store_server *srv;
    CHECK(pdde_store_server_init_params(ctx, &sp, &srv) == PDDE_OK, "server: %s", pdde_last_error(ctx));
    int port = pdde_store_server_port(srv);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    pdde_store *a = NULL, *b = NULL, *c = NULL, *bad = NULL;
    CHECK(pdde_store_connect_secret(ctx, addr, SECRET, 5, &a) == PDDE_OK, "connect: %s", pdde_last_error(ctx));
    CHECK(pdde_store_connect_secret(ctx, addr, SECRET, 5, &b) == PDDE_OK, "connect b");
    CHECK(pdde_store_set(a, "k", "good", 4) == PDDE_OK, "set");
    pdde_status st = pdde_store_connect_secret(ctx, addr, "not-the-secret-0123456789", 5, &bad);
    CHECK(st == PDDE_ERR_AUTH && !bad && strstr(pdde_last_error(ctx), "secret"), "wrong secret refused: %d %s", st,
          pdde_last_error(ctx));
    unsetenv("PDDE_JOB_SECRET"); unsetenv("PDDE_JOB_SECRET_FILE");
    st = pdde_store_connect(ctx, addr, 5, &bad);
    CHECK(st == PDDE_ERR_ENV && !bad && strstr(pdde_last_error(ctx), "PDDE_JOB_SECRET"), "no secret: %d %s", st,
          pdde_last_error(ctx));
    /* requests without authentication: refused, nothing changed, connection closed */
    int fd = raw_connect(port);
    int32_t status = 0;
    char msg[512];
    raw_reply(fd, &status, msg, sizeof msg, NULL, 5); /* the challenge */
    raw_request(fd, 1 /* SET */, "k", "evil", 4, NULL, 0);
    int rc = raw_reply(fd, &status, msg, sizeof msg, NULL, 5);
    CHECK(rc == 0 && status == PDDE_ERR_AUTH, "set before auth refused: rc %d status %d", rc, status);
    CHECK(raw_reply(fd, &status, msg, sizeof msg, NULL, 5) == -1, "and the connection closed");
    close(fd);
    fd = raw_connect(port);
    CHECK(raw_auth(fd, "forged-secret-0123456789abc") == PDDE_ERR_AUTH, "forged proof refused");
    close(fd);
    fd = raw_connect(port);
    CHECK(raw_auth(fd, SECRET) == PDDE_OK, "the protocol by hand with the secret");
    close(fd);
    fd = raw_connect(port);
    raw_reply(fd, &status, msg, sizeof msg, NULL, 5);
    double t0 = test_now();
    rc = raw_reply(fd, &status, msg, sizeof msg, NULL, 5);
    /* (below the read's own 5 s, which a connection never closed would reach; a loaded machine adds its delays) */
    double bound = fmin(1 + 2 * test_load_factor(), 4.5);
    CHECK(rc == -1 && test_now() - t0 < bound, "a silent connection is closed after auth_timeout_s (rc %d, %.1f s, bound %.1f s)", rc,
          test_now() - t0, bound);
    close(fd);
    void *v = NULL;
    size_t n = 0;
    CHECK(pdde_store_get(b, "k", &v, &n) == PDDE_OK && n == 4 && !memcmp(v, "good", 4), "key unchanged");
    free(v);

    /* a squatter on the port cannot pass for the store */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t sl = sizeof sa;
    bind(lfd, (struct sockaddr *)&sa, sizeof sa);
    listen(lfd, 4);
    getsockname(lfd, (struct sockaddr *)&sa, &sl);
    pthread_t th;
    pthread_create(&th, NULL, fake_store, &lfd);
    char fake[64];
    snprintf(fake, sizeof fake, "127.0.0.1:%d", ntohs(sa.sin_port));
    st = pdde_store_connect_secret(ctx, fake, SECRET, 5, &bad);
    CHECK(st == PDDE_ERR_AUTH && !bad && strstr(pdde_last_error(ctx), "not this job's store"), "fake store found out: %d %s",
          st, pdde_last_error(ctx));
    pthread_join(th, NULL);
    close(lfd);

    /* keys belong to their maker; death notices to nobody; counters are shared */
    CHECK(pdde_store_set(b, "k", "take", 4) == PDDE_ERR_STATE && strstr(pdde_last_error(ctx), "another client"),
          "another client cannot overwrite: %s", pdde_last_error(ctx));
    CHECK(pdde_store_remove(b, "k") == PDDE_ERR_STATE, "nor remove");
    int sw = -1;
    CHECK(pdde_store_compare_set(b, "k", "good", 4, "take", 4, &sw) == PDDE_ERR_STATE, "nor swap");
    CHECK(pdde_store_compare_set(b, "k", "else", 4, "take", 4, &sw) == PDDE_OK && sw == 0, "a compare that fails is fine");
    CHECK(pdde_store_set(a, "k", "mine", 4) == PDDE_OK, "the maker can");
    int64_t x;
    CHECK(pdde_store_add(a, "ctr", 1, &x) == PDDE_OK && pdde_store_add(b, "ctr", 1, &x) == PDDE_OK && x == 2, "shared counter");
    /* a sum past 64 bits is refused, the counter unchanged (no signed overflow in the server) */
    CHECK(pdde_store_add(a, "ctr", INT64_MAX, &x) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "overflows"),
          "an add that overflows is refused: %s", pdde_last_error(ctx));
    CHECK(pdde_store_add(a, "ctr", 0, &x) == PDDE_OK && x == 2, "the counter stays 2: %lld", (long long)x);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        pdde_store *d;
        if (pdde_store_connect_secret(NULL, addr, SECRET, 5, &d) || pdde_store_set_liveness(d, "notice", "gone", 4, 0)) _exit(1);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    CHECK(pdde_store_wait(a, "notice", 2) == PDDE_OK, "death notice");
    CHECK(pdde_store_set(a, "notice", "alive", 5) == PDDE_ERR_STATE && pdde_store_remove(b, "notice") == PDDE_ERR_STATE,
          "nobody changes a death notice");

    /* limits: an error naming the limit, and the connection still serves */
    char *big = calloc(2 << 20, 1);
    CHECK(pdde_store_set(a, "big", big, 2 << 20) == PDDE_ERR_INVALID_ARG && strstr(pdde_last_error(ctx), "limit"),
          "the client knows the value limit: %s", pdde_last_error(ctx));
    fd = raw_connect(port);
    raw_auth(fd, SECRET);
    raw_request(fd, 1, "big", big, 2 << 20, NULL, 0);
    rc = raw_reply(fd, &status, msg, sizeof msg, NULL, 5);
    CHECK(rc == 0 && status == PDDE_ERR_OOM && strstr(msg, "max_value_bytes"), "server refuses a big value: %d %s", status, msg);
    raw_request(fd, 8 /* BYE */, NULL, NULL, 0, NULL, 0);
    rc = raw_reply(fd, &status, msg, sizeof msg, NULL, 5);
    CHECK(rc == 0 && status == 0, "the connection still serves after a refused request");
    close(fd);
    int refused = -1;
    char key[32];
    for (int i = 0; i < 8 && refused < 0; i++) {
        snprintf(key, sizeof key, "a%d", i);
        if (pdde_store_set(a, key, big, 1 << 20)) refused = i;
    }
    CHECK(refused >= 2 && refused <= 4 && strstr(pdde_last_error(ctx), "max_client_bytes"), "per-client cap at %d: %s",
          refused, pdde_last_error(ctx));
    CHECK(pdde_store_connect_secret(ctx, addr, SECRET, 5, &c) == PDDE_OK, "connect c");
    refused = -1;
    for (int i = 0; i < 12 && refused < 0; i++) {
        snprintf(key, sizeof key, "%c%d", i % 2 ? 'b' : 'c', i);
        if (pdde_store_set(i % 2 ? b : c, key, big, 1 << 20)) refused = i;
    }
    CHECK(refused > 0 && strstr(pdde_last_error(ctx), "max_total_bytes"), "total cap after %d values: %s", refused,
          pdde_last_error(ctx));
    CHECK(pdde_store_set(b, "small", "s", 1) == PDDE_OK, "small values still fit");
    free(big);

    /* connections: the one past the limit is told why */
    int fds[32], nfd = 0, told = 0;
    for (; nfd < 32 && !told; nfd++) {
        fds[nfd] = raw_connect(port);
        if (raw_reply(fds[nfd], &status, msg, sizeof msg, NULL, 5) == 0 && status) told = strstr(msg, "max_clients") != NULL;
    }
    CHECK(told && nfd <= 24, "too many connections: told after %d (%s)", nfd, msg);
    for (int i = 0; i < nfd; i++) close(fds[i]);
    pdde_store_close(a);
    pdde_store_close(b);
    pdde_store_close(c);
    pdde_store_server_free(srv);
}

/* ---- jobs that must run to the end while others misbehave ---- */

/* Allreduces until rank 0 says the time is up (secs), a millisecond apart; the sums must hold. */
static void busy_rank(pdde_context *ctx, pdde_comm *comm, void *arg) {
    double secs = *(double *)arg, t0 = test_now();
    int me = pdde_comm_rank(comm), wrong = 0, iters = 0;
    int32_t go = 1;
    pdde_status st = PDDE_OK;
    while (go && !st) {
        float buf[256];
        for (int i = 0; i < 256; i++) buf[i] = (float)(me + 1);
        st = pdde_comm_allreduce(comm, buf, buf, 256, PDDE_F32, PDDE_REDUCE_SUM);
        wrong += !st && buf[255] != 3.0f;
        go = test_now() - t0 < secs;
        if (!st) st = pdde_comm_broadcast(comm, &go, 1, PDDE_I32, 0);
        iters++;
        usleep(1000);
    }
    CHECK(st == PDDE_OK, "rank %d: the job failed after %d steps (%.1f s): %s", me, iters, test_now() - t0, pdde_last_error(ctx));
    CHECK(!wrong && iters > 10, "rank %d: %d steps, %d wrong sums", me, iters, wrong);
}

typedef struct {
    int port;
    const char *prefix;
    double start_s, secs;
    pid_t host;             /* the store's process, when it has one of its own */
} abuse_args;

/* Outsiders: wrong secrets, requests without authentication, all aimed at the job's failure key. */
static int outsider(const abuse_args *a) {
    char key[64], addr[64], msg[256];
    snprintf(key, sizeof key, "%s/1/failed", a->prefix);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", a->port);
    usleep((useconds_t)(a->start_s * 1e6));
    int tries = 0, accepted = 0;
    for (double t0 = test_now(); test_now() - t0 < a->secs; tries++) {
        pdde_store *s = NULL;
        if (!pdde_store_connect_secret(NULL, addr, "guessed-secret-0123456789", 2, &s)) {
            accepted++;
            pdde_store_set(s, key, "-501|forged", 11);
            pdde_store_close(s);
        }
        int fd = raw_connect(a->port);
        int32_t status = 0;
        raw_reply(fd, &status, msg, sizeof msg, NULL, 2);
        raw_request(fd, 1, key, "-501|forged", 11, NULL, 0);
        if (raw_reply(fd, &status, msg, sizeof msg, NULL, 2) == 0 && status == PDDE_OK) accepted++;
        close(fd);
        fd = raw_connect(a->port); /* a made-up proof, then the same */
        if (raw_auth(fd, "guessed-secret-0123456789") == PDDE_OK) accepted++;
        raw_request(fd, 1, key, "-501|forged", 11, NULL, 0);
        if (raw_reply(fd, &status, msg, sizeof msg, NULL, 2) == 0 && status == PDDE_OK) accepted++;
        close(fd);
        usleep(20000);
    }
    return accepted ? 1 : tries > 5 ? 0 : 2;
}

/* Insiders (they hold the secret) that misbehave: one asks for a big value again and again and never
 * reads; one stores values until it is refused. */
static int insider(const abuse_args *a) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", a->port);
    usleep((useconds_t)(a->start_s * 1e6));
    pdde_store *s;
    if (pdde_store_connect_secret(NULL, addr, SECRET, 5, &s)) return 3;
    size_t big = 8 << 20;
    char *v = calloc(big, 1);
    if (pdde_store_set(s, "abuse/big", v, big)) return 4;
    int fd = raw_connect(a->port);
    if (raw_auth(fd, SECRET)) return 5;
    int sent = 0;
    for (; sent < 64; sent++) { /* the server stops reading once a reply waits: sends start blocking */
        struct pollfd q = {fd, POLLOUT, 0};
        if (poll(&q, 1, 200) <= 0 || raw_request(fd, 2 /* GET */, "abuse/big", NULL, 0, NULL, 0)) break;
    }
    int refused = 0;
    char key[32];
    for (int i = 0; i < 200 && !refused; i++) {
        snprintf(key, sizeof key, "abuse/hog%d", i);
        refused = pdde_store_set(s, key, v, 1 << 20) != PDDE_OK;
    }
    /* the slow reader is dropped once it has taken nothing for stall_timeout_s: its stream ends */
    usleep((useconds_t)(a->secs * 1e6));
    char buf[65536];
    size_t got = 0;
    int ended = 0;
    for (double t0 = test_now(); test_now() - t0 < 20 && !ended;) {
        struct pollfd q = {fd, POLLIN, 0};
        if (poll(&q, 1, 1000) <= 0) continue;
        ssize_t r = recv(fd, buf, sizeof buf, 0);
        if (r <= 0) ended = 1;
        else got += (size_t)r;
    }
    close(fd);
    pdde_store_close(s);
    free(v);
    if (!refused) return 6;
    if (!ended || got >= (size_t)sent * big) return 7; /* never dropped: it got every reply */
    return 0;
}

/* A client of the job's kind: pings the store every 20 ms while the abuse runs; the slowest answer
 * must stay under 2 s (0.5 s seen on 2 loaded cores). */
static int prober(const abuse_args *a) {
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", a->port);
    pdde_store *s;
    if (pdde_store_connect_secret(NULL, addr, SECRET, 5, &s)) return 3;
    double worst = 0;
    for (double t0 = test_now(); test_now() - t0 < a->start_s + a->secs;) {
        double t = test_now();
        if (pdde_store_ping(s)) return 4;
        if (test_now() - t > worst) worst = test_now() - t;
        usleep(20000);
    }
    pdde_store_close(s);
    printf("store: slowest ping while abused %.3f s\n", worst);
    return worst < 2.0 ? 0 : 5; /* a reply written synchronously to the slow reader stalled it 5 s */
}

static pid_t spawn(int (*fn)(const abuse_args *), const abuse_args *a) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int rc = fn(a);
        fflush(NULL);
        _exit(rc);
    }
    return pid;
}

static int reap(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

static void test_job_vs_abuse(void) {
    setenv("PDDE_JOB_SECRET", SECRET, 1);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_store_server_params sp = PDDE_STORE_SERVER_PARAMS_INIT;
    sp.stall_timeout_s = 1.5;
    sp.max_total_bytes = 64 << 20;
    sp.max_client_bytes = 24 << 20;
    pdde_store_server *srv;
    CHECK(pdde_store_server_init_params(ctx, &sp, &srv) == PDDE_OK, "server: %s", pdde_last_error(ctx));
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", pdde_store_server_port(srv));
    double secs = 3;
    abuse_args out = {pdde_store_server_port(srv), "outsiders", 0.3, 2.5, 0};
    pid_t o = spawn(outsider, &out);
    test_ranks_params tp = {.addr = addr, .prefix = "outsiders", .timeout_s = 30, .peer_timeout_s = 1.0};
    test_run_ranks(2, &tp, busy_rank, &secs, 60);
    int rc = reap(o);
    CHECK(rc == 0, "outsiders were all refused (rc %d)", rc);
    pdde_store *s;
    void *v = NULL;
    size_t n;
    CHECK(pdde_store_connect(ctx, addr, 5, &s) == PDDE_OK, "connect");
    CHECK(pdde_store_get(s, "outsiders/1/failed", &v, &n) == PDDE_ERR_NOT_FOUND, "no forged failure key");
    free(v);
    pdde_store_close(s);

    abuse_args in = {pdde_store_server_port(srv), "insiders", 0.3, 2.0, 0};
    pid_t i = spawn(insider, &in), pr = spawn(prober, &in);
    tp.prefix = "insiders";
    test_run_ranks(2, &tp, busy_rank, &secs, 60);
    rc = reap(i);
    CHECK(rc == 0, "slow reader dropped and memory hog refused (rc %d)", rc);
    rc = reap(pr);
    CHECK(rc == 0, "the store answered every other client promptly while abused (rc %d)", rc);
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
}

/* The store in a process of its own with few file descriptors; a client opens connections until
 * they run out. The store must keep serving its job, refuse newcomers without spinning, and serve
 * again once the abuser is gone. */
/* pid's CPU time so far (0 when it is gone) */
static double cpu_seconds(pid_t pid) {
    proc_stat ps;
    return proc_stat_read(pid, &ps) ? 0 : ps.cpu_s;
}

/* Exit code 0: it was refused with a reason and the store used under 10% of a core meanwhile. */
static int fd_abuser(const abuse_args *a) {
    usleep((useconds_t)(a->start_s * 1e6));
    int fds[400], n = 0, refused = 0;
    double cpu0 = -1, t_cpu = 0;
    for (double t0 = test_now(); test_now() - t0 < a->secs;) {
        if (cpu0 < 0 && test_now() - t0 > 0.3) { cpu0 = cpu_seconds(a->host); t_cpu = test_now(); } /* descriptors out by now */
        if (n < 400) {
            int fd = raw_connect(a->port);
            if (fd >= 0) fds[n++] = fd;
        } else {
            usleep(10000);
        }
        for (int k = 0; k < n; k++) {
            struct pollfd q = {fds[k], POLLIN, 0};
            int32_t status = 0;
            char msg[256];
            if (poll(&q, 1, 0) == 1 && raw_reply(fds[k], &status, msg, sizeof msg, NULL, 0.1) == 0 && status &&
                (strstr(msg, "file descriptors") || strstr(msg, "max_clients")))
                refused++;
        }
    }
    double busy = (cpu_seconds(a->host) - cpu0) / (test_now() - t_cpu);
    for (int k = 0; k < n; k++) close(fds[k]);
    printf("store: %.1f%% of a core while its descriptors ran out; %d refusals told\n", busy * 100, refused);
    return (refused ? 0 : 1) + (busy < 0.1 ? 0 : 2);
}

static void on_usr1(int sig) { (void)sig; }

/* Starts a store in a process of its own (descriptors limited to nofile when that is > 0), so that
 * the test can stop or kill it; *port: where it listens (0 when it did not start). */
static pid_t store_host_start(rlim_t nofile, int *port) {
    int pp[2];
    *port = 0;
    if (pipe(pp)) return -1;
    fflush(NULL);
    pid_t host = fork();
    if (host == 0) {
        struct rlimit rl = {nofile, nofile};
        if (nofile > 0) setrlimit(RLIMIT_NOFILE, &rl);
        pdde_store_server_params sp = PDDE_STORE_SERVER_PARAMS_INIT;
        sp.secret = SECRET;
        sp.auth_timeout_s = 1;
        pdde_store_server *srv;
        signal(SIGUSR1, on_usr1);
        if (pdde_store_server_init_params(NULL, &sp, &srv)) _exit(1);
        sigset_t usr1; /* the store's thread takes SIGUSR1 (its poll returns early, as a signal makes it) */
        sigemptyset(&usr1);
        sigaddset(&usr1, SIGUSR1);
        pthread_sigmask(SIG_BLOCK, &usr1, NULL);
        int p = pdde_store_server_port(srv);
        if (write(pp[1], &p, sizeof p) != sizeof p) _exit(1);
        for (;;) pause(); /* until the test kills it */
    }
    if (read(pp[0], port, sizeof *port) != sizeof *port) *port = 0;
    close(pp[0]); close(pp[1]);
    return host;
}

/* The store host stopped (stopped when this returns, not soon after), and resumed with its poll interrupted:
 * it has read nothing yet. */
static void store_host_stop(pid_t host) {
    int ws = 0;
    kill(host, SIGSTOP);
    waitpid(host, &ws, WUNTRACED);
}
static void store_host_resume(pid_t host) {
    kill(host, SIGUSR1);
    kill(host, SIGCONT);
}

/* A store host and two clients of it, a holding a lease of lease_s with its notice ("gone") at notice_key
 * (the slow-store cases); 1 when all is set, else said under `who`. */
static int store_pair_start(pdde_context *ctx, const char *who, const char *notice_key, double lease_s, pid_t *host, pdde_store **a,
                            pdde_store **b) {
    int port = 0;
    *host = store_host_start(0, &port), *a = *b = NULL;
    CHECK(port > 0, "%s: store host started", who);
    if (port <= 0) return 0;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    int ok = pdde_store_connect_secret(ctx, addr, SECRET, 5, a) == PDDE_OK && pdde_store_connect_secret(ctx, addr, SECRET, 5, b) == PDDE_OK &&
             pdde_store_set_liveness(*a, notice_key, "gone", 4, lease_s) == PDDE_OK;
    CHECK(ok, "%s: setup: %s", who, pdde_last_error(ctx));
    return ok;
}

static void test_fd_exhaustion(void) {
    int port = 0;
    pid_t host = store_host_start(48, &port);
    CHECK(port > 0, "store host started");
    if (port <= 0) return;
    setenv("PDDE_JOB_SECRET", SECRET, 1);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    abuse_args ab = {port, "fds", 0.8, 2.5, host};
    pid_t abuser = spawn(fd_abuser, &ab);
    double secs = 4;
    test_ranks_params tp = {.addr = addr, .prefix = "fds", .timeout_s = 30, .peer_timeout_s = 1.0};
    test_run_ranks(2, &tp, busy_rank, &secs, 60);
    int rc = reap(abuser);
    CHECK(!(rc & 1), "the abuser was told the store is out of descriptors or connections (rc %d)", rc);
    CHECK(!(rc & ~1), "the store does not spin while its descriptors run out (rc %d)", rc);
    pdde_store *s = NULL;
    pdde_status st = pdde_store_connect(NULL, addr, 5, &s);
    CHECK(st == PDDE_OK, "a client connects again once the abuser is gone");
    pdde_store_close(s);
    kill(host, SIGKILL);
    waitpid(host, NULL, 0);
}

/* ---- a store that is only slow, and one that is gone ---- */

/* A store stalled past a client's wait for its reply (its process stopped, as a starved or debugged
 * one is) costs that call a timeout; calls while the reply is owed fail at once; once the store runs
 * again the next call succeeds with its own reply (the late one is dropped, not taken for its answer),
 * and the client's lease held. A store killed: calls fail at once, saying so. */
static void test_slow_store(pdde_context *ctx) {
    const double lease = 1.5; /* a's wait for a reply: twice its lease (a loaded machine keeps it) */
    pid_t host;
    pdde_store *a, *b;
    int ok = store_pair_start(ctx, "slow", "slow/notice", lease, &host, &a, &b);
    if (ok) {
        ok = pdde_store_set(b, "slow/one", "one", 3) == PDDE_OK && pdde_store_set(b, "slow/two", "two", 3) == PDDE_OK;
        CHECK(ok, "slow: setup: %s", pdde_last_error(ctx));
    }
    void *v = NULL;
    size_t n = 0;
    if (ok) {
        store_host_stop(host);
        double t0 = test_now();
        pdde_status st = pdde_store_get(a, "slow/one", &v, &n);
        double took = test_now() - t0;
        CHECK(st == PDDE_ERR_TIMEOUT && took > 2 * lease - 0.05 && took < 2 * lease + 1,
              "slow: a get from the stopped store times out after twice the lease (status %d after %.2f s): %s", st, took,
              pdde_last_error(ctx));
        free(v), v = NULL;
        t0 = test_now();
        st = pdde_store_get(a, "slow/two", &v, &n);
        took = test_now() - t0;
        CHECK(st == PDDE_ERR_TIMEOUT && took < 0.5 && strstr(pdde_last_error(ctx), "still no reply"),
              "slow: while the reply is owed a call fails at once (status %d after %.2f s): %s", st, took, pdde_last_error(ctx));
        free(v), v = NULL;
        usleep(300 * 1000); /* (stopped longer than a's lease) */
        store_host_resume(host);
        /* b's two round trips show the store serves again: the poll that brought b's first request
         * (or an earlier one) brought a's waiting request too, and the second is served after it */
        for (int k = 0; k < 2; k++) {
            st = pdde_store_get(b, "slow/two", &v, &n);
            CHECK(st == PDDE_OK, "slow: the store serves again after SIGCONT: %s", pdde_last_error(ctx));
            free(v), v = NULL;
        }
        /* (b's round trips do not order a's reply before them: the server may answer a after b on a loaded
         * machine; a call before that late reply is in fails at once, "still no reply", as it should) */
        for (double until = test_now() + 2 * test_load_factor();;) {
            st = pdde_store_get(a, "slow/two", &v, &n);
            if (!(st == PDDE_ERR_TIMEOUT && strstr(pdde_last_error(ctx), "still no reply")) || test_now() > until) break;
            free(v), v = NULL;
            usleep(10 * 1000);
        }
        CHECK(st == PDDE_OK && n == 3 && !memcmp(v, "two", 3),
              "slow: the next call succeeds with its own reply (status %d, value '%.*s', want 'two'): %s", st, (int)n,
              v ? (char *)v : "", pdde_last_error(ctx));
        free(v), v = NULL;
        int64_t x = 0;
        st = pdde_store_add(a, "slow/count", 5, &x);
        if (!st) st = pdde_store_get(a, "slow/one", &v, &n);
        CHECK(st == PDDE_OK && x == 5 && n == 3 && !memcmp(v, "one", 3), "slow: and so do the calls after it (add %lld, get '%.*s'): %s",
              (long long)x, st ? 0 : (int)n, v ? (char *)v : "", pdde_last_error(ctx));
        free(v), v = NULL;
        st = pdde_store_get(b, "slow/notice", &v, &n);
        CHECK(st == PDDE_ERR_NOT_FOUND, "slow: a's lease held while the store was stopped (no death notice: status %d)", st);
        free(v), v = NULL;
        /* a store killed: at once, clearly, and from then on */
        kill(host, SIGKILL);
        waitpid(host, NULL, 0);
        host = -1;
        t0 = test_now();
        st = pdde_store_ping(a);
        took = test_now() - t0;
        CHECK(st == PDDE_ERR_PEER_LOST && took < 0.5 && strstr(pdde_last_error(ctx), "connection lost"),
              "slow: the store killed: a call fails at once (status %d after %.2f s): %s", st, took, pdde_last_error(ctx));
        t0 = test_now();
        st = pdde_store_get(a, "slow/two", &v, &n);
        took = test_now() - t0;
        CHECK(st == PDDE_ERR_PEER_LOST && took < 0.1, "slow: and so does every call after it (status %d after %.2f s)", st, took);
        free(v), v = NULL;
    }
    pdde_store_close(a);
    pdde_store_close(b);
    if (host > 0) kill(host, SIGKILL), waitpid(host, NULL, 0);
}

/* A client closed while a reply is owed (its store stopped past the client's wait, running again while the
 * client closes) takes the late reply in and says goodbye: a clean close, no death notice. */
static void test_close_owed(pdde_context *ctx) {
    const double lease = 1.5; /* (as test_slow_store's: a loaded machine keeps it) */
    pid_t host;
    pdde_store *a, *b;
    void *v = NULL;
    size_t n = 0;
    if (store_pair_start(ctx, "close owed", "owed/notice", lease, &host, &a, &b)) {
        store_host_stop(host);
        pdde_status st = pdde_store_get(a, "owed/x", &v, &n);
        CHECK(st == PDDE_ERR_TIMEOUT, "close owed: a get from the stopped store times out (status %d)", st);
        free(v), v = NULL;
        /* the store runs again 50 ms into a's close: the late reply comes while the close waits for it */
        fflush(NULL);
        pid_t waker = fork();
        if (waker == 0) {
            usleep(50 * 1000);
            store_host_resume(host);
            _exit(0);
        }
        pdde_store_close(a);
        a = NULL;
        if (waker > 0) waitpid(waker, NULL, 0);
        else store_host_resume(host);
        st = pdde_store_get(b, "owed/x", &v, &n);
        CHECK(st == PDDE_ERR_NOT_FOUND, "close owed: the store serves again (status %d): %s", st, pdde_last_error(ctx));
        free(v), v = NULL;
        usleep((useconds_t)(2 * lease * 1e6)); /* (past a's lease: a death would be noted by now) */
        st = pdde_store_get(b, "owed/notice", &v, &n);
        CHECK(st == PDDE_ERR_NOT_FOUND, "close owed: closed with a reply owed, the client said goodbye (no death notice: status %d, "
              "value '%.*s')", st, st ? 0 : (int)n, v ? (char *)v : "");
        free(v), v = NULL;
    }
    pdde_store_close(a);
    pdde_store_close(b);
    if (host > 0) kill(host, SIGKILL), waitpid(host, NULL, 0);
}

/* ---- the UCX handshake ---- */

/* Connects transport b to a's listener for up to secs; 1 if both ends got their connection and a
 * message passed; *accepted: whether a's side took the connection. */
static int ucx_join(const pdde_transport_iface *tp, void *a, void *b, double secs, pdde_status *connect_st, int *accepted) {
    unsigned char handle[PDDE_TRANSPORT_HANDLE_MAX];
    size_t hlen = 0;
    void *l = NULL, *sc = NULL, *rc = NULL;
    *connect_st = PDDE_OK;
    if (tp->listen(a, handle, &hlen, &l)) return 0;
    for (double t0 = test_now(); test_now() - t0 < secs && !(sc && rc);) {
        if (!sc && !*connect_st) *connect_st = tp->connect(b, handle, hlen, &sc);
        if (!rc) tp->accept(l, &rc);
        tp->progress(a);
        tp->progress(b);
        usleep(1000);
    }
    int ok = sc && rc;
    *accepted = rc != NULL;
    if (ok) { /* and a message passes */
        uint64_t x = 42, y = 0;
        void *sr = NULL, *rr = NULL;
        int ds = 0, dr = 0;
        tp->isend(sc, &x, 8, 7, PDDE_MEM_HOST, &sr);
        tp->irecv(rc, &y, 8, 7, PDDE_MEM_HOST, &rr);
        for (double t0 = test_now(); test_now() - t0 < 2 && !(ds && dr);) {
            if (!ds) tp->test(sr, &ds, NULL);
            if (!dr) tp->test(rr, &dr, NULL);
            tp->progress(a);
            tp->progress(b);
        }
        ok = ds && dr && y == 42;
    }
    if (sc) tp->close_send(sc);
    if (rc) tp->close_recv(rc);
    tp->close_listen(l);
    return ok;
}

static void test_ucx_handshake(pdde_context *ctx) {
    const pdde_transport_iface *tp = pdde_transport_ucx();
    pdde_transport_params pa = {1.0, SECRET}, pb = {1.0, "another-jobs-secret-0123456789"};
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK(tp->init(ctx, &pa, &a) == PDDE_OK && tp->init(ctx, &pb, &b) == PDDE_OK && tp->init(ctx, &pa, &c) == PDDE_OK,
          "ucx init: %s", pdde_last_error(ctx));
    if (!a || !b || !c) return;
    pdde_status st;
    int accepted = 0;
    CHECK(!ucx_join(tp, a, b, 1.0, &st, &accepted) && !accepted,
          "a peer with another secret is not accepted (accepted %d, connect status %d)", accepted, st);
    CHECK(ucx_join(tp, a, c, 5.0, &st, &accepted), "a peer with the secret connects and sends (status %d)", st);
    tp->fini(a); tp->fini(b); tp->fini(c);
}

int main(void) {
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    setenv("PDDE_BACKENDS", "cpu", 0); /* ranks are fork()ed: no device runtime threads */
    signal(SIGPIPE, SIG_IGN);
    unsetenv("PDDE_JOB_SECRET");
    unsetenv("PDDE_JOB_SECRET_FILE");
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    test_vectors();
    test_fd_exhaustion();   /* first: no store thread in this process while they fork */
    test_slow_store(ctx);
    test_close_owed(ctx);
    test_ucx_handshake(ctx);
    test_auth(ctx);
    test_job_vs_abuse();
    pdde_context_free(ctx);
    return test_finish();
}
#endif
