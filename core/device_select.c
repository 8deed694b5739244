/* core/device_select.c — the device a process trains on: its local rank's device of the backend the
 * user names, or with "auto" the device the cost model predicts fastest for the model.
 * A part of pdde.c: included there in place (it uses the launcher environment of comm/ and the cost
 * model of planner/). */

/* The launcher's local rank (pdde-run, Open MPI, Slurm: comm/env.c reads them), or -1 with what the
 * environment said in `how`. */
static int device_select_local_rank(pdde_context *ctx, char *how, size_t cap) {
    pdde_comm_env env = {0};
    if (pdde_comm_env_read(ctx, &env)) {
        snprintf(how, cap, "no launcher: local rank 0");
        return -1;
    }
    if (env.local_rank < 0) {
        snprintf(how, cap, "%s gives no local rank: local rank 0", env.launcher ? env.launcher : "the launcher");
        return -1;
    }
    snprintf(how, cap, "local rank %d (%s)", env.local_rank, env.launcher ? env.launcher : "the launcher");
    return env.local_rank;
}

/* Devices of one family on this host, in the registry's order. */
static int device_family_count(pdde_context *ctx, const char *backend) {
    int n = 0;
    while (pdde_device_find(ctx, backend, n) >= 0) n++;
    return n;
}

/* The families that have devices, as "cpu (1 device), opencl (2 devices)", for error messages. */
static void device_families_text(pdde_context *ctx, char *out, size_t cap) {
    size_t len = 0;
    out[0] = 0;
    for (int b = 0; b < pdde_backend_count(ctx); b++) {
        const char *name = pdde_backend_name(ctx, b);
        int n = device_family_count(ctx, name);
        if (n > 0 && len < cap)
            len += (size_t)snprintf(out + len, cap - len, "%s%s (%d device%s)", len ? ", " : "", name, n, n == 1 ? "" : "s");
    }
}

/* Fills out for the index-th device of family `backend`. */
static void device_choice_fill(pdde_context *ctx, const char *backend, int index, int count, pdde_device_choice *out) {
    pdde_device_props p;
    out->device = pdde_device_find(ctx, backend, index);
    out->index = index, out->count = count;
    snprintf(out->backend, sizeof out->backend, "%.15s", backend);
    if (pdde_device_get_props(ctx, out->device, &p) == PDDE_OK) snprintf(out->name, sizeof out->name, "%s", p.name);
}

/* The device of family `backend` for local rank lr: the lr-th, the (lr mod count)-th when sharing, or
 * an error naming what is missing. */
static pdde_status device_select_named(pdde_context *ctx, const char *backend, int index, int lr, int share, pdde_device_choice *out) {
    int b = 0;
    while (b < pdde_backend_count(ctx) && strcmp(pdde_backend_name(ctx, b), backend)) b++;
    char have[256];
    device_families_text(ctx, have, sizeof have);
    if (b == pdde_backend_count(ctx))
        return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "device '%s': no such backend (want cuda, opencl, level_zero, cpu, auto or a plugin's "
                          "family; this process has %s)", backend, have);
    const char *why = NULL;
    pdde_status st = pdde_backend_status(ctx, b, &why);
    int count = device_family_count(ctx, backend);
    if (st || count == 0)
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "device '%s': the %s backend is unavailable: %s (this process has %s)", backend, backend,
                          why && *why ? why : "no device", have);
    if (index >= 0) { /* BACKEND:INDEX: that device, whatever the local rank */
        if (index >= count)
            return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "device '%s:%d': this host has %d %s device%s (0..%d)", backend, index, count, backend,
                              count == 1 ? "" : "s", count - 1);
        device_choice_fill(ctx, backend, index, count, out);
        return PDDE_OK;
    }
    /* the CPU is every local rank's: each runs its own threads on it (the host's cores are shared as
     * the launcher's thread counts say) */
    if (!strcmp(backend, "cpu")) share = 1;
    if (lr >= count && !share)
        return pdde_error(ctx, PDDE_ERR_UNAVAILABLE, "device '%s': local rank %d needs %s device %d, but this host has %d %s device%s: start "
                          "at most %d rank%s a host, or let ranks share devices (PDDE_DEVICE_SHARE=1; gpt --share-device)", backend, lr,
                          backend, lr, count, backend, count == 1 ? "" : "s", count, count == 1 ? "" : "s");
    device_choice_fill(ctx, backend, lr % count, count, out);
    out->shared = lr >= count;
    return PDDE_OK;
}

