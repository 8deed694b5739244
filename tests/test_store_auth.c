/* test_store_auth.c — the store's handshake against an adversarial client, while a job uses the store:
 * a 2-rank world runs allreduces (its leases kept, its failure key watched) and an elastic member
 * holds its death notice, and a client that does not know the secret (or misuses what it saw) tries:
 * a proof that is empty, short (16 bytes), long (the right 32 then more), replayed from an earlier
 * exchange, made with the server's label instead of the client's, a nonce of the wrong length (16 and
 * 48 bytes, with a proof made over it), and requests before any proof (GET, SET of the job's failure
 * key, LIVENESS, ADD). Every one is refused (PDDE_ERR_AUTH, then the connection closes), nothing is
 * stored, and the job runs to its end with every sum right and no failure recorded. */
#define _GNU_SOURCE
#include "pdde.h"

#if !defined(PDDE_HAVE_UCX) || defined(PDDE_NO_COMM)
#include <stdio.h>
int main(void) {
    printf("SKIP ucx: pdde was built without comm (no UCX)\n0 passed, 0 failed, 1 skipped\n");
    return 0;
}
#else
#include "test_util.h"
#include "comm_test_util.h"
#include "store_wire.h"
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <sys/socket.h>

static const char SECRET[] = "test-store-auth-secret-0123456789abcdef";
enum { OP_SET = 1, OP_GET, OP_ADD, OP_CAS, OP_REMOVE, OP_LIVENESS, OP_PING, OP_BYE, OP_AUTH };

/* ---- the wire protocol by hand (store_wire.h) ---- */

/* HMAC(secret, label with its NUL | a | b), as the store's proofs are made. */
static void prove(const char *label, const unsigned char *a, size_t alen, const unsigned char *b, size_t blen, unsigned char out[32]) {
    unsigned char msg[256];
    size_t ll = strlen(label) + 1;
    memcpy(msg, label, ll), memcpy(msg + ll, a, alen), memcpy(msg + ll + alen, b, blen);
    pdde_hmac_sha256(SECRET, strlen(SECRET), msg, ll + alen + blen, out);
}

/* An attempt: the server's challenge is read (its nonce in server_nonce), then `send` writes what the
 * attacker sends; the reply must be PDDE_ERR_AUTH and the connection must close after it. */
typedef void (*attack_fn)(int fd, const unsigned char *server_nonce, void *arg);

static int attempt(int port, attack_fn send_fn, void *arg, const char *what) {
    int fd = raw_connect(port);
    unsigned char hello[64];
    int32_t status = -1;
    size_t n = 0;
    if (fd < 0 || raw_reply(fd, &status, hello, sizeof hello, &n, 5) || status || n < 32) {
        CHECK(0, "%s: no challenge from the store", what);
        if (fd >= 0) close(fd);
        return -1;
    }
    send_fn(fd, hello, arg);
    int rc = raw_reply(fd, &status, NULL, 0, NULL, 5);
    int32_t after = 0;
    int closed = raw_reply(fd, &after, NULL, 0, NULL, 5) == -1;
    CHECK(rc == 0 && status == PDDE_ERR_AUTH && closed, "%s: refused (rc %d, status %d) and closed (%d)", what, rc, status, closed);
    close(fd);
    return 0;
}

static unsigned char g_nonce[48];

static void send_proof(int fd, const unsigned char *server_nonce, void *arg) {
    const int *how = arg;
    unsigned char proof[64] = {0};
    prove("pdde store client", server_nonce, 32, g_nonce, 32, proof);
    size_t plen = how[0];
    if (how[1]) prove("pdde store server", g_nonce, 32, server_nonce, 32, proof); /* the other side's label */
    if (plen > 32) memset(proof + 32, 0xab, plen - 32);
    raw_request(fd, OP_AUTH, NULL, g_nonce, 32, proof, plen);
}

static void send_nonce_len(int fd, const unsigned char *server_nonce, void *arg) {
    size_t nlen = (size_t)*(const int *)arg;
    unsigned char proof[32];
    prove("pdde store client", server_nonce, 32, g_nonce, nlen, proof); /* right secret, wrong-sized nonce */
    raw_request(fd, OP_AUTH, NULL, g_nonce, nlen, proof, 32);
}

static unsigned char g_replay_nonce[32], g_replay_proof[32];
static void send_replay(int fd, const unsigned char *server_nonce, void *arg) {
    (void)server_nonce, (void)arg;
    raw_request(fd, OP_AUTH, NULL, g_replay_nonce, 32, g_replay_proof, 32);
}

static void send_before(int fd, const unsigned char *server_nonce, void *arg) {
    (void)server_nonce;
    const char *key = arg;
    static int k;
    switch (k++ % 4) {
    case 0: raw_request(fd, OP_GET, key, NULL, 0, NULL, 0); break;
    case 1: raw_request(fd, OP_SET, key, "-501|forged", 11, NULL, 0); break;
    case 2: { unsigned char l[8] = {0}; raw_request(fd, OP_LIVENESS, key, "-501|forged", 11, l, 8); break; }
    default: { unsigned char d[8] = {1}; raw_request(fd, OP_ADD, "auth/counter", d, 8, NULL, 0); break; }
    }
}

/* ---- the job being attacked ---- */

typedef struct { int iters, wrong; } job_result;

