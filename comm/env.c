/* comm/env.c — rank discovery from the environment that a launcher (pdde-run, mpirun, PMI, srun)
 * gives each process, and the host id that groups ranks by machine. */

typedef struct {
    const char *launcher;
    const char *rank, *size, *local_rank;   /* variable names; local_rank may be NULL */
} comm_env_source;

static const comm_env_source comm_env_sources[] = {
    {"pdde-run", "PDDE_RANK", "PDDE_WORLD_SIZE", "PDDE_LOCAL_RANK"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"pmi", "PMI_RANK", "PMI_SIZE", NULL},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

/* Parses a non-negative decimal integer variable. 0 ok, 1 unset, -1 malformed. */
static int comm_env_int(const char *name, int *out) {
    const char *v = getenv(name);
    if (!v) return 1;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < 0 || x > INT32_MAX) return -1;
    *out = (int)x;
    return 0;
}

pdde_status pdde_comm_env_read(pdde_context *ctx, pdde_comm_env *out) {
    if (!out) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_comm_env_read: out is NULL");
    memset(out, 0, sizeof *out);
    out->local_rank = -1;
    const comm_env_source *src = NULL;
    for (size_t i = 0; i < sizeof comm_env_sources / sizeof *comm_env_sources; i++)
        if (getenv(comm_env_sources[i].rank) || getenv(comm_env_sources[i].size)) { src = &comm_env_sources[i]; break; }
    if (!src)
        return pdde_error(ctx, PDDE_ERR_ENV,
                          "no launcher environment: set PDDE_RANK and PDDE_WORLD_SIZE (or start under pdde-run, "
                          "mpirun, srun or a PMI launcher)");
    out->launcher = src->launcher;
    const char *names[2] = {src->rank, src->size};
    int *vals[2] = {&out->rank, &out->world_size};
    for (int i = 0; i < 2; i++) {
        int rc = comm_env_int(names[i], vals[i]);
        if (rc > 0) return pdde_error(ctx, PDDE_ERR_ENV, "%s is not set (%s sets %s)", names[i], src->launcher, names[1 - i]);
        if (rc < 0) return pdde_error(ctx, PDDE_ERR_ENV, "%s='%s' is not a non-negative integer", names[i], getenv(names[i]));
    }
    if (out->world_size < 1) return pdde_error(ctx, PDDE_ERR_ENV, "%s=%d: must be at least 1", src->size, out->world_size);
    if (out->rank >= out->world_size)
        return pdde_error(ctx, PDDE_ERR_ENV, "%s=%d is not below %s=%d", src->rank, out->rank, src->size, out->world_size);
    if (src->local_rank) {
        int rc = comm_env_int(src->local_rank, &out->local_rank);
        if (rc < 0) return pdde_error(ctx, PDDE_ERR_ENV, "%s='%s' is not a non-negative integer", src->local_rank, getenv(src->local_rank));
        if (rc == 0 && out->local_rank > out->rank)
            return pdde_error(ctx, PDDE_ERR_ENV, "%s=%d is above %s=%d", src->local_rank, out->local_rank, src->rank, out->rank);
        if (rc > 0) out->local_rank = -1;
    }
    const char *addr = getenv("PDDE_STORE_ADDR");
    if (addr) {
        char host[256]; int port;
        if (comm_parse_addr(addr, host, sizeof host, &port) || port == 0)
            return pdde_error(ctx, PDDE_ERR_ENV, "PDDE_STORE_ADDR='%s' is not host:port", addr);
        snprintf(out->store_addr, sizeof out->store_addr, "%s", addr);
    }
    return PDDE_OK;
}

/* The id that says which ranks share a machine (and so shared memory): PDDE_HOST_ID if set, else the
 * host name plus the network namespace, so that containers (and the tests' emulated hosts) in their
 * own network namespaces count as separate hosts. */
#define COMM_HOST_ID_MAX 320 /* host name (255) + "/" + namespace id */

static void comm_host_id(const char *given, char *out, size_t cap) {
    const char *env = getenv("PDDE_HOST_ID");
    if (given && *given) { snprintf(out, cap, "%s", given); return; }
    if (env && *env) { snprintf(out, cap, "%s", env); return; }
    char host[256] = "localhost", ns[64] = "";
    gethostname(host, sizeof host - 1);
    ssize_t n = readlink("/proc/self/ns/net", ns, sizeof ns - 1);
    ns[n > 0 ? n : 0] = 0;
    snprintf(out, cap, "%s/%s", host, ns);
}
