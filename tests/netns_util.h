/* netns_util.h — two emulated hosts for the tests that need them (test_comm_netns, test_elastic_netns):
 * network namespaces A and B joined by a veth pair, A at 10.231.77.1/24 and B at 10.231.77.2/24, made
 * and removed here. Needs root and `ip netns`. Header-only: include it once per program. */
#ifndef PDDE_NETNS_UTIL_H
#define PDDE_NETNS_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    char ns[2][32];  /* the namespaces' names: host A, host B */
    char dev[2][16]; /* the veth ends: A's, B's */
} netns_pair;

static inline int netns_sh(const char *fmt, const char *a, const char *b) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, fmt, a, b);
    return system(cmd);
}

/* Names the pair after this process (unique per run). */
static inline void netns_pair_name(netns_pair *p) {
    int id = (int)getpid() % 100000;
    snprintf(p->ns[0], sizeof p->ns[0], "pddeA%d", id), snprintf(p->ns[1], sizeof p->ns[1], "pddeB%d", id);
    snprintf(p->dev[0], sizeof p->dev[0], "pva%d", id), snprintf(p->dev[1], sizeof p->dev[1], "pvb%d", id);
}

/* 1 when namespaces can be made here (root, `ip netns` permitted): then namespace A exists. */
static inline int netns_pair_permitted(const netns_pair *p) {
    return geteuid() == 0 && !netns_sh("ip netns add %s 2>/dev/null%s", p->ns[0], "");
}

/* After netns_pair_permitted: namespace B, the veth pair between them, the addresses, the links and
 * loopback up. 1 when all of it worked. */
static inline int netns_pair_connect(const netns_pair *p) {
    const char *a = p->ns[0], *b = p->ns[1], *va = p->dev[0], *vb = p->dev[1];
    int ok = !netns_sh("ip netns add %s%s", b, "") && !netns_sh("ip link add %s type veth peer name %s", va, vb);
    ok = ok && !netns_sh("ip link set %s netns %s", va, a) && !netns_sh("ip link set %s netns %s", vb, b);
    ok = ok && !netns_sh("ip -n %s addr add 10.231.77.1/24 dev %s", a, va) && !netns_sh("ip -n %s addr add 10.231.77.2/24 dev %s", b, vb);
    ok = ok && !netns_sh("ip -n %s link set %s up", a, va) && !netns_sh("ip -n %s link set %s up", b, vb);
    ok = ok && !netns_sh("ip -n %s link set lo up%s", a, "") && !netns_sh("ip -n %s link set lo up%s", b, "");
    return ok;
}

/* Removes both namespaces (and the veth pair with them). */
static inline void netns_pair_remove(const netns_pair *p) {
    netns_sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", p->ns[0], p->ns[1]);
    netns_sh("ip link del %s 2>/dev/null%s", p->dev[0], ""); /* only left if it never moved into a namespace */
}

#endif
