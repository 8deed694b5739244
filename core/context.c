/* core/context.c — context lifetime */
/* (A part of pdde.c, included there in layer order: it uses the parts before it.) */

#define PDDE_THREADS_PER_CORE 4

pdde_status pdde_context_init(const pdde_context_params *params, pdde_context **out) {
    if (!out) return PDDE_ERR_INVALID_ARG;
    *out = NULL;
    pdde_context_params p = PDDE_CONTEXT_PARAMS_INIT;
    if (params) p = *params;
#ifdef PDDE_HAVE_COMM
    comm_transport_env_defaults(); /* (before the backends start their threads) */
#endif
    pdde_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return PDDE_ERR_OOM;
    error_init(ctx);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    long share; /* a launcher's share of the cores for this rank */
    if (pdde_env_int("PDDE_NUM_THREADS", p.n_threads > 0 ? p.n_threads : cores, 1, 1 << 16, &share) && p.n_threads <= 0)
        p.n_threads = (int)share;
    ctx->n_threads = p.n_threads > 0 ? p.n_threads : (int)cores;
    /* more threads than this only contend for the cores, and thousands exhaust the process's thread
     * limit (device runtimes started later then fail to start their own) */
    if (ctx->n_threads > PDDE_THREADS_PER_CORE * cores) {
        pdde_log(PDDE_LOG_WARN, "pdde: %d threads asked for; using %ld (%d per online core, %ld cores)\n", ctx->n_threads,
                PDDE_THREADS_PER_CORE * cores, PDDE_THREADS_PER_CORE, cores);
        ctx->n_threads = (int)(PDDE_THREADS_PER_CORE * cores);
    }
    ctx->seed = p.seed ? p.seed : 1234;
    ctx->log_level = p.log_level;
    if (!p.backends) p.backends = getenv("PDDE_BACKENDS");
    pdde_status st = registry_init(ctx, &p, &ctx->registry);
    if (st != PDDE_OK) {
        pdde_context_free(ctx);
        return st;
    }
    error_clear(ctx); /* a backend whose driver is absent is not an error of this call */
    *out = ctx;
    return PDDE_OK;
}

void pdde_context_free(pdde_context *ctx) {
    if (ctx) context_release(ctx);
}

#define PDDE_MAX_LAYER_ID (1 << 20) /* layer ids index per-layer tables */
