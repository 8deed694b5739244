/* backends/deadline.h — "now + s seconds" as the CLOCK_REALTIME time pthread_cond_timedwait (and
 * pthread_mutex_timedlock) takes, for every part that waits with a timeout (the executor's pipeline,
 * comm/'s service thread, the parameter server's client and server). A header of its own: comm/ps.c
 * is built without the rest of comm/ (no UCX), and core/ must not need comm/. */
#ifndef PDDE_DEADLINE_H
#define PDDE_DEADLINE_H

#include <time.h>

static inline struct timespec cond_deadline(double s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (!(s > 0)) s = 0;      /* (NaN and negative waits: now) */
    if (s > 1e9) s = 1e9;     /* (a "forever" of 30 years keeps tv_sec in range) */
    time_t whole = (time_t)s;
    long ns = ts.tv_nsec + (long)((s - (double)whole) * 1e9);
    ts.tv_sec += whole + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    return ts;
}

#endif
