/* backends/env_values.c — the library's tuning variables read from the environment, with one policy for a
 * bad value: unset or empty gives the default; a value that does not parse whole (no trailing text, no
 * overflow) or lies outside its range is said on stderr (the variable, its value, what is expected and the
 * default used), once per process for each variable and value, and the default is used. A library does
 * not stop its program over a tuning knob, and a getter deep in a layer has no error to return. It lives
 * in backends/, the lowest layer, so that every layer reads its variables the same way. */
#include "backend_impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

/* What has been said: a hash of each variable and value (a full table stops recording, and then a
 * warning may repeat, never go missing) */
#define ENV_SAID_MAX 256
static pthread_mutex_t env_said_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t env_said[ENV_SAID_MAX];
static int env_n_said;

static uint64_t env_hash(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

PDDE_PRIVATE void pdde_env_warn(const char *name, const char *value, const char *expected, const char *used) {
    uint64_t key = env_hash(env_hash(env_hash(14695981039346656037ull, name), "="), value);
    bool said = false;
    pthread_mutex_lock(&env_said_lock);
    for (int i = 0; i < env_n_said && !said; i++) said = env_said[i] == key;
    if (!said && env_n_said < ENV_SAID_MAX) env_said[env_n_said++] = key;
    pthread_mutex_unlock(&env_said_lock);
    if (!said) pdde_log(PDDE_LOG_WARN, "pdde: %s=\"%s\": expected %s; using the default, %s\n", name, value, expected, used);
}

PDDE_PRIVATE bool pdde_env_int(const char *name, long dflt, long lo, long hi, long *out) {
    const char *v = getenv(name);
    *out = dflt;
    if (!v || !*v) return false;
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end != v && !*end && !errno && x >= lo && x <= hi) {
        *out = x;
        return true;
    }
    char expected[96], used[32];
    if (lo <= INT_MIN && hi >= INT_MAX) snprintf(expected, sizeof expected, "a whole number");
    else if (hi >= INT_MAX) snprintf(expected, sizeof expected, "a whole number >= %ld", lo);
    else snprintf(expected, sizeof expected, "a whole number from %ld to %ld", lo, hi);
    snprintf(used, sizeof used, "%ld", dflt);
    pdde_env_warn(name, v, expected, used);
    return false;
}

PDDE_PRIVATE bool pdde_env_double(const char *name, double dflt, double lo, double hi, double *out) {
    const char *v = getenv(name);
    *out = dflt;
    if (!v || !*v) return false;
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (end != v && !*end && !errno && isfinite(x) && x >= lo && x <= hi) {
        *out = x;
        return true;
    }
    char expected[96], used[32];
    if (isinf(hi)) snprintf(expected, sizeof expected, "a number >= %g", lo);
    else snprintf(expected, sizeof expected, "a number from %g to %g", lo, hi);
    snprintf(used, sizeof used, "%g", dflt);
    pdde_env_warn(name, v, expected, used);
    return false;
}

PDDE_PRIVATE int pdde_env_bool(const char *name, int dflt) {
    static const char *const on[] = {"1", "on", "true", "yes"}, *const off[] = {"0", "off", "false", "no"};
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(v, on[i])) return 1;
        if (!strcasecmp(v, off[i])) return 0;
    }
    pdde_env_warn(name, v, "1 or 0 (on/off, true/false, yes/no)", dflt < 0 ? "automatic" : dflt ? "on" : "off");
    return dflt;
}

PDDE_PRIVATE int pdde_env_choice(const char *name, const char *const *words, int n, int dflt) {
    const char *v = getenv(name);
    if (!v || !*v) return dflt;
    for (int i = 0; i < n; i++)
        if (!strcmp(v, words[i])) return i;
    char expected[256];
    size_t len = (size_t)snprintf(expected, sizeof expected, "one of");
    for (int i = 0; i < n && len < sizeof expected; i++)
        len += (size_t)snprintf(expected + len, sizeof expected - len, "%s %s", i ? "," : "", words[i]);
    pdde_env_warn(name, v, expected, dflt >= 0 && dflt < n ? words[dflt] : "automatic");
    return dflt;
}
