/* comm/env.c — rank discovery from the environment that a launcher (pdde-run, mpirun, PMI, srun)
 * gives each process, and the host id that groups ranks by machine. */

#ifndef PDDE_COMM_ENV_C
#define PDDE_COMM_ENV_C

#include "util.c"
#include "auth.c"

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

/* ================================================================================================
 * Launchers without glue: under mpirun (OpenMPI) and srun (Slurm) with no PDDE_STORE_ADDR, rank 0
 * hosts the store on a port derived from the job id and the others find it there; the job secret
 * comes from the launcher (see comm/README.md for the trust model). */

typedef struct {
    char connect[300];       /* where the ranks reach the store */
    char bind[300];          /* where rank 0 listens */
    char job_id[128];        /* the launcher's job (and step) id */
} comm_launch;

/* The first host of a Slurm host list: "n[01-04,07],gpu3" -> "n01"; "r[1-2]-n[5,6]" -> "r1-n5". */
static int comm_slurm_first_host(const char *list, char *out, size_t cap) {
    size_t o = 0;
    int depth = 0, took = 0;
    for (const char *p = list; *p; p++) {
        if (*p == ',' && !depth) break;
        if (*p == '[') { depth = 1; took = 0; continue; }
        if (*p == ']') { depth = 0; continue; }
        if (depth) {
            /* inside brackets: copy the first number of the first range, skip the rest */
            if (*p == ',' || *p == '-') took = 1;
            if (took) continue;
        }
        if (o + 1 >= cap) return -1;
        out[o++] = *p;
    }
    out[o] = 0;
    return o ? 0 : -1;
}

/* A port in [10000, 30000) from the job id: below Linux's ephemeral range, so rarely taken by
 * another program's outgoing connection; PDDE_STORE_PORT overrides it. */
