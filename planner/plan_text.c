/* planner/plan_text.c — a plan's text form ("dp=2,tp=1,pp=2,mb=4,zero=1,recompute=0,..."):
 * pdde_plan_str writes it, pdde_plan_parse reads it; and which layers a plan places on a second device
 * (pdde_plan_places). Below the search and the simulation, which both read plans. */

#include "planner_impl.h"

/* Appends to buf[*k..n) as snprintf would, keeping *k the length the whole text needs. */
static void plan_append(char *buf, size_t n, int *k, const char *fmt, int x) {
    *k += snprintf(buf + (*k < (int)n ? *k : (int)n), n > (size_t)*k ? n - (size_t)*k : 0, fmt, x);
}

int pdde_plan_str(const pdde_plan *p, char *buf, size_t n) {
    int k = snprintf(buf, n, "dp=%d,tp=%d,pp=%d,mb=%d,zero=%d,recompute=%d", p->dp, p->tp, p->pp, p->micro, p->zero, p->recompute == 1);
    if (p->chunks > 1) plan_append(buf, n, &k, ",chunks=%d", p->chunks);
    if (p->pp > 1 && p->chunks <= 1) {
        plan_append(buf, n, &k, ",stages=", 0);
        for (int s = 0; s < p->pp; s++) plan_append(buf, n, &k, s ? ":%d" : "%d", p->stage_first[s + 1] - p->stage_first[s]);
    }
    bool some = false;
    for (int s = 0; s < p->pp && s < PDDE_PLAN_MAX_STAGES && p->recompute != 1; s++) some |= p->recompute_layers[s] > 0;
    if (some) {
        plan_append(buf, n, &k, ",rc=", 0);
        for (int s = 0; s < p->pp; s++) plan_append(buf, n, &k, s ? ":%d" : "%d", p->recompute_layers[s]);
    }
    if (p->comm_dtype == PDDE_BF16) plan_append(buf, n, &k, ",comm=bf16", 0);
    if (p->schedule == PDDE_PIPELINE_GPIPE) plan_append(buf, n, &k, ",sched=gpipe", 0);
    if (p->stage_blocks) plan_append(buf, n, &k, ",blocks=1", 0);
    if (p->shares[0] > 0) {
        plan_append(buf, n, &k, ",shares=", 0);
        for (int i = 0; i < p->dp && i < PDDE_PLAN_MAX_SHARES; i++) plan_append(buf, n, &k, i ? ":%d" : "%d", p->shares[i]);
    }
    if (p->place[0]) {
        k += snprintf(buf + (k < (int)n ? k : (int)n), n > (size_t)k ? n - (size_t)k : 0, ",place=%.15s", p->place);
        if (p->place_last > 0) plan_append(buf, n, &k, ":%d", p->place_first), plan_append(buf, n, &k, "-%d", p->place_last - 1);
    }
    return k;
}

/* "a:b:c" into v[0..max); the count, or -1. */
static int plan_parse_list(const char **s, int *v, int max, int least) {
    int n = 0, consumed = 0;
    do {
        int x;
        if (n == max || sscanf(*s, "%d%n", &x, &consumed) != 1 || x < least) return -1;
        v[n++] = x, *s += consumed;
    } while (**s == ':' && *++*s);
    return n;
}

