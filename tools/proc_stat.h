/* tools/proc_stat.h — what /proc/<pid>/stat (Linux, proc(5)) says of a process: its state letter and
 * CPU time. pdde-run asks it whether a rank is stopped (SIGSTOP: alive but silent, the rank to blame),
 * and the tests that watch processes read it through the same functions (test_launcher, test_store),
 * so they see a process as pdde-run does. The fields are read after the last ')': the command name
 * before it may itself hold spaces and parentheses. */
#ifndef PDDE_TOOLS_PROC_STAT_H
#define PDDE_TOOLS_PROC_STAT_H
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct {
    char state;   /* R running, S sleeping, D in a disk wait, T stopped, t stopped by a tracer, Z zombie, X dead */
    double cpu_s; /* user + system time so far */
} proc_stat;

/* 0 with *out filled, or -1 when there is no such process (or no /proc). */
static inline int proc_stat_read(pid_t pid, proc_stat *out) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')');
    unsigned long user = 0, sys = 0;
    if (!p || p[1] != ' ' ||
        sscanf(p + 2, "%c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &out->state, &user, &sys) != 3)
        return -1;
    out->cpu_s = (double)(user + sys) / (double)sysconf(_SC_CLK_TCK);
    return 0;
}

/* 1 if pid is stopped (a signal or a tracer stopped it). */
static inline int proc_is_stopped(pid_t pid) {
    proc_stat ps;
    return proc_stat_read(pid, &ps) == 0 && (ps.state == 'T' || ps.state == 't');
}

/* 1 if pid exists and is not a zombie. */
static inline int proc_is_running(pid_t pid) {
    proc_stat ps;
    return proc_stat_read(pid, &ps) == 0 && ps.state != 'Z' && ps.state != 'X';
}
#endif
