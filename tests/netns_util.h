/* netns_util.h — two emulated hosts for the tests that need them (test_comm_netns, test_elastic_netns):
 * network namespaces A and B, A at 10.231.77.1/24 and B at 10.231.77.2/24, joined by a veth pair, or
 * each by its own veth pair to a bridge in a third namespace S (a switch: one host's port brought down
 * there cuts that host off while the other keeps its link up, as on a real network). Made and removed
 * here. Needs root and `ip netns`. Header-only: include it once per program. */
#ifndef PDDE_NETNS_UTIL_H
#define PDDE_NETNS_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct {
    char ns[2][32];  /* the namespaces' names: host A, host B */
    char dev[2][16]; /* the veth ends: A's, B's */
    char sw[32], port[2][16]; /* netns_pair_connect_switched: the switch's namespace, A's and B's ports there */
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
    snprintf(p->sw, sizeof p->sw, "pddeS%d", id);
    snprintf(p->port[0], sizeof p->port[0], "psa%d", id), snprintf(p->port[1], sizeof p->port[1], "psb%d", id);
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

/* After netns_pair_permitted: namespaces B and S; A and B each joined to a bridge in S by a veth pair
 * (dev[k] in the host, port[k] in S); the addresses; everything up. 1 when all of it worked. */
static inline int netns_pair_connect_switched(const netns_pair *p) {
    int ok = !netns_sh("ip netns add %s%s", p->ns[1], "") && !netns_sh("ip netns add %s%s", p->sw, "");
    ok = ok && !netns_sh("ip -n %s link add br0 type bridge%s", p->sw, "") && !netns_sh("ip -n %s link set br0 up%s", p->sw, "");
    for (int k = 0; k < 2 && ok; k++) {
        char addr[32];
        snprintf(addr, sizeof addr, "10.231.77.%d/24", k + 1);
        ok = !netns_sh("ip link add %s type veth peer name %s", p->dev[k], p->port[k]);
        ok = ok && !netns_sh("ip link set %s netns %s", p->dev[k], p->ns[k]) && !netns_sh("ip link set %s netns %s", p->port[k], p->sw);
        ok = ok && !netns_sh("ip -n %s link set %s master br0", p->sw, p->port[k]) && !netns_sh("ip -n %s link set %s up", p->sw, p->port[k]);
        char cmd[200];
        snprintf(cmd, sizeof cmd, "ip -n %s addr add %s dev %s", p->ns[k], addr, p->dev[k]);
        ok = ok && !system(cmd) && !netns_sh("ip -n %s link set %s up", p->ns[k], p->dev[k]) &&
             !netns_sh("ip -n %s link set lo up%s", p->ns[k], "");
    }
    return ok;
}

/* Removes the namespaces (and the veth pairs with them). */
static inline void netns_pair_remove(const netns_pair *p) {
    netns_sh("ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", p->ns[0], p->ns[1]);
    netns_sh("ip netns del %s 2>/dev/null%s", p->sw, "");
    netns_sh("ip link del %s 2>/dev/null; ip link del %s 2>/dev/null", p->dev[0], p->dev[1]); /* only left if never moved */
}

#endif