/* The id of the cluster device that stands for local device d, the k-th device of its family here: the
 * k-th device of that backend on the cluster's first machine (a cluster pdde-bench measured on this
 * machine; its ids are the indices of its own context, which may have started other families), else -1. */
static int device_select_cluster_id(pdde_context *ctx, const pdde_cluster *c, int d) {
    pdde_device_props p;
    if (!c || c->n_machines < 1 || pdde_device_get_props(ctx, d, &p)) return -1;
    int k = 0;
    while (pdde_device_find(ctx, p.backend, k) >= 0 && pdde_device_find(ctx, p.backend, k) != d) k++;
    const pdde_cluster_machine *m = &c->machines[0];
    for (int i = 0; i < m->n_devices; i++) {
        int spec = m->devices[i].spec;
        if (spec >= 0 && spec < c->n_specs && !strcmp(c->specs[spec].backend, p.backend) && k-- == 0) return m->devices[i].id;
    }
    return -1;
}


/* The cost model's step time of g on local device d (NaN: no measured or peak figures to time it). */
static double device_select_predict(pdde_context *ctx, const pdde_cluster *measured, const pdde_cluster *detected, const pdde_graph *g,
                                    int d, int *uncalibrated) {
    int id = device_select_cluster_id(ctx, measured, d);
    const pdde_cluster *c = id >= 0 ? measured : detected;
    pdde_cost_program *prog = NULL;
    pdde_cost_result *r = NULL;
    double t = NAN;
    if (pdde_cost_program_from_graph(g, id >= 0 ? id : d, &prog) == PDDE_OK) {
        if (pdde_cost_simulate(ctx, c, prog, &r) == PDDE_OK && isfinite(r->step_time) && r->step_time > 0)
            t = r->step_time, *uncalibrated = r->uncalibrated;
    }
    pdde_cost_result_free(r);
    pdde_cost_program_free(prog);
    return t;
}

/* auto: the CPU and, of every other family with devices, this local rank's device; the one the cost
 * model predicts fastest for g where it can time them all (measured figures, or peak figures on both
 * sides), else by kind: a GPU (or an accelerator of its own) over the CPU, the fastest peak first. A
 * device that computes on this host's CPU cores (an OpenCL CPU device such as PoCL's) is never taken
 * over the CPU backend on those same cores without a measurement saying it is faster. */
static pdde_status device_select_auto(pdde_context *ctx, const pdde_device_select_params *p, int lr, pdde_device_choice *out) {
    enum { MAX_CAND = 16 };
    pdde_device_choice cand[MAX_CAND];
    double t[MAX_CAND];
    int unc[MAX_CAND], n = 0;
    char skipped[256] = "";
    size_t sk = 0;
    memset(cand, 0, sizeof cand);
    device_choice_fill(ctx, "cpu", 0, device_family_count(ctx, "cpu"), &cand[n++]);
    for (int b = 0; b < pdde_backend_count(ctx) && n < MAX_CAND; b++) {
        const char *name = pdde_backend_name(ctx, b), *why = NULL;
        int count = device_family_count(ctx, name);
        if (!strcmp(name, "cpu") || pdde_backend_status(ctx, b, &why) || count == 0) continue;
        if (lr >= count && !p->share) {
            if (sk < sizeof skipped)
                sk += (size_t)snprintf(skipped + sk, sizeof skipped - sk, "; %s has %d device%s for local rank %d (not shared)", name, count,
                                       count == 1 ? "" : "s", lr);
            continue;
        }
        device_choice_fill(ctx, name, lr % count, count, &cand[n]);
        const pdde_tensor *refused = plan_inplace_refused(ctx, p->graph, cand[n].device);
        if (refused) {
            if (sk < sizeof skipped)
                sk += (size_t)snprintf(skipped + sk, sizeof skipped - sk, "; not %s: it does not run %s, which works in place", name,
                                       pdde_op_name(refused->op));
            continue;
        }
        cand[n++].shared = lr >= count;
    }
    pdde_cluster *detected = NULL;
    bool timed = p->graph && pdde_cluster_detect(ctx, &detected) == PDDE_OK, all = timed, measured = timed;
    for (int i = 0; i < n; i++) {
        unc[i] = 0;
        t[i] = timed ? device_select_predict(ctx, p->cluster, detected, p->graph, cand[i].device, &unc[i]) : NAN;
        all &= isfinite(t[i]) != 0;
        measured &= !unc[i];
    }
    pdde_cluster_free(detected);
    int best = 0;
    char why[sizeof out->why];
    if (all && n > 1) {
        for (int i = 1; i < n; i++)
            if (t[i] < t[best]) best = i;
        size_t len = (size_t)snprintf(why, sizeof why, "auto: predicted %.3g ms/step", 1e3 * t[best]);
        for (int i = 0; i < n && len < sizeof why; i++)
            if (i != best)
                len += (size_t)snprintf(why + len, sizeof why - len, ", against %.3g on %s:%d", 1e3 * t[i], cand[i].backend, cand[i].index);
        if (len < sizeof why) snprintf(why + len, sizeof why - len, " (%s figures)", measured ? "measured" : "peak");
    } else {
        double best_peak = -1;
        const char *host_cores = NULL;
        int host_i = -1;
        for (int i = 1; i < n; i++) {
            pdde_device_props props;
            if (pdde_device_get_props(ctx, cand[i].device, &props)) continue;
            if (props.on_host_cores) { host_cores = cand[i].backend, host_i = i; continue; }
            if (props.kind == PDDE_DEVICE_CPU) continue;
            double peak = props.peak_flops_f32 + (props.kind == PDDE_DEVICE_GPU ? 1e30 : 0); /* a GPU first, then the fastest peak */
            if (peak > best_peak) best_peak = peak, best = i;
        }
        if (best > 0)
            snprintf(why, sizeof why, "auto: a %s of its own, taken over the CPU without measured figures (pdde-bench measures them)",
                     best_peak >= 1e30 ? "GPU" : "accelerator");
        else if (host_cores)
            snprintf(why, sizeof why, "auto: the CPU, not %s:%d (%.60s): that device computes on this host's CPU cores, which the CPU "
                     "backend runs its own kernels on: no faster, and no measured figures say otherwise", host_cores, cand[host_i].index,
                     cand[host_i].name);
        else
            snprintf(why, sizeof why, "auto: the CPU, the only candidate%s", n > 1 ? " the cost model can time" : "");
    }
    *out = cand[best];
    snprintf(out->why, sizeof out->why, "%.250s%.130s", why, skipped);
    return PDDE_OK;
}

