/* planner/plan_text.c — a plan's text form ("dp=2,tp=1,pp=2,mb=4,zero=1,recompute=0,..."):
 * pdde_plan_str writes it, pdde_plan_parse reads it; and which layers a plan places on a second device
 * (pdde_plan_layer_on_device). Below the search and the simulation, which both read plans. */

#include "planner_impl.h"

/* Appends to buf[*k..n) as snprintf would, keeping *k the length the whole text needs. */
static void plan_append(char *buf, size_t n, int *k, const char *fmt, int x) {
    *k += snprintf(buf + (*k < (int)n ? *k : (int)n), n > (size_t)*k ? n - (size_t)*k : 0, fmt, x);
}

int pdde_plan_str(const pdde_plan *p, char *buf, size_t n) {
    if (buf && n) buf[0] = '\0';
    if (!p || (!buf && n)) return -1; /* (as snprintf fails) */
    int k = snprintf(buf, n, "dp=%d,tp=%d,pp=%d,mb=%d,zero=%d,recompute=%d", p->dp, p->tp, p->pp, p->micro, p->zero, p->recompute == 1);
    if (p->chunks > 1) plan_append(buf, n, &k, ",chunks=%d", p->chunks);
    if (p->pp > 1 && p->chunks <= 1 && p->stage_first[p->pp] > 0) { /* (a parsed plan without stages= has no cut yet) */
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
    /* the experts over the tp axis: ep=tp; groups of as many dp ranks as tp: ep=dp:N (ep=N alone, N = tp,
     * reads as the tp axis) */
    if (p->ep > 1 && p->tp > 1 && p->ep == p->tp) plan_append(buf, n, &k, p->ep_dp ? ",ep=dp:%d" : ",ep=tp", p->ep);
    else if (p->ep > 1) plan_append(buf, n, &k, ",ep=%d", p->ep);
    if (p->place[0]) {
        k += snprintf(buf + (k < (int)n ? k : (int)n), n > (size_t)k ? n - (size_t)k : 0, ",place=%.15s", p->place);
        if (p->place_last > 0) plan_append(buf, n, &k, ":%d", p->place_first), plan_append(buf, n, &k, "-%d", p->place_last - 1);
    }
    return k;
}

/* "a:b:c" into v[0..max), each >= least; the count, or -1. */
static int plan_parse_list(const char **s, int *v, int max, int least) {
    int n = 0, consumed = 0;
    do {
        int x;
        if (n == max || sscanf(*s, "%d%n", &x, &consumed) != 1 || x < least) return -1;
        v[n++] = x, *s += consumed;
    } while (**s == ':' && *++*s);
    return n;
}

/* A parse error: out->why names the key and what it expected (pdde_plan_parse has no context). */
static pdde_status plan_parse_fail(pdde_plan *out, const char *key, const char *want, const char *got) {
    memset(out, 0, sizeof *out);
    snprintf(out->why, sizeof out->why, "plan text: %s: want %s, got '%.24s'", key, want, got);
    return PDDE_ERR_INVALID_ARG;
}

pdde_status pdde_plan_parse(const char *text, pdde_plan *out) {
    pdde_plan p = {.dp = 1, .tp = 1, .pp = 1, .micro = 1, .chunks = 1};
    int stage_layers[PDDE_PLAN_MAX_STAGES], n_stage_layers = 0, n_rc = 0, n_shares = 0;
    bool ep_tp = false;
    unsigned seen = 0; /* keys given so far (a key twice is refused: which value was meant?) */
    if (!out) return PDDE_ERR_INVALID_ARG;
    if (!text) return plan_parse_fail(out, "the text", "a plan (\"\" for the defaults)", "NULL");
    const char *s = text;
    while (*s) {
        char key[16];
        const char *value;
        int len = 0, consumed = 0;
        while (s[len] && s[len] != '=' && s[len] != ',') len++;
        if (s[len] != '=' || len == 0 || len >= (int)sizeof key) return plan_parse_fail(out, "a key", "key=value (keys of at most 15 characters)", s);
        memcpy(key, s, (size_t)len), key[len] = 0, s = value = s + len + 1;
        static const char *const keys[] = {"dp", "tp", "pp", "mb", "zero", "recompute", "chunks", "stages", "rc",
                                           "comm", "sched", "blocks", "shares", "place", "ep"};
        for (int i = 0; i < (int)(sizeof keys / sizeof *keys); i++)
            if (!strcmp(key, keys[i])) {
                if (seen & 1u << i) return plan_parse_fail(out, key, "each key once", "a second value");
                seen |= 1u << i;
            }
        int *v = !strcmp(key, "dp") ? &p.dp : !strcmp(key, "tp") ? &p.tp : !strcmp(key, "pp") ? &p.pp : !strcmp(key, "mb") ? &p.micro
               : !strcmp(key, "zero") ? &p.zero : !strcmp(key, "recompute") ? &p.recompute : !strcmp(key, "chunks") ? &p.chunks
               : !strcmp(key, "blocks") ? &p.stage_blocks : !strcmp(key, "ep") ? &p.ep : NULL;
        if (!strcmp(key, "stages")) {
            if ((n_stage_layers = plan_parse_list(&s, stage_layers, PDDE_PLAN_MAX_STAGES, 1)) < 0)
                return plan_parse_fail(out, key, "layers per stage, each >= 1, as A:B:.. (at most 64)", value);
        } else if (!strcmp(key, "shares")) {
            if ((n_shares = plan_parse_list(&s, p.shares, PDDE_PLAN_MAX_SHARES, 1)) < 0)
                return plan_parse_fail(out, key, "one share per dp index, each >= 1, as A:B:.. (at most 16)", value);
        } else if (!strcmp(key, "rc")) {
            if ((n_rc = plan_parse_list(&s, p.recompute_layers, PDDE_PLAN_MAX_STAGES, 0)) < 0)
                return plan_parse_fail(out, key, "layers recomputed per stage, each >= 0, as A:B:..", value);
        } else if (!strcmp(key, "place")) { /* a backend name, then optionally :first-last (layers) */
            static const char want[] = "a backend name (a-z, 0-9, _) and optionally :FIRST-LAST layers";
            int len_name = 0;
            while ((s[len_name] >= 'a' && s[len_name] <= 'z') || (s[len_name] >= '0' && s[len_name] <= '9') || s[len_name] == '_') len_name++;
            if (len_name == 0 || len_name >= (int)sizeof p.place) return plan_parse_fail(out, key, want, value);
            memcpy(p.place, s, (size_t)len_name), p.place[len_name] = 0, s += len_name;
            int a, b;
            if (*s == ':') {
                if (sscanf(s, ":%d-%d%n", &a, &b, &consumed) != 2 || a < 0 || b < a) return plan_parse_fail(out, key, want, value);
                p.place_first = a, p.place_last = b + 1, s += consumed;
            }
        } else if (!strcmp(key, "ep") && (!strncmp(s, "tp", 2) || !strncmp(s, "dp:", 3))) { /* (resolved against tp below) */
            if (*s == 't') ep_tp = true, s += 2;
            else if (sscanf(s + 3, "%d%n", &p.ep, &consumed) != 1 || p.ep < 2)
                return plan_parse_fail(out, key, "N, tp (the experts over the tp axis) or dp:N (over N >= 2 dp ranks)", value);
            else p.ep_dp = 1, s += 3 + consumed;
        } else if (!strcmp(key, "comm") || !strcmp(key, "sched")) {
            bool comm = !strcmp(key, "comm");
            const char *word = comm ? (!strncmp(s, "bf16", 4) ? "bf16" : "f32") : (!strncmp(s, "gpipe", 5) ? "gpipe" : "1f1b");
            if (strncmp(s, word, strlen(word))) return plan_parse_fail(out, key, comm ? "f32 or bf16" : "1f1b or gpipe", value);
            if (comm && word[0] == 'b') p.comm_dtype = PDDE_BF16; /* (bf16) */
            if (!comm && word[0] == 'g') p.schedule = PDDE_PIPELINE_GPIPE; /* (gpipe) */
            s += strlen(word);
        } else if (!v) {
            return plan_parse_fail(out, key, "dp tp pp mb zero recompute chunks stages rc comm sched blocks shares place ep",
                                   key);
        } else if (sscanf(s, "%d%n", v, &consumed) != 1) {
            return plan_parse_fail(out, key, "an integer", value);
        } else {
            s += consumed;
        }
        if (*s == ',') s++;
        else if (*s) return plan_parse_fail(out, key, "',' or the end after its value", value);
    }
    /* each value's range, by key (lists: their length) */
    const struct { const char *key, *want; int got; bool bad; } range[] = {
        {"dp", "an integer >= 1", p.dp, p.dp < 1}, {"tp", "an integer >= 1", p.tp, p.tp < 1},
        {"pp", "an integer 1..64", p.pp, p.pp < 1 || p.pp > PDDE_PLAN_MAX_STAGES}, {"mb", "an integer >= 1", p.micro, p.micro < 1},
        {"zero", "0, 1, 2 or 3", p.zero, p.zero < 0 || p.zero > 3}, {"recompute", "0 or 1", p.recompute, p.recompute < 0 || p.recompute > 1},
        {"chunks", "an integer >= 1", p.chunks, p.chunks < 1}, {"blocks", "0 or 1", p.stage_blocks, p.stage_blocks < 0 || p.stage_blocks > 1},
        {"stages", "one count per stage (pp of them)", n_stage_layers, n_stage_layers && n_stage_layers != p.pp},
        {"rc", "one count per stage (pp of them)", n_rc, n_rc && n_rc != p.pp},
        {"shares", "one share per dp index (dp >= 2 of them)", n_shares, n_shares && (n_shares != p.dp || p.dp < 2)},
    };
    for (size_t i = 0; i < sizeof range / sizeof *range; i++)
        if (range[i].bad) {
            char got[48];
            snprintf(got, sizeof got, i >= 8 ? "%d of them for pp=%d, dp=%d" : "%d", range[i].got, p.pp, p.dp);
            return plan_parse_fail(out, range[i].key, range[i].want, got);
        }
    if (n_stage_layers && p.chunks > 1) /* (the interleaved schedule cuts the layers evenly: a list would be ignored) */
        return plan_parse_fail(out, "stages", "no list with chunks > 1 (interleaved chunks cut the layers evenly)", "a list");
    if (n_stage_layers && p.pp == 1) /* (one stage holds every layer: a count would only be checked by accident) */
        return plan_parse_fail(out, "stages", "a list only with pp >= 2 (one stage holds every layer)", "a list for pp=1");
    if (n_rc && p.recompute == 1) /* (every layer is recomputed: a list would be ignored) */
        return plan_parse_fail(out, "rc", "no list with recompute=1 (every layer is recomputed)", "a list");
    char ep_got[48];
    snprintf(ep_got, sizeof ep_got, "%d", p.ep);
    if (p.ep < 0) return plan_parse_fail(out, "ep", "an integer >= 0, tp or dp:N", ep_got);
    if (p.ep == 1) p.ep = 0; /* (the same: every rank holds every expert; the text leaves it out) */
    if (ep_tp && p.tp < 2) return plan_parse_fail(out, "ep", "tp only with tp >= 2 (the experts over the tp axis)", "tp for tp=1");
    if (ep_tp) p.ep = p.tp, p.ep_dp = 0;
    p.ep_dp = p.ep_dp && p.tp > 1 && p.ep == p.tp; /* (elsewhere ep counts dp ranks anyway) */
    snprintf(ep_got, sizeof ep_got, "%s%d for dp=%d, tp=%d", p.ep_dp ? "dp:" : "", p.ep, p.dp, p.tp);
    if (p.ep > 1 && (p.ep != p.tp || p.ep_dp) && (p.dp % p.ep || (p.tp > 1 && p.ep >= p.dp)))
        return plan_parse_fail(out, "ep", "0, 1, tp (the experts over tp) or N or dp:N dividing dp (groups of N dp ranks; with tp, N < dp)", ep_got);
    for (int i = 0; i < n_stage_layers; i++) p.stage_first[i + 1] = p.stage_first[i] + stage_layers[i];
    *out = p;
    return PDDE_OK;
}

int pdde_plan_layer_on_device(const pdde_plan *p, int n_layers, int layer) {
    int first, last;
    if (!p) return 0;
    plan_place_range(p, n_layers, &first, &last);
    return layer >= first && layer < last;
}
