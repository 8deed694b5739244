/* stop_signals.h — Demonstrates how to stop distributed training cleanly on a signal: SIGTERM (a scheduler
 * preempting the job, or pdde-run passing its own on), SIGINT (Ctrl-C) or SIGUSR1 (Slurm's --signal warning).
 * The handler only notes the signal in stop_signal; the training loop (gpt.c's, dlrm.c's) stops after the step
 * every rank is in when one of them sees it (the ranks agree on it, e.g. by an allreduce MAX of stop_signal
 * after each step; under pdde-run --elastic, pdde_elastic_request_leave), saves a checkpoint there, and the program
 * exits with 128 + the signal; a second signal ends
 * the process at once (SA_RESETHAND). The includer defines _GNU_SOURCE (or _POSIX_C_SOURCE) first, for sigaction. */
#ifndef PDDE_EXAMPLES_STOP_SIGNALS_H
#define PDDE_EXAMPLES_STOP_SIGNALS_H
#include <signal.h>

static volatile sig_atomic_t stop_signal;
static void on_stop_signal(int sig) { stop_signal = sig; }
static void catch_stop_signals(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_stop_signal, sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL), sigaction(SIGINT, &sa, NULL), sigaction(SIGUSR1, &sa, NULL);
}
/* After the training loop a signal ends the process at once again (the saves, the evaluation and the sample stop with it); one
 * caught after the last step's agreement is acted on so (`unagreed`: the loop did not stop for it) */
static void release_stop_signals(int unagreed) {
    signal(SIGTERM, SIG_DFL), signal(SIGINT, SIG_DFL), signal(SIGUSR1, SIG_DFL);
    if (unagreed && stop_signal) raise(stop_signal);
}
#endif