pdde_status pdde_device_select(pdde_context *ctx, const pdde_device_select_params *params, pdde_device_choice *out) {
    if (!ctx || !out) return PDDE_ERR_INVALID_ARG;
    pdde_device_select_params p = params ? *params : (pdde_device_select_params)PDDE_DEVICE_SELECT_PARAMS_INIT;
    memset(out, 0, sizeof *out);
    const char *env = getenv("PDDE_DEVICE");
    const char *asked = p.backend && *p.backend ? p.backend : env && *env ? env : "auto";
    if (!p.share && pdde_env_bool("PDDE_DEVICE_SHARE", 0)) p.share = 1;
    char how[96];
    int lr = p.local_rank ? *p.local_rank : device_select_local_rank(ctx, how, sizeof how);
    if (p.local_rank) {
        if (lr < 0) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "pdde_device_select: local rank %d is negative", lr);
        snprintf(how, sizeof how, "local rank %d (given)", lr);
    }
    out->local_rank = lr;
    if (lr < 0) lr = 0;
    /* BACKEND[:INDEX] */
    char family[32];
    int index = -1;
    const char *colon = strchr(asked, ':');
    size_t flen = colon ? (size_t)(colon - asked) : strlen(asked);
    if (flen >= sizeof family) return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "device '%s': no such backend (want cuda, opencl, level_zero, cpu or auto)", asked);
    memcpy(family, asked, flen), family[flen] = 0;
    if (colon) {
        char *end;
        long x = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || x < 0 || x > 4096 || !strcmp(family, "auto"))
            return pdde_error(ctx, PDDE_ERR_INVALID_ARG, "device '%s': want BACKEND or BACKEND:INDEX (a device index >= 0), or auto", asked);
        index = (int)x;
    }
    pdde_status st = !strcmp(family, "auto") ? device_select_auto(ctx, &p, lr, out) : device_select_named(ctx, family, index, lr, p.share, out);
    if (st) return st;
    out->local_rank = lr;
    size_t len = strlen(out->why);
    if (len == 0) len = (size_t)snprintf(out->why, sizeof out->why, "%s asked%s", asked, p.backend && *p.backend ? "" : " (PDDE_DEVICE)");
    if (len < sizeof out->why)
        snprintf(out->why + len, sizeof out->why - len, "; %s%s", how, out->shared ? ", sharing the device with other local ranks" : "");
    return PDDE_OK;
}