static int comm_job_port(const char *job_id) {
    uint32_t h = 2166136261u;
    for (const char *p = job_id; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    long port;
    pdde_env_int("PDDE_STORE_PORT", 10000 + (long)(h % 20000), 1, 65535, &port);
    return (int)port;
}

/* Fills l for a launcher other than pdde-run when PDDE_STORE_ADDR is not set. */
static pdde_status comm_launch_addr(pdde_context *ctx, const pdde_comm_env *env, comm_launch *l) {
    memset(l, 0, sizeof *l);
    const char *host = "127.0.0.1";
    char first[256];
    if (!strcmp(env->launcher, "openmpi")) {
        const char *jid = getenv("OMPI_MCA_ess_base_jobid");
        if (!jid) jid = getenv("PMIX_NAMESPACE");
        const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
        if (!jid) return pdde_error(ctx, PDDE_ERR_ENV, "mpirun: no job id (OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE); set PDDE_STORE_ADDR");
        if (!local || atoi(local) != env->world_size)
            return pdde_error(ctx, PDDE_ERR_ENV, "mpirun across several hosts: rank 0's host is not in the environment; "
                              "set PDDE_STORE_ADDR=<rank 0's host>:<port> and pass it with mpirun -x PDDE_STORE_ADDR");
        snprintf(l->job_id, sizeof l->job_id, "openmpi-%s", jid);
    } else if (!strcmp(env->launcher, "slurm")) {
        const char *jid = getenv("SLURM_JOB_ID"), *step = getenv("SLURM_STEP_ID");
        const char *nodes = getenv("SLURM_STEP_NUM_NODES"), *list = getenv("SLURM_STEP_NODELIST");
        if (!nodes) nodes = getenv("SLURM_NNODES");
        if (!list) list = getenv("SLURM_JOB_NODELIST");
        if (!jid) return pdde_error(ctx, PDDE_ERR_ENV, "srun: SLURM_JOB_ID is not set; set PDDE_STORE_ADDR");
        snprintf(l->job_id, sizeof l->job_id, "slurm-%s.%s", jid, step ? step : "0");
        if (nodes && atoi(nodes) > 1) {
            if (!list || comm_slurm_first_host(list, first, sizeof first))
                return pdde_error(ctx, PDDE_ERR_ENV, "srun: SLURM_STEP_NODELIST/SLURM_JOB_NODELIST '%s' names no host; "
                                  "set PDDE_STORE_ADDR", list ? list : "");
            host = first;
        }
    } else {
        return pdde_error(ctx, PDDE_ERR_ENV, "PDDE_STORE_ADDR is not set (host:port of the bootstrap store; "
                          "pdde-run sets it, %s does not say where rank 0 runs)", env->launcher);
    }
    int port = comm_job_port(l->job_id);
    int open_addr = strcmp(host, "127.0.0.1") != 0;
    snprintf(l->connect, sizeof l->connect, "%s:%d", host, port);
    snprintf(l->bind, sizeof l->bind, "%s:%d", open_addr ? "0.0.0.0" : "127.0.0.1", port);
    return PDDE_OK;
}

/* The job secret under a launcher when the environment has none. OpenMPI gives every process of a job
 * a random key of its own (OMPI_MCA_orte_precondition_transports): the secret is an HMAC of it. Else
 * rank 0 makes a random secret and leaves it in a file of its own (mode 0600) under PDDE_SECRET_DIR or
 * ~/.pdde, which the others read (a home shared by the hosts, as on most clusters); rank 0 removes it
 * once everyone is connected (comm_launch_secret_done). */
static void comm_launch_secret_path(const comm_launch *l, char *path, size_t cap) {
    const char *dir = getenv("PDDE_SECRET_DIR"), *home = getenv("HOME");
    if (dir && *dir) snprintf(path, cap, "%s/%s.secret", dir, l->job_id);
    else snprintf(path, cap, "%s/.pdde/%s.secret", home && *home ? home : "/tmp", l->job_id);
}

/* *made_file: rank 0 left the secret in a file (to remove once everyone has connected). */
static pdde_status comm_launch_secret(pdde_context *ctx, const pdde_comm_env *env, const comm_launch *l, double timeout_s,
                                      comm_secret *s, int *made_file) {
    *made_file = 0;
    const char *pre = getenv("OMPI_MCA_orte_precondition_transports");
    if (!strcmp(env->launcher, "openmpi") && pre && strlen(pre) >= COMM_SECRET_MIN) {
        unsigned char mac[COMM_SHA256_BYTES];
        const void *parts[2] = {"pdde job secret", l->job_id};
        size_t lens[2] = {16, strlen(l->job_id)};
        comm_hmac(pre, strlen(pre), 2, parts, lens, mac);
        for (int i = 0; i < COMM_SHA256_BYTES; i++) snprintf(s->text + 2 * i, 3, "%02x", mac[i]);
        s->len = 2 * COMM_SHA256_BYTES;
        return PDDE_OK;
    }
    char path[600], tmp[620];
    comm_launch_secret_path(l, path, sizeof path);
    if (env->rank == 0) {
        char *slash = strrchr(path, '/');
        *slash = 0;
        if (mkdir(path, 0700) && errno != EEXIST)
            return pdde_error(ctx, PDDE_ERR_ENV, "job secret: cannot make %s: %s (set PDDE_JOB_SECRET or PDDE_SECRET_DIR)",
                              path, strerror(errno));
        *slash = '/';
        pdde_status st = pdde_job_secret_generate(ctx, s->text, sizeof s->text);
        if (st) return st;
        s->len = strlen(s->text);
        snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        int ok = fd >= 0 && write(fd, s->text, s->len) == (ssize_t)s->len;
        if (fd >= 0) close(fd);
        if (!ok || rename(tmp, path)) { /* the file appears whole, or not at all */
            unlink(tmp);
            return pdde_error(ctx, PDDE_ERR_ENV, "job secret: cannot write %s: %s (set PDDE_JOB_SECRET or "
                              "PDDE_SECRET_DIR)", path, strerror(errno));
        }
        *made_file = 1;
        return PDDE_OK;
    }
    double deadline = comm_now() + timeout_s;
    while (access(path, F_OK)) {
        if (comm_now() > deadline)
            return pdde_error(ctx, PDDE_ERR_TIMEOUT, "job secret: rank 0 did not write %s within %.3g s (without a shared "
                              "home set PDDE_JOB_SECRET and pass it through the launcher)", path, timeout_s);
        comm_sleep(0.01);
    }
    return comm_secret_read_file(ctx, path, s);
}

static void comm_launch_secret_done(const comm_launch *l) {
    char path[600];
    comm_launch_secret_path(l, path, sizeof path);
    unlink(path);
}

#endif /* PDDE_COMM_ENV_C */
