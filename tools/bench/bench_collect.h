/* bench_collect.h — the "RES bytes seconds" lines of a comparison's sides (bench_comm, bench_moe: pdde
 * under pdde-run, MPI under mpirun), collected from their output. Needs popen: include it after
 * _GNU_SOURCE (or _POSIX_C_SOURCE) is defined. */
#ifndef PDDE_BENCH_COLLECT_H
#define PDDE_BENCH_COLLECT_H
#include <stdio.h>
#include <string.h>

/* Runs cmd and collects its "RES bytes seconds" lines (after a prefix such as "[0] "): at most cap,
 * into sizes and secs; the other lines go to stderr. How many it collected; a failing cmd is reported,
 * naming who ran it. */
static inline int bench_collect(const char *who, const char *cmd, size_t *sizes, double *secs, int cap) {
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, p)) {
        char *s = strstr(line, "RES ");
        size_t b;
        double t;
        if (s && n < cap && sscanf(s, "RES %zu %lf", &b, &t) == 2) sizes[n] = b, secs[n++] = t;
        else fputs(line, stderr);
    }
    int st = pclose(p);
    if (st) fprintf(stderr, "%s: '%s' failed (status 0x%x)\n", who, cmd, st);
    return n;
}
#endif
