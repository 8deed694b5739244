/* comm/util.c — the bottom of comm/: clocks, little-endian packing, "host:port" parsing and
 * resolution, and whole-buffer socket reads and writes with a deadline. Every other part of comm/ may
 * use these; this file uses none of them. */

#ifndef PDDE_COMM_UTIL_C
#define PDDE_COMM_UTIL_C

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "../pdde_extension.h" /* the store and transport vtables */
#include "../backends/backend_impl.h" /* the environment readers every layer shares (pdde_env_*) */

static double comm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void comm_sleep(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get_u32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint64_t get_u64(const unsigned char *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

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

#endif /* PDDE_COMM_UTIL_C */