pdde_status pdde_plan_parse(const char *text, pdde_plan *out) {
    pdde_plan p = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .chunks = 1};
    int stage_layers[PDDE_PLAN_MAX_STAGES], n_stage_layers = 0, n_rc = 0, n_shares = 0;
    const char *s = text ? text : "";
    while (*s) {
        char key[16];
        int len = 0, consumed = 0;
        while (s[len] && s[len] != '=' && s[len] != ',') len++;
        if (s[len] != '=' || len == 0 || len >= (int)sizeof key) return PDDE_ERR_INVALID_ARG;
        memcpy(key, s, (size_t)len), key[len] = 0, s += len + 1;
        int *v = !strcmp(key, "dp") ? &p.dp : !strcmp(key, "tp") ? &p.tp : !strcmp(key, "pp") ? &p.pp : !strcmp(key, "mb") ? &p.micro
               : !strcmp(key, "zero") ? &p.zero : !strcmp(key, "recompute") ? &p.recompute : !strcmp(key, "chunks") ? &p.chunks
               : !strcmp(key, "blocks") ? &p.stage_blocks : NULL;
        if (!strcmp(key, "stages")) {
            if ((n_stage_layers = plan_parse_list(&s, stage_layers, PDDE_PLAN_MAX_STAGES, 1)) < 0) return PDDE_ERR_INVALID_ARG;
        } else if (!strcmp(key, "shares")) {
            if ((n_shares = plan_parse_list(&s, p.shares, PDDE_PLAN_MAX_SHARES, 1)) < 0) return PDDE_ERR_INVALID_ARG;
        } else if (!strcmp(key, "rc")) {
            if ((n_rc = plan_parse_list(&s, p.recompute_layers, PDDE_PLAN_MAX_STAGES, 0)) < 0) return PDDE_ERR_INVALID_ARG;
        } else if (!strcmp(key, "place")) { /* a backend name, then optionally :first-last (layers) */
            int len_name = 0;
            while ((s[len_name] >= 'a' && s[len_name] <= 'z') || (s[len_name] >= '0' && s[len_name] <= '9') || s[len_name] == '_') len_name++;
            if (len_name == 0 || len_name >= (int)sizeof p.place) return PDDE_ERR_INVALID_ARG;
            memcpy(p.place, s, (size_t)len_name), p.place[len_name] = 0, s += len_name;
            int a, b;
            if (*s == ':') {
                if (sscanf(s, ":%d-%d%n", &a, &b, &consumed) != 2 || a < 0 || b < a) return PDDE_ERR_INVALID_ARG;
                p.place_first = a, p.place_last = b + 1, s += consumed;
            }
        } else if (!strcmp(key, "comm") || !strcmp(key, "sched")) {
            const char *word = !strcmp(key, "comm") ? (!strncmp(s, "bf16", 4) ? "bf16" : "f32") : (!strncmp(s, "gpipe", 5) ? "gpipe" : "1f1b");
            if (strncmp(s, word, strlen(word))) return PDDE_ERR_INVALID_ARG;
            if (!strcmp(word, "bf16")) p.comm_dtype = PDDE_BF16;
            if (!strcmp(word, "gpipe")) p.schedule = PDDE_PIPELINE_GPIPE;
            s += strlen(word);
        } else if (!v || sscanf(s, "%d%n", v, &consumed) != 1) {
            return PDDE_ERR_INVALID_ARG;
        } else {
            s += consumed;
        }
        if (*s == ',') s++;
        else if (*s) return PDDE_ERR_INVALID_ARG;
    }
    if (p.dp < 1 || p.tp < 1 || p.pp < 1 || p.pp > PDDE_PLAN_MAX_STAGES || p.micro < 1 || p.zero < 0 || p.zero > 3 ||
        p.recompute < 0 || p.recompute > 1 || p.chunks < 1 || (n_stage_layers && n_stage_layers != p.pp) || (n_rc && n_rc != p.pp) ||
        p.stage_blocks < 0 || p.stage_blocks > 1 || (n_shares && n_shares != p.dp))
        return PDDE_ERR_INVALID_ARG;
    for (int i = 0; i < n_stage_layers; i++) p.stage_first[i + 1] = p.stage_first[i] + stage_layers[i];
    *out = p;
    return PDDE_OK;
}

int pdde_plan_places(const pdde_plan *p, int n_layers, int layer) {
    int first, last;
    if (!p) return 0;
    plan_place_range(p, n_layers, &first, &last);
    return layer >= first && layer < last;
}
