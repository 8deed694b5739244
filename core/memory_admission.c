/* core/memory_admission.c — memory admission: a session's plan is checked against the host memory there is (MemAvailable, the cgroup limit) before anything is allocated.
 * A part of pdde.c: included there in place (it uses the core's private types and helpers). */

/* ------------------------------------------------------------------------------------------------
 * Memory admission: a plan that does not fit is refused before anything is allocated (rather than
 * growing until the kernel's OOM killer ends the process), with what it needs and what there is. */

#define PDDE_DEFAULT_HEADROOM 0.1

static void bytes_str(double b, char *buf, size_t n) {
    static const char *const units[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
    int u = 0;
    while (b >= 1000 && u < 6) b /= 1000, u++;
    snprintf(buf, n, u ? "%.2f %s" : "%.0f %s", b, units[u]);
}

/* A byte count with an optional k/M/G/T suffix (SI); -1 if malformed. */
static double parse_bytes(const char *v) {
    char *end;
    double x = strtod(v, &end);
    const char *units = "kMGT";
    const char *u = *end ? strchr(units, *end) : NULL;
    if (end == v || !isfinite(x) || x < 0 || (*end && (!u || end[1]))) return -1;
    for (const char *k = units; u && k <= u; k++) x *= 1000;
    return x;
}

/* The host memory this process may still take: MemAvailable, bounded by a cgroup v2 limit (a container
 * sees the whole machine in /proc/meminfo). `source` says where the figure came from. */
static double host_available(const char **source) {
    const char *env = getenv("PDDE_MEMORY_AVAILABLE");
    if (env && *env && parse_bytes(env) >= 0) { *source = "PDDE_MEMORY_AVAILABLE"; return parse_bytes(env); }
    if (env && *env) pdde_env_warn("PDDE_MEMORY_AVAILABLE", env, "a byte count with an optional k, M, G or T suffix", "what the system says");
    double avail = -1;
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) avail = (double)kb * 1024;
    }
    if (f) fclose(f);
    *source = "MemAvailable";
    if (avail < 0) {
        long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        avail = pages > 0 && page > 0 ? (double)pages * (double)page : -1;
        *source = "free pages";
    }
    unsigned long long limit, used;
    FILE *m = fopen("/sys/fs/cgroup/memory.max", "r"), *c = fopen("/sys/fs/cgroup/memory.current", "r");
    if (m && c && fscanf(m, "%llu", &limit) == 1 && fscanf(c, "%llu", &used) == 1) {
        double room = limit > used ? (double)(limit - used) : 0;
        if (avail < 0 || room < avail) avail = room, *source = "the cgroup's memory.max";
    }
    if (m) fclose(m);
    if (c) fclose(c);
    return avail;
}

static pdde_status session_admit(pdde_session *s, const pdde_session_params *p) {
    double headroom = p->memory_headroom;
    const char *env = getenv("PDDE_MEMORY_HEADROOM"); /* off, or a fraction below 1 */
    if (headroom == 0 && env && !strcmp(env, "off")) headroom = -1;
    else if (headroom == 0) pdde_env_double("PDDE_MEMORY_HEADROOM", PDDE_DEFAULT_HEADROOM, 0, 0.999, &headroom);
    if (headroom == 0) headroom = PDDE_DEFAULT_HEADROOM;
    if (headroom < 0 || !isfinite(headroom)) return PDDE_OK;
    if (headroom >= 1) return pdde_error(s->ctx, PDDE_ERR_INVALID_ARG, "session: memory headroom %g must be below 1", headroom);
    /* the host: its devices' buffers, and host copies of what moves between devices and ranks */
    double host = 0, host_persist = 0, host_arena = 0;
    for (int d = 0; d < s->n_devs; d++)
        if (s->devs[d].host)
            host_persist += (double)s->devs[d].persist_bytes, host_arena += (double)s->devs[d].arena_bytes * s->n_live;
    host = host_persist + host_arena;
    for (int i = 0; i < s->n_order; i++) {
        const pdde_tensor *t = s->order[i];
        if (t->op == PDDE_OP_COPY && !s->devs[s->slot[t->id]].host) host += (double)pdde_tensor_nbytes(t);
        if (t->op == PDDE_OP_SEND) host += (double)pdde_tensor_nbytes(t) * s->n_live;
    }
    int ranks_here = 1; /* the job's ranks on this host take their memory at about the same time */
#ifdef PDDE_HAVE_COMM
    if (s->world) {
        int hosts = pdde_comm_host_count(s->world) > 0 ? pdde_comm_host_count(s->world) : 1;
        ranks_here = (pdde_comm_size(s->world) + hosts - 1) / hosts;
    }
#endif
    const char *source;
    double avail = host_available(&source);
    char need_s[64], avail_s[32], use_s[32], a_s[32], b_s[32];
    if (avail >= 0 && host > avail / ranks_here * (1 - headroom)) {
        bytes_str(host, need_s, sizeof need_s), bytes_str(avail, avail_s, sizeof avail_s);
        snprintf(need_s + strlen(need_s), sizeof need_s - strlen(need_s), " (%.0f bytes)", host);
        bytes_str(avail / ranks_here * (1 - headroom), use_s, sizeof use_s);
        bytes_str(host_persist, a_s, sizeof a_s), bytes_str(host_arena, b_s, sizeof b_s);
        return pdde_error(s->ctx, PDDE_ERR_OOM, "session: the plan needs %s of host memory (parameters, gradients, optimizer state and "
                          "inputs %s, activation arena %s, transfer buffers) but %s is available (%s), of which %s may be used by each of "
                          "the %d rank(s) of this job on the host, keeping %g%% free; a smaller plan, or memory_headroom < 0 / "
                          "PDDE_MEMORY_HEADROOM=off to skip this check", need_s, a_s, b_s, avail_s, source, use_s, ranks_here, 100 * headroom);
    }
    for (int d = 0; d < s->n_devs; d++) {
        session_device *sd = &s->devs[d];
        pdde_device_props props;
        if (sd->host || pdde_device_get_props(s->ctx, sd->device, &props) != PDDE_OK) continue;
        double need = (double)sd->persist_bytes + (double)sd->arena_bytes * s->n_live;
        double have = props.memory_free ? (double)props.memory_free : (double)props.memory_total;
        if (have <= 0 || need <= have * (1 - headroom)) continue; /* (0: the device does not say) */
        bytes_str(need, need_s, sizeof need_s), bytes_str(have, avail_s, sizeof avail_s), bytes_str(have * (1 - headroom), use_s, sizeof use_s);
        snprintf(need_s + strlen(need_s), sizeof need_s - strlen(need_s), " (%.0f bytes)", need);
        bytes_str((double)sd->persist_bytes, a_s, sizeof a_s), bytes_str((double)sd->arena_bytes * s->n_live, b_s, sizeof b_s);
        return pdde_error(s->ctx, PDDE_ERR_DEVICE_OOM, "session: the plan needs %s on device %d (%s: persistent %s, activation arena %s) "
                          "but it has %s %s, of which %s may be used keeping %g%% free; a smaller plan, or memory_headroom < 0 / "
                          "PDDE_MEMORY_HEADROOM=off to skip this check", need_s, sd->device, props.name, a_s, b_s, avail_s,
                          props.memory_free ? "free" : "in all", use_s, 100 * headroom);
    }
    return PDDE_OK;
}