static void job_rank(pdde_context *ctx, pdde_comm *comm, void *arg) {
    (void)ctx;
    double secs = *(double *)arg;
    job_result *r = test_rank_result;
    float buf[256];
    for (double t0 = test_now();; r->iters++) {
        for (int i = 0; i < 256; i++) buf[i] = (float)(pdde_comm_rank(comm) + 1);
        if (pdde_comm_allreduce(comm, buf, buf, 256, PDDE_F32, PDDE_REDUCE_SUM)) { r->wrong++; break; }
        r->wrong += buf[17] != 3.0f;
        int32_t done = test_now() - t0 >= secs; /* (both ranks stop at the same iteration) */
        if (pdde_comm_allreduce(comm, &done, &done, 1, PDDE_I32, PDDE_REDUCE_MAX)) { r->wrong++; break; }
        if (done) break;
        usleep(2000);
    }
}

int main(void) {
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 0);
    setenv("PDDE_BACKENDS", "cpu", 0);
    setenv("PDDE_JOB_SECRET", SECRET, 1);
    signal(SIGPIPE, SIG_IGN);
    pdde_context *ctx;
    pdde_context_init(NULL, &ctx);
    pdde_store_server_params sp = PDDE_STORE_SERVER_PARAMS_INIT;
    sp.secret = SECRET;
    pdde_store_server *srv;
    if (pdde_store_server_init_params(ctx, &sp, &srv)) { CHECK(0, "server: %s", pdde_last_error(ctx)); return test_finish(); }
    int port = pdde_store_server_port(srv);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    for (int i = 0; i < 48; i++) g_nonce[i] = (unsigned char)(i * 37 + 1);

    /* a legitimate exchange, recorded for the replay */
    int fd = raw_connect(port);
    unsigned char hello[64];
    int32_t status;
    size_t n;
    if (!raw_reply(fd, &status, hello, sizeof hello, &n, 5) && !status) {
        memcpy(g_replay_nonce, g_nonce, 32);
        prove("pdde store client", hello, 32, g_replay_nonce, 32, g_replay_proof);
        raw_request(fd, OP_AUTH, NULL, g_replay_nonce, 32, g_replay_proof, 32);
        CHECK(raw_reply(fd, &status, NULL, 0, NULL, 5) == 0 && status == PDDE_OK, "the exchange by hand with the secret is accepted");
    }
    close(fd);

    /* the job: 2 ranks of allreduces for 6 s, while the attacks run from another process */
    double secs = 6;
    job_result results[2];
    memset(results, 0, sizeof results);
    test_ranks_params tp = {.addr = addr, .prefix = "auth", .timeout_s = 20, .peer_timeout_s = 1.5, .results = results,
                            .result_size = sizeof(job_result), .server = srv};
    fflush(NULL);
    pid_t attacker = fork();
    if (attacker == 0) {
        test_passed = test_failed = 0;
        usleep(1500000); /* the job is up */
        char failed_key[64];
        snprintf(failed_key, sizeof failed_key, "auth/1/failed");
        for (int round = 0; round < 3; round++) {
            int lens[][2] = {{0, 0}, {16, 0}, {64, 0}, {32, 1}};
            const char *names[] = {"an empty proof", "a short proof (16 bytes)", "a long proof (the right 32 bytes, then 32 more)",
                                   "a proof made with the server's label"};
            for (int k = 0; k < 4; k++) attempt(port, send_proof, lens[k], names[k]);
            attempt(port, send_replay, NULL, "a proof replayed from an earlier exchange");
            int sixteen = 16, fortyeight = 48;
            attempt(port, send_nonce_len, &sixteen, "a 16-byte nonce (proof made over it)");
            attempt(port, send_nonce_len, &fortyeight, "a 48-byte nonce (proof made over it)");
            for (int k = 0; k < 4; k++) attempt(port, send_before, failed_key, "a request before the proof");
        }
        /* what an attacker would have stored: nothing */
        pdde_store *s;
        if (!pdde_store_connect_secret(NULL, addr, SECRET, 5, &s)) {
            void *v = NULL;
            size_t len;
            CHECK(pdde_store_get(s, "auth/counter", &v, &len) == PDDE_ERR_NOT_FOUND, "no counter was made by the attacker");
            free(v);
            pdde_store_close(s);
        }
        int counts[2] = {test_passed, test_failed};
        fprintf(stderr, "attacker: %d refusals checked, %d failures\n", counts[0], counts[1]);
        _exit(counts[1] ? 1 : counts[0] > 0 ? 0 : 2);
    }
    int bad = test_run_ranks(2, &tp, job_rank, &secs, 40);
    int status_a = 0;
    waitpid(attacker, &status_a, 0);
    CHECK(WIFEXITED(status_a) && WEXITSTATUS(status_a) == 0, "every attack was refused (attacker status 0x%x)", status_a);
    CHECK(!bad && results[0].iters > 50 && results[1].iters > 50 && !results[0].wrong && !results[1].wrong,
          "the job ran to its end unharmed: %d and %d allreduces, %d and %d wrong", results[0].iters, results[1].iters,
          results[0].wrong, results[1].wrong);
    char cause[600];
    CHECK(!pdde_store_server_first_failure(srv, cause, sizeof cause), "no failure recorded (%s)", cause);
    printf("job: %d and %d allreduces while attacked\n", results[0].iters, results[1].iters);
    pdde_store_server_free(srv);
    pdde_context_free(ctx);
    return test_finish();
}
#endif
